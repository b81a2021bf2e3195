"""Feature store: both backends, split loading, states, failures, crash safety."""

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
    ERROR_BYTES,
    STATUS_FAILED,
    STATUS_MISSING,
    STATUS_OK,
    STATUS_PENDING,
    create_store,
    manifest_compatible,
    open_store,
)

from dab_pipeline.testing import store_index

REPO = Path(__file__).resolve().parents[2]
SUFFIXES = [".h5", ".zarr"]
F, D = 4, 8  # frames, projected dim
L, WV, WT = 3, 6, 5  # vision tokens, vision width, text width
SPLITS = ("train", "val", "test")


# ----------------------------------------------------------------------- helpers
# Deterministic per-row contents, shared with the SIGKILL writer subprocess.


def expected_video(i: int, with_tokens: bool = True) -> dict:
    rng = np.random.default_rng(1000 + i)
    out = {
        "frames": rng.standard_normal((F, D)).astype(np.float16),  # (F, D)
        "mask": np.arange(F) < 1 + i % F,  # (F,)
        "nvf": 10 + i,
    }
    if with_tokens:
        out["states"] = rng.standard_normal((F, L, WV)).astype(np.float16)  # (F, L, W)
    return out


def token_length(q: int) -> int:
    return 1 + q % 4


def expected_caption(q: int) -> dict:
    rng = np.random.default_rng(5000 + q)
    return {
        "text": rng.standard_normal(D).astype(np.float16),  # (D,)
        "tokens": rng.standard_normal((token_length(q), WT)).astype(np.float16),  # (T, W)
    }


def index_arrays(n: int, captions_per_video: int = 2) -> dict:
    idx = store_index(n, captions_per_video, splits=[SPLITS[i % 3] for i in range(n)],  # interleaved splits
                      video_id="vid{i:04d}", caption_text=lambda q, v: f"caption {q} of vid{v} — ünïcode")
    return {**idx, "_m": n * captions_per_video}


def make_store(path: Path, n: int = 12, states: str | None = None, dtype: str = "float16", **kw):
    idx = index_arrays(n)
    m = idx.pop("_m")
    extra: dict = {}
    if states == "pooled":
        extra = {"vision_state_shape": (WV,), "text_state_width": WT}
    elif states == "tokens":
        extra = {
            "vision_state_shape": (L, WV),
            "text_state_width": WT,
            "text_state_lengths": [token_length(q) for q in range(m)],
        }
    manifest = {"model": "dab-tiny", "pretrained": None, "frames": F, "preprocessing": (224, "center"), "trainable_blocks": 2 if states == "tokens" else 0 if states else None}
    return create_store(path, manifest=manifest, num_frames=F, dim=D, dtype=dtype, **idx, **extra, **kw)


def write_all(store, videos=None, states: str | None = None) -> None:
    videos = range(store.num_videos) if videos is None else videos
    for i in videos:
        e = expected_video(i)
        vs = None
        if states == "tokens":
            vs = e["states"][None]
        elif states == "pooled":
            vs = e["states"][None, :, 0, :]  # (1, F, W)
        store.write_videos([i], e["frames"][None], e["mask"][None], [e["nvf"]], vs)
    qs = np.arange(store.num_captions)
    text = np.stack([expected_caption(q)["text"] for q in qs])
    ts = None
    if states == "tokens":
        ts = [expected_caption(q)["tokens"] for q in qs]
    elif states == "pooled":
        ts = np.stack([expected_caption(q)["tokens"][0] for q in qs])
    store.write_captions(qs, text, ts)


@pytest.fixture(params=SUFFIXES, ids=["hdf5", "zarr"])
def suffix(request) -> str:
    return request.param


# ------------------------------------------------------------------------- basics


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


def test_float32_store_keeps_full_precision(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=3, dtype="float32") as s:
        x = np.random.default_rng(0).standard_normal((3, F, D)).astype(np.float32)
        s.write_videos([0, 1, 2], x, np.ones((3, F), bool), [5, 5, 5])
        np.testing.assert_array_equal(s.read_videos([2, 0])[0], x[[2, 0]])


def test_load_split_membership_and_caption_remap(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=12) as s:
        write_all(s)
        s.mark_failed(5, "boom")  # a test video (5 % 3 == 2)
        s.mark_missing([8])  # another test video
        sp = s.load_split("test")
    want_videos = [f"vid{i:04d}" for i in range(12) if i % 3 == 2 and i not in (5, 8)]
    assert sp.video_ids.tolist() == want_videos
    assert sp.num_excluded_videos == 2
    assert sp.num_dropped_captions == 4  # two captions each for videos 5 and 8
    assert sp.frames.shape == (2, F, D) and sp.frames.dtype == np.float32
    assert sp.text.shape == (4, D) and sp.text.dtype == np.float32
    # every caption points at its own video in this split's numbering
    for cid, v in zip(sp.caption_ids, sp.caption_video):
        assert cid.split("#")[0] == sp.video_ids[v]
    for j, i in enumerate(sp.video_index):
        np.testing.assert_array_equal(sp.frames[j], expected_video(int(i))["frames"].astype(np.float32))
        np.testing.assert_array_equal(sp.frame_mask[j], expected_video(int(i))["mask"])
    for j, q in enumerate(sp.caption_index):
        np.testing.assert_array_equal(sp.text[j], expected_caption(int(q))["text"].astype(np.float32))


