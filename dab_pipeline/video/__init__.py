"""Uniform frame sampling (X-Pool's segment midpoints) and video decoding.

Everything here is a pure function of its arguments, so extraction workers
(separate processes) can call it without set-up.

Frame ``i`` of a video is the ``i``-th frame FFmpeg outputs reading the file from
the start. Backends (``decode_backend``):

* ``pyav`` (default): one sequential read of every file, converting only the
  sampled frames. Exact by that definition on every container and codec the
  tests generate (x264 with B-frames, H.264 MKV, XVID / MPEG-4 / MS-MPEG4 AVI
  with B-frames, VP9 WebM, damaged and truncated files, rotation metadata), and
  as fast as decord on clips (measured in docs/extraction.md).
* ``pyav-seek``: for long videos (minutes) in MP4/MOV or Matroska/WebM: seeks to
  the key frame before each sampled frame and checks that the decoder returns
  exactly the frame whose timestamp is the ``i``-th; files in other containers,
  and files where a check fails, are read sequentially. On a file with a damaged
  packet it locates frames by timestamp, so it can differ from ``pyav`` there.
* ``decord``: decord's seeking reader for MP4/MKV/WebM files without rotation
  (PyAV for the rest). It is wrong where a packet does not decode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..core.choices import DECODE_BACKENDS as BACKENDS
from ..core.errors import ConfigError, VideoDecodeError
from .decord_decoder import decode_decord, decord_can_decode  # imports decord itself only when called
from .pyav_decoder import StreamInfo, decode_seeking, decode_sequential, open_video, probe_video
from .sampling import resized_shape, sample_frame_indices
from .types import DecodedVideo

__all__ = [
    "BACKENDS",
    "SEEK_MIN_FRAMES",
    "DecodedVideo",
    "StreamInfo",
    "decode_video",
    "probe_video",
    "resized_shape",
    "sample_frame_indices",
    "DECODE_RULES",
]

# pyav-seek reads shorter files sequentially: below about this many frames a sequential
# read decodes about as many frames as seeking to 12 key frames does (docs/extraction.md).
SEEK_MIN_FRAMES = 300

# Bumped whenever a change of the rules above changes which pixels a video gets; stores
# record it, so a store is never resumed with frames decoded under other rules.
DECODE_RULES = 2


def decode_video(
    path: Path,
    num_frames: int = 12,
    short_side: Optional[int] = None,
    backend: str = "pyav",
    *,
    seek_min_frames: Optional[int] = SEEK_MIN_FRAMES,
) -> DecodedVideo:
    """Decode the uniformly sampled frames of one video.

    ``short_side`` resizes (bicubic, aspect kept) so the displayed shorter side
    has that many pixels; None keeps the native size. ``seek_min_frames``
    (pyav-seek only): the frame count from which seeking is tried. Every
    failure (missing, empty, corrupt file, no frames) raises
    :class:`VideoDecodeError` naming the file.
    """
    path = Path(path)
    if backend not in BACKENDS:
        raise ConfigError(f"unknown video backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if num_frames < 1:
        raise ConfigError(f"num_frames must be >= 1, got {num_frames}")
    if short_side is not None and short_side < 1:
        raise ConfigError(f"short_side must be >= 1 or None, got {short_side}")
    if not path.is_file():
        raise VideoDecodeError(f"{path}: video file not found")
    if path.stat().st_size == 0:
        raise VideoDecodeError(f"{path}: video file is empty (0 bytes)")
    reasons: list[str] = []
    try:
        if backend == "decord":
            got = _try_decord(path, num_frames, short_side, reasons)
            if got is not None:
                return got
        elif backend == "pyav-seek":
            with open_video(path) as (_, _, info):
                long_enough = info.timestamped and info.expected_frames >= seek_min_frames
            if long_enough:
                got = decode_seeking(path, num_frames, short_side)
                if got is not None:
                    return got
        return decode_sequential(path, num_frames, short_side)
    except VideoDecodeError as exc:
        reasons.append(f"pyav: {exc}")
    raise VideoDecodeError(f"{path}: cannot decode ({'; '.join(reasons)})")


def _try_decord(path: Path, num_frames: int, short_side: Optional[int], reasons: list[str]) -> Optional[DecodedVideo]:
    """decord's frames where they can be trusted, else None (PyAV decodes); failures are noted."""
    info, rotation = probe_video(path)
    if not decord_can_decode(info, rotation):
        return None
    try:
        return decode_decord(path, num_frames, short_side, info)
    except VideoDecodeError as exc:
        # decord rejects some files that FFmpeg proper reads: PyAV gets a second chance.
        reasons.append(f"decord: {exc}")
    except ImportError as exc:
        reasons.append(f"decord not importable ({exc})")
    return None
