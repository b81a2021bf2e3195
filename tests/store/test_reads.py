"""The read paths (store/reads.py): rows by index, load_split, pooled and ragged token states."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import StoreError
from dab_pipeline.store import (
    create_store,
    open_store,
)

from ..helpers.store_rows import WT, WV, D, F, L, expected_caption, expected_video, make_store, token_length, write_all


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


def test_first_caption_rows_against_a_naive_scan(tmp_path: Path) -> None:
    cvid = [3, 0, 3, 1, 0, 3]  # videos 2 and 4 have no caption; a video's captions are not contiguous
    st = create_store(
        tmp_path / "s.h5",
        manifest={"m": 1},
        video_ids=[f"v{i}" for i in range(5)],
        video_split=["test"] * 5,
        caption_ids=[f"c{c}" for c in range(len(cvid))],
        caption_video_index=cvid,
        caption_text=["x"] * len(cvid),
        caption_split=["test"] * len(cvid),
        num_frames=2,
        dim=4,
    )
    st.close()
    naive = np.full(5, -1)
    for c, v in enumerate(cvid):
        if naive[v] < 0:
            naive[v] = c
    with open_store(tmp_path / "s.h5") as s:
        np.testing.assert_array_equal(s.first_caption_rows(), naive)
