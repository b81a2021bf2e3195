"""The write paths (store/writes.py): validation, read-only stores, and status written after data, so a writer
SIGKILLed anywhere leaves every row it flagged whole."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import StoreError
from dab_pipeline.store import (
    STATUS_FAILED,
    STATUS_OK,
    STATUS_PENDING,
    create_store,
    open_store,
)

from ..helpers.store_rows import WT, WV, D, F, expected_caption, expected_video, make_store, token_length

REPO = Path(__file__).resolve().parents[2]


def test_token_length_mismatch_is_refused(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=3, states="tokens") as s:
        with pytest.raises(ValueError, match="vid0000#1"):
            s.write_captions([1], expected_caption(1)["text"][None], [np.zeros((token_length(1) + 1, WT))])
        assert not s.caption_done()[1]


def test_read_only_store_refuses_writes(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=2):
        pass
    with open_store(tmp_path / f"s{suffix}") as s:
        with pytest.raises(StoreError, match="read-only"):
            s.mark_missing([0])


def test_write_validation(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=3) as s:
        ok = np.ones((1, F), bool)
        with pytest.raises(ValueError, match=r"frames has shape \(1, 4, 7\), expected \(1, 4, 8\)"):
            s.write_videos([0], np.zeros((1, F, D - 1)), ok, [1])
        with pytest.raises(ValueError, match="vid0001.*not finite"):
            s.write_videos([1], np.full((1, F, D), 1e6), ok, [1])  # overflows float16
        with pytest.raises(ValueError, match="repeat"):
            s.write_videos([2, 2], np.zeros((2, F, D)), np.ones((2, F), bool), [1, 1])
        with pytest.raises(ValueError, match="created without vision states"):
            s.write_videos([0], np.zeros((1, F, D)), ok, [1], vision_states=np.zeros((1, F, WV)))
        assert s.status().tolist() == [0, 0, 0]  # nothing marked done by a refused batch
    with pytest.raises(ValueError, match="video ids repeat.*'a'"):
        create_store(
            tmp_path / f"dup{suffix}",
            manifest={},
            video_ids=["a", "a"],
            video_split=["t", "t"],
            caption_ids=[],
            caption_video_index=[],
            caption_text=[],
            caption_split=[],
            num_frames=F,
            dim=D,
        )
    assert not (tmp_path / f"dup{suffix}").exists()


_WRITER = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[2])
from tests.helpers.store_rows import expected_video, expected_caption
from dab_pipeline.store import open_store
s = open_store(sys.argv[1], "a")
print("ready", flush=True)
while True:
    pv, pc = s.pending_videos(), s.pending_captions()
    if len(pv) == 0 and len(pc) == 0:
        break
    if len(pc):
        b = pc[:3]
        s.write_captions(b, np.stack([expected_caption(q)["text"] for q in b]), [expected_caption(q)["tokens"] for q in b])
    if len(pv):
        b = [i for i in pv[:3] if i % 7 != 3]
        for i in pv[:3]:
            if i % 7 == 3:
                s.mark_failed(int(i), f"boom {i}")
        if b:
            e = [expected_video(int(i)) for i in b]
            s.write_videos(b, np.stack([x["frames"] for x in e]), np.stack([x["mask"] for x in e]),
                           [x["nvf"] for x in e], np.stack([x["states"] for x in e]))
    print("batch", flush=True)
s.close()
print("finished", flush=True)
"""


def _check_store_consistent(path: Path) -> tuple[int, int]:
    """Every video / caption flagged done holds exactly what the writer wrote."""
    with open_store(path) as s:
        st = s.status()
        ok = np.flatnonzero(st == STATUS_OK)
        if len(ok):
            frames, mask = s.read_videos(ok)
            states = s.read_vision_states(ok)
            for j, i in enumerate(ok):
                e = expected_video(int(i))
                np.testing.assert_array_equal(frames[j], e["frames"].astype(np.float32), err_msg=f"video {i}")
                np.testing.assert_array_equal(mask[j], e["mask"])
                np.testing.assert_array_equal(states[j], e["states"])
            np.testing.assert_array_equal(s.num_video_frames()[ok], [expected_video(int(i))["nvf"] for i in ok])
        assert not np.isin(np.flatnonzero(st == STATUS_FAILED) % 7, [0, 1, 2, 4, 5, 6]).any()
        for vid, msg in s.failures():
            assert msg == f"boom {int(vid[3:])}"
        done = np.flatnonzero(s.caption_done())
        if len(done):
            for split in ("train", "test"):  # the bulk path, too
                sp = s.load_split(split)
                for j, q in enumerate(sp.caption_index):
                    np.testing.assert_array_equal(sp.text[j], expected_caption(int(q))["text"].astype(np.float32))
            got, lengths = s.read_text_states(done)
            for j, q in enumerate(done):
                np.testing.assert_array_equal(
                    got[j, : lengths[j]], expected_caption(int(q))["tokens"], err_msg=f"caption {q}"
                )
        return int((st != STATUS_PENDING).sum()), len(done)


def _run_writer(path: Path, kill_after: tuple[int, float] | None) -> str:
    """Run the writer to the end, or SIGKILL it ``delay`` s after its ``batches``-th batch."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), str(REPO)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        if kill_after is None:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            return "finished"
        batches, delay = kill_after
        for _ in range(batches):
            if proc.stdout.readline().strip() != "batch":
                break  # finished early
        # Printing happens between batches; the delay moves the kill into the
        # next batch's writes (data, flush, flags) at a random point.
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        return "killed" if proc.returncode == -signal.SIGKILL else "finished"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"kill{suffix}"
    with make_store(path, n=90, states="tokens"):
        pass
    total = (90, 180)
    rng = np.random.default_rng(7)
    progress = [(0, 0)]
    mid_way = 0
    for _ in range(6):
        outcome = _run_writer(path, kill_after=(int(rng.integers(1, 6)), float(rng.uniform(0.0, 0.005))))
        counts = _check_store_consistent(path)  # opens, and done rows are exact
        assert counts[0] >= progress[-1][0] and counts[1] >= progress[-1][1]
        progress.append(counts)
        if outcome == "killed" and counts != total and counts != (0, 0):
            mid_way += 1
        if counts == total:
            break
    assert mid_way >= 3, f"too few kills landed mid-extraction: {progress}"
    _run_writer(path, kill_after=None)
    assert _check_store_consistent(path) == total
    with open_store(path) as s:
        assert s.is_complete
        assert len(s.failures()) == sum(1 for i in range(90) if i % 7 == 3)
        assert not list(path.parent.glob(".*creating*"))
        if suffix == ".zarr":
            assert not list(path.rglob("*.partial"))  # cleaned when reopened for writing
