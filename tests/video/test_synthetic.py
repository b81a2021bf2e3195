"""The demo dataset of video/synthetic.py: its layout, splits, captions and colours, determinism, speed."""

from __future__ import annotations

import csv
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.datasets import load_dataset
from dab_pipeline.video import decode_video, sample_frame_indices
from dab_pipeline.video.synthetic import PALETTE, make_demo_dataset


def _rows(captions: Path) -> list[dict[str, str]]:
    with open(captions, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _colours_in(text: str) -> frozenset[str]:
    return frozenset(word.strip(",") for word in text.split() if word.strip(",") in PALETTE)


def _dominant_colours(frames: np.ndarray) -> frozenset[str]:
    """Nearest palette colour of each (H, W, 3) frame's median pixel."""
    palette = {name: np.array(rgb, np.float32) for name, rgb in PALETTE.items()}
    seen = set()
    for frame in frames:
        median = np.median(frame.reshape(-1, 3).astype(np.float32), axis=0)  # (3,), ignores the small square
        seen.add(min(palette, key=lambda n: float(np.abs(palette[n] - median).sum())))
    return frozenset(seen)


def test_demo_dataset_layout_and_splits(demo_dataset: Path) -> None:
    rows = _rows(demo_dataset)
    assert list(rows[0]) == ["video_id", "video", "caption", "split"]
    assert len(rows) == 240  # 120 videos x 2 captions
    per_video: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        per_video[row["video_id"]].append(row)
    assert len(per_video) == 120
    split_of = {vid: rs[0]["split"] for vid, rs in per_video.items()}
    counts = {s: sum(1 for v in split_of.values() if v == s) for s in ("train", "val", "test")}
    assert counts == {"train": 72, "val": 24, "test": 24}
    videos = demo_dataset.parent / "videos"
    assert sorted(p.name for p in videos.glob("*.mp4")) == sorted(f"{v}.mp4" for v in per_video)

    sets_by_split: dict[str, list[frozenset[str]]] = defaultdict(list)
    for vid, rs in per_video.items():
        assert len(rs) == 2 and rs[0]["caption"] != rs[1]["caption"]
        assert {r["split"] for r in rs} == {split_of[vid]}
        colour_sets = {_colours_in(r["caption"]) for r in rs}
        assert len(colour_sets) == 1  # both captions name the same set
        colours = colour_sets.pop()
        assert len(colours) in (2, 3)
        sets_by_split[split_of[vid]].append(colours)
    # Retrieval on val/test is answerable (one video per set) and every set was trained on.
    for split in ("val", "test"):
        assert len(set(sets_by_split[split])) == len(sets_by_split[split])
        assert set(sets_by_split[split]) <= set(sets_by_split["train"])


def test_demo_frames_show_the_captioned_colours(demo_dataset: Path) -> None:
    rows = _rows(demo_dataset)
    for row in rows[:20:2]:
        dec = decode_video(demo_dataset.parent / "videos" / row["video"], num_frames=12)
        assert dec.frames.shape == (12, 48, 64, 3) and dec.mask.all()
        assert _dominant_colours(dec.frames) == _colours_in(row["caption"])


def test_demo_dataset_loads_with_the_folder_loader(demo_dataset: Path) -> None:
    index = load_dataset("folder", demo_dataset.parent / "videos", demo_dataset)
    assert index.missing == []
    assert len(index.videos) == 120 and len(index.captions) == 240
    assert {v.split for v in index.videos} == {"train", "val", "test"}
    assert index.videos[0].video_id.startswith("demo_")


def test_demo_dataset_is_deterministic_and_fast(tmp_path: Path) -> None:
    start = time.perf_counter()
    a = make_demo_dataset(tmp_path / "a", num_videos=20, num_frames=8, size=(32, 24), seed=3)
    elapsed = time.perf_counter() - start
    b = make_demo_dataset(tmp_path / "b", num_videos=20, num_frames=8, size=(32, 24), seed=3)
    c = make_demo_dataset(tmp_path / "c", num_videos=20, num_frames=8, size=(32, 24), seed=4)
    assert a.read_text() == b.read_text()
    assert a.read_text() != c.read_text()
    fa = decode_video(a.parent / "videos" / "demo_005.mp4", num_frames=8).frames
    fb = decode_video(b.parent / "videos" / "demo_005.mp4", num_frames=8).frames
    np.testing.assert_array_equal(fa, fb)
    assert elapsed < 20.0  # about 0.2 s here; generous for a loaded CI machine


def test_demo_dataset_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="splits"):
        make_demo_dataset(tmp_path, num_videos=10, splits=(0.5, 0.5, 0.5))
    with pytest.raises(ConfigError, match="size"):
        make_demo_dataset(tmp_path, num_videos=10, size=(33, 24))


def test_longer_demo_videos_show_every_colour_even_with_few_samples(tmp_path: Path) -> None:
    captions = make_demo_dataset(tmp_path, num_videos=10, num_frames=40, size=(32, 24), seed=1)
    row = _rows(captions)[0]
    dec = decode_video(captions.parent / "videos" / row["video"], num_frames=12)
    assert dec.num_video_frames == 40
    assert dec.indices.tolist() == sample_frame_indices(40, 12)[0].tolist()
    for row in _rows(captions):
        frames = decode_video(captions.parent / "videos" / row["video"], num_frames=6).frames  # (6, 24, 32, 3)
        assert _dominant_colours(frames) == _colours_in(row["caption"])
