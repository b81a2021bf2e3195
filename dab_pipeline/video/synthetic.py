"""Synthetic videos: clips written in the codecs real datasets use, and the embedded demo dataset.

``write_video`` encodes frames in one of :data:`VIDEO_FORMATS` (x264 with and without
B-frames, XVID and MPEG-4 AVI, VP9 WebM, ...); the world generator, the decoder and
extraction benchmarks and the tests' index videos (tests/helpers/videos.py) write with it.

The demo dataset is a retrieval task that a frame-set model can solve: each
video flashes a set of 2 or 3 named colours in random order, and its captions
name that set (in varying word orders), so answering needs only the unordered
set of frames.
"""

from __future__ import annotations

import csv
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..core.errors import ConfigError


@dataclass(frozen=True)
class VideoFormat:
    """How to encode a generated video: the codecs and containers real datasets use."""

    suffix: str  # container, chosen by FFmpeg from the suffix
    codec: str
    options: tuple[tuple[str, str], ...] = ()
    codec_tag: Optional[str] = None  # e.g. "XVID": what MSVD's AVIs carry
    b_frames: int = 0
    gop: Optional[int] = None
    pix_fmt: str = "yuv420p"


# Lossy settings keep the blocks of the tests' index videos (levels 235 / 20) readable; B-frames and short GOPs are
# what make decoders that seek by index go wrong. x264's threaded lookahead makes its
# output (with macroblock-tree rate control) differ from run to run even with one encoding
# thread, seen on 64x64 clips: both are switched off, so
# a generated file is byte-identical for the same frames.
_X264_DETERMINISTIC = ("x264-params", "threads=1:sync-lookahead=0:mbtree=0")
VIDEO_FORMATS: dict[str, VideoFormat] = {
    "x264": VideoFormat(".mp4", "libx264", (("crf", "0"), ("preset", "veryfast"), _X264_DETERMINISTIC)),
    "x264-bframes": VideoFormat(
        ".mp4", "libx264", (("crf", "12"), ("preset", "medium"), ("bf", "3"), _X264_DETERMINISTIC), gop=24
    ),
    "h264-mkv": VideoFormat(
        ".mkv", "libx264", (("crf", "12"), ("preset", "veryfast"), ("bf", "2"), _X264_DETERMINISTIC), gop=30
    ),
    "xvid-avi": VideoFormat(".avi", "mpeg4", (("qscale", "2"),), codec_tag="XVID", b_frames=2, gop=25),
    "mpeg4-avi": VideoFormat(".avi", "mpeg4", (("qscale", "2"),), gop=12),
    "msmpeg4-avi": VideoFormat(".avi", "msmpeg4", (("qscale", "2"),), gop=12),
    "vp9-webm": VideoFormat(
        ".webm", "libvpx-vp9", (("crf", "10"), ("b", "0"), ("deadline", "realtime"), ("cpu-used", "8")), gop=30
    ),
}


def _default_format() -> str:
    """The best encoder the bundled FFmpeg offers, with a near-lossless setting."""
    import av

    available = av.codecs_available
    if "libx264" in available:
        return "x264"
    if "mpeg4" in available:
        return "mpeg4-avi"
    raise RuntimeError("PyAV's FFmpeg has neither libx264 nor mpeg4 encoders")


