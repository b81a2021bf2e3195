"""FeatureStore over either backend (store/feature_store.py): the same contents from HDF5 and Zarr, status and
the failures table, the summary, one writer at a time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import StoreError
from dab_pipeline.store import (
    ERROR_BYTES,
    STATUS_FAILED,
    STATUS_MISSING,
    STATUS_PENDING,
    open_store,
)

from ..helpers.store_rows import SUFFIXES, D, F, expected_video, make_store, write_all

REPO = Path(__file__).resolve().parents[2]


def test_round_trip_is_identical_across_backends(tmp_path: Path) -> None:
    results = {}
    for suf in SUFFIXES:
        s = make_store(tmp_path / f"s{suf}", n=12)
        write_all(s, videos=[0, 1, 2, 3, 5, 6, 7, 8, 9, 10])
        s.mark_failed(4, "decode error")
        s.mark_missing([11])
        s.close()
        with open_store(tmp_path / f"s{suf}") as r:
            assert r.backend == {".h5": "hdf5", ".zarr": "zarr"}[suf]
            assert (r.num_videos, r.num_captions, r.num_frames, r.dim) == (12, 24, F, D)
            frames, mask = r.read_videos(np.arange(11)[np.arange(11) != 4])
            results[suf] = {
                "ids": r.video_ids,
                "split": r.video_split,
                "cids": r.caption_ids,
                "cvid": r.caption_video_index,
                "ctext": r.caption_text,
                "csplit": r.caption_split,
                "status": r.status(),
                "frames": frames,
                "mask": mask,
                "train": r.load_split("train"),
            }
    a, b = results[".h5"], results[".zarr"]
    for k in ("ids", "split", "cids", "cvid", "ctext", "csplit", "status", "frames", "mask"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert a["ids"].dtype.kind == "U" and a["ctext"][0] == "caption 0 of vid0 — ünïcode"
    np.testing.assert_array_equal(a["status"], [1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 3])
    # the written float16 values come back exactly, as float32
    want = np.stack([expected_video(i)["frames"] for i in range(11) if i != 4]).astype(np.float32)
    assert a["frames"].dtype == np.float32
    np.testing.assert_array_equal(a["frames"], want)
    for k in ("video_ids", "frames", "frame_mask", "caption_ids", "caption_video", "text"):
        np.testing.assert_array_equal(getattr(a["train"], k), getattr(b["train"], k), err_msg=k)


def test_failures_table(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=5) as s:
        s.mark_failed(3, "cannot decode: moov atom not found ✗")
        s.mark_failed(1, "x" * (ERROR_BYTES + 500))
        s.mark_missing([0])
    with open_store(tmp_path / f"s{suffix}", "a") as s:
        assert s.failures() == [("vid0001", "x" * ERROR_BYTES), ("vid0003", "cannot decode: moov atom not found ✗")]
        np.testing.assert_array_equal(
            s.status(), [STATUS_MISSING, STATUS_FAILED, STATUS_PENDING, STATUS_FAILED, STATUS_PENDING]
        )
        np.testing.assert_array_equal(s.pending_videos(), [2, 4])
        np.testing.assert_array_equal(s.pending_videos(include_failed=True), [1, 2, 3, 4])
        # a retry that succeeds takes the video out of the failures table
        write_all(s, videos=[3])
        assert [v for v, _ in s.failures()] == ["vid0001"]


def test_summary(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=6) as s:
        write_all(s, videos=[0, 1, 2])
        s.mark_failed(3, "x")
        s.mark_missing([4])
        info = s.summary()
    assert info["videos"] == {"pending": 1, "ok": 3, "failed": 1, "missing": 1}
    assert info["splits"]["train"] == {
        "videos": 2,
        "pending": 0,
        "ok": 1,
        "failed": 1,
        "missing": 0,
        "captions": 4,
        "captions_done": 4,
    }
    assert info["captions"] == {"done": 12, "pending": 0}
    assert info["complete"] is False
    assert info["arrays"]["videos/frames"]["nbytes"] == 6 * F * D * 2
    assert info["arrays"]["videos/frames"]["stored_bytes"] > 0 and info["file_bytes"] > 0


_HOLDER = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
from dab_pipeline.store import open_store
s = open_store(sys.argv[1], "a")
print("ready", flush=True)
time.sleep(60)
"""


def test_second_writer_is_refused_while_one_is_alive(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"s{suffix}"
    with make_store(path, n=2):
        pass
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), str(REPO)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match=f"{path} is locked"):
            open_store(path, "a")
    finally:
        proc.kill()  # SIGKILL: the lock dies with the process
        proc.wait()
    with open_store(path, "a") as s:
        assert s.mode == "a"
