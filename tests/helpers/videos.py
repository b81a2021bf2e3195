"""Test videos: index-encoding clips in real codecs, and the damaged, truncated and unreadable files of real datasets.

Index videos let tests check *which* frames a decoder returned: frame ``i`` is a
grid of black/white blocks spelling ``i`` in binary. Blocks of flat gray survive
YUV 4:2:0 and lossy coding, and reading the centre of each block at relative
positions still works after an aspect-preserving resize. They are written by the
library's ``write_video`` in any of ``VIDEO_FORMATS`` (x264, XVID, VP9, ...; rotated).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from dab_pipeline.video.synthetic import write_video

# 4 x 4 blocks = 16 bits, enough for 65536 frames.
_GRID_ROWS, _GRID_COLS = 4, 4
_BIT_ON, _BIT_OFF = 235, 20  # away from 0/255 so that coding overshoot cannot wrap


# An H.264 access-unit delimiter alone (4-byte length prefix, as in MP4): FFmpeg's decoder
# rejects a packet holding only this and outputs no frame for it; index-based readers
# (decord) still count the packet, which is how real files with a broken slice go wrong.
_H264_AUD_ONLY = b"\x00\x00\x00\x02\x09\xf0"
DAMAGE_MODES = ("garbage", "no-frame", "drop")


def damage_video(src: Path, dst: Path, packets: Sequence[int], mode: str = "garbage", seed: int = 0) -> Path:
    """Copy ``src`` to ``dst`` (same container) with some packets damaged, as broken real files are.

    ``mode`` "garbage": the packets' bytes after the first 8 are replaced by random
    bytes; "no-frame" (H.264 in MP4/MKV only): each packet is replaced by an
    access-unit delimiter, which yields no frame, like the broken slice of
    opencv-doc's box.mp4; "drop": the packets are left out of the file.
    Packets are counted in file (decode) order, empty ones skipped.
    """
    import av

    if mode not in DAMAGE_MODES:
        raise ValueError(f"unknown damage mode {mode!r}; valid: {', '.join(DAMAGE_MODES)}")
    rng = np.random.default_rng(seed)
    chosen = set(int(p) for p in packets)
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        istream = inp.streams.video[0]
        ostream = out.add_stream_from_template(istream)
        for k, packet in enumerate(p for p in inp.demux(istream) if p.size):
            if k in chosen:
                if mode == "drop":
                    continue
                data = bytearray(bytes(packet))
                data[8:] = rng.integers(0, 256, max(0, len(data) - 8), dtype=np.uint8).tobytes()
                broken = av.Packet(_H264_AUD_ONLY if mode == "no-frame" else bytes(data))
                broken.pts, broken.dts, broken.time_base = packet.pts, packet.dts, packet.time_base
                broken.is_keyframe = packet.is_keyframe
                packet = broken
            packet.stream = ostream
            out.mux(packet)
    return Path(dst)


def truncate_file(src: Path, dst: Path, keep: float) -> Path:
    """Copy the first ``keep`` fraction of ``src``'s bytes to ``dst``: an interrupted download."""
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[: int(len(data) * keep)])
    return Path(dst)


def index_frame(index: int, size: tuple[int, int] = (32, 24)) -> np.ndarray:
    """The (H, W, 3) uint8 image that encodes ``index``; ``size`` is (W, H)."""
    w, h = size
    if not 0 <= index < 2 ** (_GRID_ROWS * _GRID_COLS):
        raise ValueError(f"index {index} does not fit in {_GRID_ROWS * _GRID_COLS} bits")
    if w < 2 * _GRID_COLS or h < 2 * _GRID_ROWS:
        raise ValueError(f"frame size {w}x{h} too small for a {_GRID_COLS}x{_GRID_ROWS} grid")
    img = np.empty((h, w, 3), dtype=np.uint8)  # (H, W, 3)
    rows = np.linspace(0, h, _GRID_ROWS + 1).astype(int)
    cols = np.linspace(0, w, _GRID_COLS + 1).astype(int)
    for bit in range(_GRID_ROWS * _GRID_COLS):
        r, c = divmod(bit, _GRID_COLS)
        on = (index >> (_GRID_ROWS * _GRID_COLS - 1 - bit)) & 1  # most significant bit first
        img[rows[r] : rows[r + 1], cols[c] : cols[c + 1]] = _BIT_ON if on else _BIT_OFF
    return img


def read_frame_index(frame: np.ndarray) -> int:
    """Read back the index written by :func:`index_frame` from a decoded (H, W, 3) frame."""
    frame = np.asarray(frame)
    if frame.ndim != 3:
        raise ValueError(f"expected an (H, W, 3) frame, got shape {frame.shape}")
    h, w = frame.shape[:2]
    value = 0
    for bit in range(_GRID_ROWS * _GRID_COLS):
        r, c = divmod(bit, _GRID_COLS)
        # Centre half of the block: its edges blur into the neighbours after coding/resizing.
        y0, y1 = int((r + 0.25) * h / _GRID_ROWS), int(np.ceil((r + 0.75) * h / _GRID_ROWS))
        x0, x1 = int((c + 0.25) * w / _GRID_COLS), int(np.ceil((c + 0.75) * w / _GRID_COLS))
        level = float(frame[y0:y1, x0:x1].mean())
        value = (value << 1) | int(level > (_BIT_ON + _BIT_OFF) / 2)
    return value


def write_index_video(
    path: Path,
    num_frames: int,
    size: tuple[int, int] = (32, 24),
    fps: int = 25,
    fmt: Optional[str] = None,
    rotation: int = 0,
    noise: int = 0,
    faststart: bool = False,
    seed: int = 0,
) -> Path:
    """Write a video of ``num_frames`` frames where frame i encodes i (``size`` is (W, H)).

    ``noise``: uniform pixel noise of that amplitude on top of the blocks, so packets
    are as large as real video's (a truncated file then keeps most of its frames).
    """
    frames = np.stack([index_frame(i, size) for i in range(num_frames)])  # (N, H, W, 3)
    if noise:
        rng = np.random.default_rng(seed)
        frames = np.clip(frames + rng.integers(-noise, noise + 1, frames.shape), 0, 255).astype(np.uint8)
    return write_video(path, frames, fps=fps, fmt=fmt, rotation=rotation, faststart=faststart)


def write_corrupt_video(path: Path, kind: str = "garbage", seed: int = 0) -> Path:
    """A file with a video suffix that no decoder can read.

    kind "garbage": 4 KiB of random bytes; kind "empty": a zero-byte file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "garbage":
        path.write_bytes(np.random.default_rng(seed).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        raise ValueError(f"unknown corrupt-video kind {kind!r}; valid: garbage, empty")
    return path