def write_video(
    path: Path, frames: np.ndarray, fps: int = 25, fmt: Optional[str] = None, rotation: int = 0, faststart: bool = False
) -> Path:
    """Encode ``frames`` (N, H, W, 3) uint8 RGB; H and W must be even.

    ``fmt``: a name of :data:`VIDEO_FORMATS` (default: lossless x264 in mp4; the
    container follows ``path``'s suffix). ``rotation``: a display-matrix rotation in
    degrees counter-clockwise, as phones write (players turn the picture by it).
    ``faststart``: mp4 with the index (moov) before the data, as web video is.
    """
    import av

    path = Path(path)
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be (N, H, W, 3) uint8, got {frames.shape} {frames.dtype}")
    _, h, w, _ = frames.shape
    if h % 2 or w % 2:
        raise ValueError(f"frame size {w}x{h} must be even for yuv420p")
    name = fmt or _default_format()
    if name not in VIDEO_FORMATS:
        raise ValueError(f"unknown video format {name!r}; valid: {', '.join(VIDEO_FORMATS)}")
    spec = VIDEO_FORMATS[name]
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream(spec.codec, rate=fps)
        stream.width, stream.height = w, h
        stream.pix_fmt = spec.pix_fmt
        stream.options = dict(spec.options)
        if spec.codec_tag:
            stream.codec_tag = spec.codec_tag
        if spec.b_frames:
            stream.codec_context.max_b_frames = spec.b_frames
        if spec.gop:
            stream.codec_context.gop_size = spec.gop
        if rotation:
            stream.set_display_rotation(rotation)
        # One encoder thread: callers may write many small files in parallel.
        stream.codec_context.thread_count = 1
        for img in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


# ----------------------------------------------------------------------------
# The demo dataset

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (40, 170, 60),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 40),
    "orange": (245, 140, 20),
    "purple": (130, 40, 170),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
}

# Each caption names the colour set once; "{c}" is the colours in some order.
_TEMPLATES = (
    "a clip showing {c}",
    "{c} colours flash on screen",
    "the screen switches between {c}",
    "a video of {c} frames",
    "flashes of {c} one after another",
    "{c} fill the picture in turns",
)