def test_load_split_skips_pending_and_unwritten_captions(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=6) as s:
        e = [expected_video(i) for i in range(6)]
        s.write_videos([0, 3], np.stack([e[0]["frames"], e[3]["frames"]]), np.ones((2, F), bool), [1, 1])
        s.write_captions([0], expected_caption(0)["text"][None])  # caption 1 (also video 0) not written
        sp = s.load_split("train")  # videos 0 and 3
        assert sp.video_ids.tolist() == ["vid0000", "vid0003"]
        assert sp.caption_ids.tolist() == ["vid0000#0"]
        assert sp.num_dropped_captions == 3 and sp.num_excluded_videos == 0
        with pytest.raises(StoreError, match="no split 'nope'.*test, train, val"):
            s.load_split("nope")


def test_read_videos_equals_load_split_rows(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=30) as s:
        write_all(s)
        sp = s.load_split("val")
        rng = np.random.default_rng(3)
        rows = rng.choice(len(sp.video_ids), size=15)  # unordered, with repeats
        frames, mask = s.read_videos(sp.video_index[rows])
        np.testing.assert_array_equal(frames, sp.frames[rows])
        np.testing.assert_array_equal(mask, sp.frame_mask[rows])


def test_read_videos_refuses_videos_without_features(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=4) as s:
        write_all(s, videos=[0])
        s.mark_failed(2, "x")
        with pytest.raises(StoreError, match=r"vid0001 \(pending\)"):
            s.read_videos([0, 1])
        with pytest.raises(StoreError, match=r"vid0002 \(failed\)"):
            s.read_videos([2])


def test_pooled_states_round_trip(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=6, states="pooled") as s:
        assert s.state_layout == "pooled" and s.trainable_blocks == 0
        write_all(s, states="pooled")
    with open_store(tmp_path / f"s{suffix}") as s:
        sp = s.load_split("train", with_states=True)
        assert sp.vision_states.shape == (2, F, WV) and sp.text_states.shape == (4, WT)
        for j, i in enumerate(sp.video_index):
            np.testing.assert_array_equal(sp.vision_states[j], expected_video(int(i))["states"][:, 0, :])
        for j, q in enumerate(sp.caption_index):
            np.testing.assert_array_equal(sp.text_states[j], expected_caption(int(q))["tokens"][0])
        got, lengths = s.read_text_states([3, 1])
        assert lengths is None
        np.testing.assert_array_equal(got[0], expected_caption(3)["tokens"][0])


def test_ragged_text_token_states_round_trip(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=9, states="tokens") as s:
        assert s.state_layout == "tokens" and s.trainable_blocks == 2
        # captions written out of order and in separate, non-contiguous batches
        qs = np.arange(s.num_captions)
        for batch in (qs[1::2][::-1], qs[0::2]):
            s.write_captions(
                batch,
                np.stack([expected_caption(q)["text"] for q in batch]),
                [expected_caption(q)["tokens"] for q in batch],
            )
        write_all_videos = [expected_video(i) for i in range(9)]
        s.write_videos(
            range(9),
            np.stack([e["frames"] for e in write_all_videos]),
            np.stack([e["mask"] for e in write_all_videos]),
            [e["nvf"] for e in write_all_videos],
            np.stack([e["states"] for e in write_all_videos]),
        )
    with open_store(tmp_path / f"s{suffix}") as s:
        np.testing.assert_array_equal(s.text_state_lengths, [token_length(q) for q in range(s.num_captions)])
        sp = s.load_split("val", with_states=True)
        assert sp.vision_states.shape == (3, F, L, WV)
        assert sp.text_offsets[-1] == sp.text_states.shape[0] == sum(token_length(int(q)) for q in sp.caption_index)
        for j, q in enumerate(sp.caption_index):
            tok = sp.text_states[sp.text_offsets[j] : sp.text_offsets[j + 1]]
            np.testing.assert_array_equal(tok, expected_caption(int(q))["tokens"])
        padded, lengths = sp.text_state_batch([2, 0])
        assert padded.dtype == np.float32 and padded.shape[1] == lengths.max()
        np.testing.assert_array_equal(padded[0, : lengths[0]], expected_caption(int(sp.caption_index[2]))["tokens"])
        assert (padded[0, lengths[0] :] == 0).all()
        got, glen = s.read_text_states([7, 2])
        np.testing.assert_array_equal(glen, [token_length(7), token_length(2)])
        np.testing.assert_array_equal(got[0, : glen[0]], expected_caption(7)["tokens"])
        np.testing.assert_array_equal(s.read_vision_states([4])[0], expected_video(4)["states"])


