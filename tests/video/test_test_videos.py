"""The test videos of helpers/videos.py read back as written: frame i of an index video encodes i."""

from __future__ import annotations

from pathlib import Path

import av
import pytest

from ..helpers.videos import index_frame, read_frame_index, write_corrupt_video, write_index_video


def test_index_frame_round_trip_in_memory() -> None:
    for i in [0, 1, 2, 7, 255, 1000, 65535]:
        assert read_frame_index(index_frame(i, (32, 24))) == i
    # Reading uses relative block positions, so an aspect-preserving resize keeps the value.
    big = index_frame(12345, (64, 48))  # (48, 64, 3)
    assert read_frame_index(big[::2, ::2]) == 12345
    with pytest.raises(ValueError):
        index_frame(1 << 16)


def test_index_video_frames_read_back_exactly(tmp_path: Path) -> None:
    path = write_index_video(tmp_path / "idx.mp4", 40, size=(32, 24))
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]  # N x (H, W, 3)
    assert len(frames) == 40
    assert frames[0].shape == (24, 32, 3)
    assert [read_frame_index(f) for f in frames] == list(range(40))


def test_write_corrupt_video_kinds(tmp_path: Path) -> None:
    garbage = write_corrupt_video(tmp_path / "g.mp4")
    empty = write_corrupt_video(tmp_path / "e.mp4", kind="empty")
    assert garbage.suffix == ".mp4" and garbage.stat().st_size == 4096
    assert empty.stat().st_size == 0
    with pytest.raises(ValueError):
        write_corrupt_video(tmp_path / "x.mp4", kind="nope")