def _join_colours(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _split_sizes(num_videos: int, splits: Sequence[float]) -> tuple[int, int, int]:
    if len(splits) != 3 or any(s < 0 for s in splits) or abs(sum(splits) - 1.0) > 1e-6:
        raise ConfigError(f"splits must be three non-negative fractions summing to 1, got {tuple(splits)}")
    n_val = int(round(num_videos * splits[1]))
    n_test = int(round(num_videos * splits[2]))
    n_train = num_videos - n_val - n_test
    if n_train < 1:
        raise ConfigError(f"splits {tuple(splits)} leave no training video out of {num_videos}")
    return n_train, n_val, n_test


def _colour_sets(count: int, rng: np.random.Generator) -> list[tuple[str, ...]]:
    """``count`` distinct colour sets, about two thirds pairs and one third triples."""
    names = list(PALETTE)
    pairs = list(itertools.combinations(names, 2))
    triples = list(itertools.combinations(names, 3))
    pairs = [pairs[i] for i in rng.permutation(len(pairs))]
    triples = [triples[i] for i in rng.permutation(len(triples))]
    n_pairs = min(len(pairs), -(-2 * count // 3))
    chosen = pairs[:n_pairs] + triples[: count - n_pairs]
    return [chosen[i] for i in rng.permutation(len(chosen))]


def _colour_schedule(colours: Sequence[str], num_frames: int, rng: np.random.Generator) -> list[str]:
    """Per-frame dominant colour: contiguous runs, each colour in at least one run.

    Runs (rather than a colour per frame) make uniform sampling of F >= 2k frames
    see every colour of the set (checked exhaustively for n < 64, F <= 16).
    """
    k = len(colours)
    num_runs = min(num_frames, 2 * k)
    # Every colour once, then random extra runs; no two neighbouring runs share a colour.
    order = list(rng.permutation(k))
    while len(order) < num_runs:
        choices = [c for c in range(k) if c != order[-1]]
        order.append(int(rng.choice(choices)))
    bounds = np.linspace(0, num_frames, num_runs + 1).astype(int)
    schedule: list[str] = []
    for run, colour in enumerate(order[:num_runs]):
        schedule.extend([colours[colour]] * int(bounds[run + 1] - bounds[run]))
    return schedule


def _demo_frames(schedule: Sequence[str], size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    w, h = size
    n = len(schedule)
    base = np.array([PALETTE[c] for c in schedule], dtype=np.float32)  # (N, 3)
    frames = np.broadcast_to(base[:, None, None, :], (n, h, w, 3)).copy()  # (N, H, W, 3)
    frames += rng.normal(0.0, 6.0, size=frames.shape).astype(np.float32)
    # A small gray square drifting across the frame, so that frames differ in more than colour.
    side = max(2, min(w, h) // 6)
    x0, y0 = rng.integers(0, w - side), rng.integers(0, h - side)
    vx, vy = rng.choice([-2, -1, 1, 2], size=2)
    for i in range(n):
        x = int((x0 + vx * i) % (w - side))
        y = int((y0 + vy * i) % (h - side))
        frames[i, y : y + side, x : x + side] = 128.0
    return np.clip(frames, 0, 255).astype(np.uint8)


def make_demo_dataset(
    root: Path,
    num_videos: int = 120,
    num_frames: int = 16,
    size: tuple[int, int] = (64, 48),
    seed: int = 0,
    splits: tuple[float, float, float] = (0.6, 0.2, 0.2),
) -> Path:
    """Write the colour-set demo dataset under ``root`` and return its captions CSV.

    Layout: ``root/videos/demo_NNN.mp4`` and ``root/captions.csv`` with columns
    ``video_id, video, caption, split``; ``video`` is relative to the videos
    folder (e.g. ``demo_000.mp4``), so load it with
    ``load_dataset("folder", root / "videos", root / "captions.csv")``.
    ``size`` is (W, H).

    Colour sets: one distinct set per test video (as many as there are val or
    test videos, at most the 84 pairs and triples of the 8-colour palette), each
    set used once in val, once in test and cyclically in train, so every set
    seen at test time was trained on, through different videos and captions.
    Each video has two captions from different templates, each listing its
    colours in its own random order. Deterministic for a given ``seed``.
    """
    root = Path(root)
    if num_videos < 1 or num_frames < 1:
        raise ConfigError(f"num_videos and num_frames must be >= 1, got {num_videos}, {num_frames}")
    w, h = size
    if w % 2 or h % 2 or w < 8 or h < 8:
        raise ConfigError(f"size must be (W, H) with even sides >= 8, got {size}")
    n_train, n_val, n_test = _split_sizes(num_videos, splits)
    rng = np.random.default_rng(seed)

    assignment = _assign_sets(n_train, n_val, n_test, rng)
    video_dir = root / "videos"
    video_dir.mkdir(parents=True, exist_ok=True)
    width = max(3, len(str(num_videos - 1)))
    rows: list[dict[str, str]] = []
    for i, (split, colours) in enumerate(assignment):
        video_id = f"demo_{i:0{width}d}"
        rel = f"{video_id}.mp4"
        schedule = _colour_schedule(colours, num_frames, rng)
        write_video(video_dir / rel, _demo_frames(schedule, (w, h), rng))
        for template in rng.choice(len(_TEMPLATES), size=2, replace=False):
            names = [colours[j] for j in rng.permutation(len(colours))]
            rows.append(
                {
                    "video_id": video_id,
                    "video": rel,
                    "caption": _TEMPLATES[int(template)].format(c=_join_colours(names)),
                    "split": split,
                }
            )
    return _write_captions_csv(root / "captions.csv", rows)


def _assign_sets(n_train: int, n_val: int, n_test: int, rng: np.random.Generator) -> list[tuple[str, tuple]]:
    """(split, colour set) of every demo video, shuffled so that ids give neither away."""
    num_sets = max(1, min(max(n_val, n_test), n_train, 84))
    sets = _colour_sets(num_sets, rng)
    assignment = (
        [("train", sets[i % num_sets]) for i in range(n_train)]
        + [("val", sets[i % num_sets]) for i in range(n_val)]
        + [("test", sets[i % num_sets]) for i in range(n_test)]
    )
    return [assignment[i] for i in rng.permutation(len(assignment))]


def _write_captions_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=["video_id", "video", "caption", "split"])
        writer.writeheader()
        writer.writerows(rows)
    return path
