"""The HDF5 backend (store/backend_h5.py): a truncated file is damaged, a file another process writes is locked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dab_pipeline.core.errors import StoreError
from dab_pipeline.store import (
    open_store,
)

from ..helpers.store_rows import make_store


def test_a_truncated_hdf5_store_is_called_damaged_not_locked(tmp_path: Path) -> None:
    with make_store(tmp_path / "whole.h5", n=6):
        pass
    data = (tmp_path / "whole.h5").read_bytes()
    for keep in (len(data) // 2, 200):
        cut = tmp_path / f"cut{keep}.h5"
        cut.write_bytes(data[:keep])
        with pytest.raises(StoreError) as err:
            open_store(cut)
        msg = str(err.value)
        assert "damaged" in msg and f"truncated to {keep:,} bytes" in msg and f"expects {len(data):,}" in msg, msg
        assert "locked" not in msg


@pytest.mark.skipif(os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE", reason="HDF5 file locking is off")
def test_a_store_another_process_writes_is_locked(tmp_path: Path) -> None:
    with make_store(tmp_path / "busy.h5", n=3):
        pass
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import h5py, sys, time; f = h5py.File(sys.argv[1], 'r+'); print('open', flush=True); time.sleep(60)",
            str(tmp_path / "busy.h5"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreError, match="locked by another process"):
            open_store(tmp_path / "busy.h5")
    finally:
        holder.kill()
        holder.wait()
