"""benchmarks/search_scale.py's guard against filling the disk with its synthetic stores."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from ..helpers.benchmarks import load_benchmark

Usage = namedtuple("Usage", "total used free")


def _search_scale():
    return load_benchmark("search_scale")


def test_a_store_that_would_leave_too_little_disk_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ss = _search_scale()
    store = tmp_path / "n1000000" / "store.h5"
    store.parent.mkdir()
    need = 1_000_000 * ss.F * ss.D * 2  # float16 frames alone: 12.3 GB
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(0, 0, need + 5e9))
    with pytest.raises(SystemExit, match=r"store\.h5: writing 1,000,000 videos needs 12\.9 GB .*--keep-free-gb 10"):
        ss.check_disk(store, 1_000_000, keep_free_gb=10.0)
    ss.check_disk(store, 1_000_000, keep_free_gb=4.0)  # 5 GB would be left: allowed
    ss.check_disk(store, 10_000, keep_free_gb=10.0)  # a small store fits
