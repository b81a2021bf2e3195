from __future__ import annotations

import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError, VideoDecodeError
from dab_pipeline.video import DecodedVideo, decode_video, resized_shape, sample_frame_indices

from ..helpers.videos import read_frame_index, write_corrupt_video

BACKENDS = ["pyav", "pyav-seek", "decord"]


def _xpool_uniform(n: int, f: int) -> list[int]:
    """Independent restatement of X-Pool's 'uniform' rule: segment midpoints, last frame repeated."""
    k = min(f, n)
    edges = [int(x) for x in np.linspace(0, n, k + 1)]
    idx = [(edges[i] + edges[i + 1] - 1) // 2 for i in range(k)]
    return idx + [idx[-1]] * (f - k)


@pytest.mark.parametrize("f", [1, 4, 12])
def test_sampling_matches_xpool_rule(f: int) -> None:
    for n in range(1, 80):
        idx, mask = sample_frame_indices(n, f)
        assert idx.dtype == np.int64 and idx.shape == (f,)
        assert mask.dtype == np.bool_ and mask.shape == (f,)
        assert idx.tolist() == _xpool_uniform(n, f)
        assert mask.sum() == min(n, f)
        assert idx.min() >= 0 and idx.max() < n
        real = idx[mask]
        assert (np.diff(real) > 0).all()  # real frames are distinct and ordered


def test_sampling_examples() -> None:
    idx, mask = sample_frame_indices(37, 12)
    assert idx.tolist() == [1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34]
    assert mask.all()
    idx, mask = sample_frame_indices(12, 12)
    assert idx.tolist() == list(range(12))
    idx, mask = sample_frame_indices(5, 12)
    assert idx.tolist() == [0, 1, 2, 3, 4] + [4] * 7
    assert mask.tolist() == [True] * 5 + [False] * 7
    assert sample_frame_indices(100)[0].shape == (12,)  # default F = 12


def test_sampling_rejects_empty_and_bad_f() -> None:
    with pytest.raises(VideoDecodeError, match="no frames"):
        sample_frame_indices(0, 12)
    with pytest.raises(ConfigError, match="num_frames"):
        sample_frame_indices(10, 0)


def test_resized_shape_keeps_aspect() -> None:
    assert resized_shape(480, 360, 224) == (299, 224)
    assert resized_shape(360, 480, 224) == (224, 299)
    assert resized_shape(64, 64, 16) == (16, 16)
    with pytest.raises(ConfigError):
        resized_shape(10, 10, 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [5, 12, 13, 37])
def test_decode_returns_the_sampled_frames(index_video, backend: str, n: int) -> None:
    path = index_video(n)
    dec = decode_video(path, num_frames=12, backend=backend)
    assert isinstance(dec, DecodedVideo)
    assert dec.frames.shape == (12, 24, 32, 3) and dec.frames.dtype == np.uint8
    expected, mask = sample_frame_indices(n, 12)
    assert [read_frame_index(f) for f in dec.frames] == expected.tolist()
    assert dec.indices.tolist() == expected.tolist()
    assert dec.mask.tolist() == mask.tolist()
    assert dec.num_video_frames == n


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_short_video_repeats_last_frame(index_video, backend: str) -> None:
    dec = decode_video(index_video(5), num_frames=8, backend=backend)
    assert dec.mask.tolist() == [True] * 5 + [False] * 3
    assert [read_frame_index(f) for f in dec.frames] == [0, 1, 2, 3, 4, 4, 4, 4]
    np.testing.assert_array_equal(dec.frames[5], dec.frames[4])


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_side_resize_keeps_aspect(index_video, backend: str) -> None:
    landscape = decode_video(index_video(13, (64, 48)), num_frames=6, short_side=24, backend=backend)
    assert landscape.frames.shape == (6, 24, 32, 3)
    portrait = decode_video(index_video(13, (24, 32)), num_frames=6, short_side=12, backend=backend)
    assert portrait.frames.shape == (6, 16, 12, 3)
    expected = sample_frame_indices(13, 6)[0].tolist()
    assert [read_frame_index(f) for f in landscape.frames] == expected
    assert [read_frame_index(f) for f in portrait.frames] == expected


def test_short_side_equal_to_size_is_a_no_op(index_video) -> None:
    plain = decode_video(index_video(12), num_frames=4)
    same = decode_video(index_video(12), num_frames=4, short_side=24)
    np.testing.assert_array_equal(plain.frames, same.frames)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["garbage", "empty"])
def test_corrupt_files_raise_video_decode_error(tmp_path: Path, backend: str, kind: str) -> None:
    path = write_corrupt_video(tmp_path / f"{kind}.mp4", kind=kind)
    with pytest.raises(VideoDecodeError) as err:
        decode_video(path, backend=backend)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_file_raises(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "absent.mp4"
    with pytest.raises(VideoDecodeError, match="not found") as err:
        decode_video(path, backend=backend)
    assert str(path) in str(err.value)


def _write_audio_only(path: Path) -> Path:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        for i in range(4):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_file_without_video_stream_raises(tmp_path: Path, backend: str) -> None:
    path = _write_audio_only(tmp_path / "audio_only.mp4")
    assert path.stat().st_size > 0
    with pytest.raises(VideoDecodeError, match="no video stream") as err:
        decode_video(path, backend=backend)
    assert str(path) in str(err.value)


def test_decord_backend_falls_back_to_pyav_without_decord(index_video, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "decord", None)  # makes `import decord` raise ImportError
    dec = decode_video(index_video(13), num_frames=12, backend="decord")
    assert dec.backend == "pyav"
    assert [read_frame_index(f) for f in dec.frames] == sample_frame_indices(13, 12)[0].tolist()


def test_decord_backend_falls_back_to_pyav_when_decord_fails(index_video, monkeypatch) -> None:
    import dab_pipeline.video as video

    def broken(*args, **kwargs):
        raise VideoDecodeError("cannot open (simulated)")

    monkeypatch.setattr(video, "decode_decord", broken)  # the name decode_video calls
    dec = decode_video(index_video(37), num_frames=12, backend="decord")
    assert dec.backend == "pyav"
    assert [read_frame_index(f) for f in dec.frames] == sample_frame_indices(37, 12)[0].tolist()


def test_failure_message_names_the_file_and_the_decoder(tmp_path: Path) -> None:
    path = write_corrupt_video(tmp_path / "bad.mp4")
    with pytest.raises(VideoDecodeError) as err:
        decode_video(path)
    assert str(path) in str(err.value) and "pyav" in str(err.value)


def test_bad_arguments(index_video) -> None:
    with pytest.raises(ConfigError, match="backend"):
        decode_video(index_video(5), backend="opencv")
    with pytest.raises(ConfigError, match="num_frames"):
        decode_video(index_video(5), num_frames=0)


def _decode_indices(path: str) -> list[int]:
    return decode_video(Path(path), num_frames=4).indices.tolist()


def test_decoding_works_in_a_spawned_worker(index_video) -> None:
    path = index_video(13)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert pool.submit(_decode_indices, str(path)).result(timeout=120) == sample_frame_indices(13, 4)[0].tolist()