def test_token_length_mismatch_is_refused(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=3, states="tokens") as s:
        with pytest.raises(ValueError, match="vid0000#1"):
            s.write_captions([1], expected_caption(1)["text"][None], [np.zeros((token_length(1) + 1, WT))])
        assert not s.caption_done()[1]


def test_failures_table(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=5) as s:
        s.mark_failed(3, "cannot decode: moov atom not found ✗")
        s.mark_failed(1, "x" * (ERROR_BYTES + 500))
        s.mark_missing([0])
    with open_store(tmp_path / f"s{suffix}", "a") as s:
        assert s.failures() == [("vid0001", "x" * ERROR_BYTES), ("vid0003", "cannot decode: moov atom not found ✗")]
        np.testing.assert_array_equal(s.status(), [STATUS_MISSING, STATUS_FAILED, STATUS_PENDING, STATUS_FAILED, STATUS_PENDING])
        np.testing.assert_array_equal(s.pending_videos(), [2, 4])
        np.testing.assert_array_equal(s.pending_videos(include_failed=True), [1, 2, 3, 4])
        # a retry that succeeds takes the video out of the failures table
        write_all(s, videos=[3])
        assert [v for v, _ in s.failures()] == ["vid0001"]


def test_manifest_round_trip_and_compatibility(tmp_path: Path, suffix: str) -> None:
    manifest = {
        "model": "ViT-B-32",
        "pretrained": "openai",
        "frames": 12,
        "preprocessing": {"resize": 224, "crop": "center"},
        "dataset": {"name": "msrvtt", "options": {"split": "1k-A"}},
        "image_size": (224, 224),
    }
    idx = index_arrays(2)
    idx.pop("_m")
    with create_store(tmp_path / f"s{suffix}", manifest=manifest, num_frames=F, dim=D, **idx):
        pass
    with open_store(tmp_path / f"s{suffix}") as s:
        got = s.manifest
    assert got["dataset"] == {"name": "msrvtt", "options": {"split": "1k-A"}}
    assert got["image_size"] == [224, 224]  # JSON has no tuples
    keys = ["model", "pretrained", "frames", "preprocessing", "image_size", "dataset.options"]
    assert manifest_compatible(got, manifest, keys) == []  # the tuple/list difference does not count
    changed = {**manifest, "frames": 8, "dataset": {"name": "msrvtt", "options": {"split": "7k"}}}
    assert manifest_compatible(got, changed, keys) == ["frames", "dataset.options"]
    assert manifest_compatible(got, {k: v for k, v in manifest.items() if k != "pretrained"}, keys) == ["pretrained"]


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
    holder = subprocess.Popen([sys.executable, "-c", "import h5py, sys, time; f = h5py.File(sys.argv[1], 'r+'); "
                               "print('open', flush=True); time.sleep(60)", str(tmp_path / "busy.h5")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreError, match="locked by another process"):
            open_store(tmp_path / "busy.h5")
    finally:
        holder.kill()
        holder.wait()


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
            tmp_path / f"dup{suffix}", manifest={}, video_ids=["a", "a"], video_split=["t", "t"],
            caption_ids=[], caption_video_index=[], caption_text=[], caption_split=[], num_frames=F, dim=D,
        )
    assert not (tmp_path / f"dup{suffix}").exists()


def test_summary(tmp_path: Path, suffix: str) -> None:
    with make_store(tmp_path / f"s{suffix}", n=6) as s:
        write_all(s, videos=[0, 1, 2])
        s.mark_failed(3, "x")
        s.mark_missing([4])
        info = s.summary()
    assert info["videos"] == {"pending": 1, "ok": 3, "failed": 1, "missing": 1}
    assert info["splits"]["train"] == {"videos": 2, "pending": 0, "ok": 1, "failed": 1, "missing": 0, "captions": 4, "captions_done": 4}
    assert info["captions"] == {"done": 12, "pending": 0}
    assert info["complete"] is False
    assert info["arrays"]["videos/frames"]["nbytes"] == 6 * F * D * 2
    assert info["arrays"]["videos/frames"]["stored_bytes"] > 0 and info["file_bytes"] > 0


# ------------------------------------------------------------------ crash safety

_WRITER = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[2])
from tests.store.test_store import expected_video, expected_caption
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
                np.testing.assert_array_equal(got[j, : lengths[j]], expected_caption(int(q))["tokens"], err_msg=f"caption {q}")
        return int((st != STATUS_PENDING).sum()), len(done)


