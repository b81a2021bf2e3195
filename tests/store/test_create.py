"""open_store and create_store (store/create.py): overwrite rules, bad paths and files, atomic creation."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import StoreError
from dab_pipeline.store import (
    STATUS_PENDING,
    open_store,
)

from ..helpers.store_rows import make_store, write_all

REPO = Path(__file__).resolve().parents[2]


def test_refuses_to_create_over_existing_store(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"s{suffix}"
    with make_store(path, n=3) as s:
        write_all(s)
    with pytest.raises(StoreError, match=f"{path}.*already exists.*overwrite"):
        make_store(path, n=5)
    with open_store(path) as s:  # untouched
        assert s.num_videos == 3 and s.status().tolist() == [1, 1, 1]
    with make_store(path, n=5, overwrite=True) as s:
        assert s.num_videos == 5 and s.status().tolist() == [0] * 5
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp or old copies left


@pytest.mark.parametrize("suffix", [".h5", ".zarr"])
def test_overwrite_leaves_what_is_not_a_dab_store_alone(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"mine{suffix}"
    if suffix == ".zarr":
        path.mkdir()
        (path / "keep.txt").write_text("my notes")
    else:
        import h5py

        with h5py.File(path, "w") as f:
            f["results"] = [1, 2, 3]
    before = sorted(p.name for p in path.iterdir()) if path.is_dir() else path.read_bytes()
    with pytest.raises(StoreError, match="replaces dab feature stores only.*left alone"):
        make_store(path, n=3, overwrite=True)
    assert (sorted(p.name for p in path.iterdir()) if path.is_dir() else path.read_bytes()) == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp copies either


def test_bad_suffix_is_refused(tmp_path: Path) -> None:
    for fn in (lambda p: make_store(p), open_store):
        with pytest.raises(StoreError, match=r"features\.db.*\.h5, \.hdf5, \.zarr"):
            fn(tmp_path / "features.db")


def test_missing_and_corrupt_stores(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="nothere.h5 does not exist"):
        open_store(tmp_path / "nothere.h5")
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5 at all" * 100)
    with pytest.raises(StoreError, match="junk.h5 is not a readable HDF5 file"):
        open_store(junk)
    import h5py

    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = [1, 2]
    with pytest.raises(StoreError, match="other.h5 is not a dab feature store"):
        open_store(tmp_path / "other.h5")
    (tmp_path / "empty.zarr").mkdir()
    with pytest.raises(StoreError, match="empty.zarr is not a readable zarr store"):
        open_store(tmp_path / "empty.zarr")
    with make_store(tmp_path / "bad.zarr", n=3):
        pass
    (tmp_path / "bad.zarr" / "zarr.json").write_text("{broken")
    with pytest.raises(StoreError, match="bad.zarr is not a readable zarr store"):
        open_store(tmp_path / "bad.zarr")
    # a store with an array removed names the array
    with make_store(tmp_path / "holed.h5", n=3):
        pass
    with h5py.File(tmp_path / "holed.h5", "a") as f:
        del f["videos/frames"]
    with pytest.raises(StoreError, match="'videos/frames' is missing"):
        open_store(tmp_path / "holed.h5")


_CREATOR = r"""
import sys
sys.path.insert(0, sys.argv[2])
from tests.helpers.store_rows import make_store
from pathlib import Path
make_store(Path(sys.argv[1]) / f"warm{sys.argv[3]}", n=2, overwrite=True).close()  # imports done before the clock starts
print("ready", flush=True)
k = 0
while True:
    make_store(Path(sys.argv[1]) / f"s{k}{sys.argv[3]}", n=40, states="tokens").close()
    k += 1
"""


@pytest.mark.slow
def test_sigkill_during_creation_leaves_no_half_store(tmp_path: Path, suffix: str) -> None:
    rng = np.random.default_rng(11)
    # Kills land at random times; on a fast, idle machine several may land between two
    # creations, so keep killing (bounded) until one has landed inside create_store.
    for attempt in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-c", _CREATOR, str(tmp_path), str(REPO), suffix],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(float(rng.uniform(0.02, 0.3)))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        published = sorted(tmp_path.glob(f"s*{suffix}"))
        for p in published:  # everything under a real name is a whole store
            with open_store(p) as s:
                assert s.num_videos == 40 and (s.status() == STATUS_PENDING).all()
        for p in published:
            p.unlink() if p.is_file() else shutil.rmtree(p)
        if attempt >= 2 and list(tmp_path.glob(f".s*{suffix}.creating-*")):
            break
    # Hidden temporaries prove that kills did land inside create_store.
    assert list(tmp_path.glob(f".s*{suffix}.creating-*")), "no kill landed mid-creation"