def _run_writer(path: Path, kill_after: tuple[int, float] | None) -> str:
    """Run the writer to the end, or SIGKILL it ``delay`` s after its ``batches``-th batch."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), str(REPO)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
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


_CREATOR = r"""
import sys
sys.path.insert(0, sys.argv[2])
from tests.store.test_store import make_store
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
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
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
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), str(REPO)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match=f"{path} is locked"):
            open_store(path, "a")
    finally:
        proc.kill()  # SIGKILL: the lock dies with the process
        proc.wait()
    with open_store(path, "a") as s:
        assert s.mode == "a"


def test_zarr_direct_chunk_reads_match_zarr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dab_pipeline.store.backend_zarr as zarr_backend

    # 5 rows of frames per chunk: 23 videos give an edge chunk of 3 rows, and
    # unwritten videos leave whole chunks absent.
    monkeypatch.setattr(zarr_backend, "ZARR_CHUNK_BYTES", 5 * F * D * 2)
    with make_store(tmp_path / "s.zarr", n=23, states="tokens") as s:
        written = [i for i in range(23) if not 5 <= i < 10]
        write_all(s, videos=written, states="tokens")
        frames = s.raw_backend.raw("videos/frames")
        assert frames.chunks[0] == 5
        rng = np.random.default_rng(0)
        for rows in (np.array(written), rng.choice(written, 9), np.array([22, 21, 20, 0])):
            got, _ = s.read_videos(rows)
            np.testing.assert_array_equal(got, frames.oindex[rows].astype(np.float32))
        np.testing.assert_array_equal(s.load_split("train").frames, frames.oindex[s.load_split("train").video_index])
        # a chunk file that lost its tail is reported, not misread
        chunk = Path(s.raw_backend.raw_chunks("videos/frames").chunk_file(4))
        chunk.write_bytes(chunk.read_bytes()[:100])
        with pytest.raises(StoreError, match="truncated"):
            s.read_videos([21])


def test_a_deleted_zarr_chunk_is_damage_not_zeros(tmp_path: Path) -> None:
    """Zarr reads a missing chunk file as zeros: a store must know the chunks it wrote, refuse to read one that is
    gone by its name, say so in inspect, and the same extract command must write those rows again."""
    path = tmp_path / "s.zarr"
    with make_store(path, n=12) as s:
        write_all(s)
    with open_store(path) as s:
        assert s.is_complete and s.missing_chunks() == [] and s.verify() == []
        raw = s.raw_backend.raw_chunks("videos/frames")
        victim = raw.chunk_file(0)
    os.remove(victim)
    with open_store(path) as s:
        (name, chunk, rows), = s.missing_chunks()
        assert name == "videos/frames" and chunk == victim and rows >= 1
        assert not s.is_complete and s.summary()["missing_chunks"] == 1 and not s.summary()["complete"]
        with pytest.raises(StoreError, match=f"chunk file {victim} of array 'videos/frames' is missing"):
            s.load_split("train")
        with pytest.raises(StoreError, match="is damaged: 1 chunk file"):
            s.require_complete("dab train")
        assert any("is missing" in p for p in s.verify())
    # resuming the extraction marks every written row of the lost chunk as not extracted
    with open_store(path, "a") as s:
        videos, captions = s.reopen_damaged()
        assert videos >= 1 and captions == 0 and len(s.pending_videos()) == videos


@pytest.mark.parametrize("suffix", [".h5", ".zarr"])
def test_verify_passes_on_an_intact_store_and_finds_a_short_chunk(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"s{suffix}"
    with make_store(path, n=6) as s:
        write_all(s)
    with open_store(path) as s:
        assert s.verify() == []
        if suffix == ".zarr":
            chunk = s.raw_backend.raw_chunks("captions/features").chunk_file(0)
    if suffix == ".zarr":
        with open(chunk, "r+b") as fh:
            fh.truncate(10)
        with open_store(path) as s:
            assert any("holds 10 bytes" in p for p in s.verify())


def test_first_caption_rows_against_a_naive_scan(tmp_path: Path) -> None:
    cvid = [3, 0, 3, 1, 0, 3]  # videos 2 and 4 have no caption; a video's captions are not contiguous
    st = create_store(tmp_path / "s.h5", manifest={"m": 1}, video_ids=[f"v{i}" for i in range(5)],
                      video_split=["test"] * 5, caption_ids=[f"c{c}" for c in range(len(cvid))],
                      caption_video_index=cvid, caption_text=["x"] * len(cvid), caption_split=["test"] * len(cvid),
                      num_frames=2, dim=4)
    st.close()
    naive = np.full(5, -1)
    for c, v in enumerate(cvid):
        if naive[v] < 0:
            naive[v] = c
    with open_store(tmp_path / "s.h5") as s:
        np.testing.assert_array_equal(s.first_caption_rows(), naive)
