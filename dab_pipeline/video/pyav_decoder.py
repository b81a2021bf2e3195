"""Decoding with PyAV (FFmpeg): the frames FFmpeg outputs, in display order, counted from 0.

Frame ``i`` of a video is the ``i``-th frame the decoder outputs when the file is
read from the start. That is what a sequential read with FFmpeg, OpenCV or
PyAV returns, and it is the only definition that holds for every container:
AVI stores no presentation timestamps (B-frame streams come out of the demuxer
in decode order), and a damaged packet can make the decoder emit one frame
fewer than the container's index lists. Two ways to get there:

* :func:`decode_sequential` reads the file once, converting only the sampled
  frames. The sampled indices depend on the frame count, which is known only at
  the end; the container's declared count is used as a guess, and when the real
  count differs (damage, truncation, a header without a count) a second pass
  converts the right frames. Measured on real clips it is as fast as decord's
  seeking reader (docs/extraction.md), because decord decodes the same frames.
* :func:`decode_seeking` seeks to the key frame before each sampled frame, for
  long files in containers that carry presentation timestamps (MP4/MOV,
  Matroska/WebM). It maps index ``i`` to the ``i``-th smallest packet
  timestamp and checks that the decoder returns exactly that timestamp; on any
  doubt (counts that disagree, a frame that does not come out) it returns None
  and the caller reads the file sequentially.

Rotation metadata (a display matrix, as phones write) is applied the way
FFmpeg's own autorotation does, after resizing, so portrait video stays portrait.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from ..core.errors import VideoDecodeError
from .sampling import gather_slots, resized_shape, sample_frame_indices
from .types import DecodedVideo

# FFmpeg demuxer names (container.format.name is a comma-separated list of aliases)
# whose packets carry presentation timestamps that seeking can rely on.
TIMESTAMPED_FORMATS = frozenset({"mov", "mp4", "matroska", "webm"})

# A count that falls short of the header's by more than this is reported (truncated or
# variable-frame-rate files); a frame or two is ordinary (a dropped damaged packet).
SHORTFALL_FRAMES = 2
SHORTFALL_FRACTION = 0.02


@dataclass(frozen=True)
class StreamInfo:
    """What the container header says about the first video stream (nothing decoded)."""

    container: str  # FFmpeg demuxer name, e.g. "avi" or "mov,mp4,m4a,3gp,3g2,mj2"
    codec: str
    width: int  # coded size, before rotation
    height: int
    header_frames: int  # frame count the container declares; 0 when it declares none
    duration: Optional[float]  # seconds
    rate: Optional[float]  # average frames per second

    @property
    def timestamped(self) -> bool:
        return bool(TIMESTAMPED_FORMATS & set(self.container.split(",")))

    @property
    def expected_frames(self) -> int:
        """The declared count, else duration x rate, else 0."""
        if self.header_frames > 0:
            return self.header_frames
        if self.duration and self.rate:
            return int(round(self.duration * self.rate))
        return 0


def _import_av():
    try:
        import av
    except ImportError as exc:
        raise VideoDecodeError(f"PyAV not importable ({exc})") from None
    return av


@contextlib.contextmanager
def open_video(path: Path, threads: int = 1) -> Iterator[tuple[object, object, StreamInfo]]:
    """(container, first video stream, its header info); every failure is a VideoDecodeError.

    ``threads``: FFmpeg's decoding threads; 1 by default because parallelism comes
    from the extraction's worker processes (two one-thread decoders beat one
    two-thread decoder on 2 cores: benchmarks/extract.py).
    """
    av = _import_av()
    try:
        container = av.open(str(path))
    except Exception as exc:  # noqa: BLE001 - av raises many FFmpegError subclasses
        reason = getattr(exc, "strerror", None) or str(exc)  # FFmpeg's words, without the path again
        raise VideoDecodeError(f"cannot open ({reason}; not a video FFmpeg can read, or damaged)") from None
    try:
        if not container.streams.video:
            raise VideoDecodeError("no video stream")
        stream = container.streams.video[0]
        stream.codec_context.thread_count = threads
        yield container, stream, _stream_info(container, stream)
    finally:
        container.close()


def _stream_info(container, stream) -> StreamInfo:
    duration = None
    if stream.duration is not None and stream.time_base is not None:
        duration = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        duration = container.duration / 1_000_000  # AV_TIME_BASE
    rate = float(stream.average_rate) if stream.average_rate else None
    cc = stream.codec_context
    return StreamInfo(
        container=container.format.name,
        codec=cc.name,
        width=int(cc.width or 0),
        height=int(cc.height or 0),
        header_frames=int(stream.frames or 0),
        duration=duration if duration and duration > 0 else None,
        rate=rate,
    )


def probe_video(path: Path) -> tuple[StreamInfo, int]:
    """Header info and the display rotation (degrees, counter-clockwise), decoding one frame."""
    with open_video(path) as (container, stream, info):
        rotation = 0
        for packet in _packets(container, stream, []):
            frames = _decode_packet(packet, [0])
            if frames:
                rotation = frame_rotation(frames[0])
                break
    return info, rotation


def frame_rotation(frame) -> int:
    """The frame's display-matrix rotation, counter-clockwise, as 0, 90, 180 or 270."""
    angle = getattr(frame, "rotation", 0) or 0
    return int(round(float(angle) / 90.0)) * 90 % 360


def to_rgb(frame, short_side: Optional[int]) -> np.ndarray:
    """(H, W, 3) uint8 RGB as displayed: resized so the displayed short side is ``short_side``, rotated."""
    rotation = frame_rotation(frame)
    quarter = rotation in (90, 270)
    if short_side is None:
        rgb = frame.to_ndarray(format="rgb24")  # (h, w, 3)
    else:
        disp_w, disp_h = (frame.height, frame.width) if quarter else (frame.width, frame.height)
        new_w, new_h = resized_shape(disp_w, disp_h, short_side)  # displayed size
        raw_w, raw_h = (new_h, new_w) if quarter else (new_w, new_h)  # the same, before rotation
        if (raw_w, raw_h) == (frame.width, frame.height):
            rgb = frame.to_ndarray(format="rgb24")
        else:
            rgb = frame.to_ndarray(format="rgb24", width=raw_w, height=raw_h, interpolation="BICUBIC")
    if rotation:
        # FFmpeg's autorotation: a counter-clockwise display rotation turns the picture that way.
        rgb = np.rot90(rgb, k=rotation // 90)
    return np.ascontiguousarray(rgb)


def _packets(container, stream, notes: list[str]) -> Iterator[object]:
    """The stream's packets, then a flush packet; a container error ends the file early, with a note."""
    av = _import_av()
    it = container.demux(stream)
    while True:
        try:
            packet = next(it)
        except StopIteration:
            return
        except av.FFmpegError as exc:
            notes.append(f"reading stopped early ({type(exc).__name__}: {exc})")
            yield None  # flush the decoder's delayed frames
            return
        yield packet


def _decode_packet(packet, damaged: list[int]) -> list:
    """Frames of one packet (None flushes); a packet the decoder rejects is skipped and counted."""
    av = _import_av()
    try:
        if packet is None:
            return []
        return list(packet.decode())
    except av.FFmpegError:
        damaged[0] += 1
        return []


def _flush(stream) -> list:
    av = _import_av()
    try:
        return list(stream.codec_context.decode(None))
    except av.FFmpegError:
        return []


def _read(path: Path, wanted: set[int], short_side: Optional[int], threads: int = 1):
    """One sequential pass: (frame count, {index: rgb} for ``wanted``, info, last frame time, notes)."""
    notes: list[str] = []
    damaged = [0]
    kept: dict[int, np.ndarray] = {}
    n, last_time = 0, None
    with open_video(path, threads) as (container, stream, info):
        for packet in _packets(container, stream, notes):
            frames = _decode_packet(packet, damaged) if packet is not None else _flush(stream)
            for frame in frames:
                if n in wanted:
                    kept[n] = to_rgb(frame, short_side)
                if frame.time is not None:
                    last_time = float(frame.time)
                n += 1
    if damaged[0]:
        notes.append(f"{damaged[0]} damaged packet(s) skipped by the decoder")
    return n, kept, info, last_time, notes


def decode_sequential(path: Path, num_frames: int, short_side: Optional[int], threads: int = 1) -> DecodedVideo:
    """The sampled frames of a sequential read (see the module docstring)."""
    with open_video(path) as (_, _, info):
        guess = info.expected_frames
    wanted = set(np.unique(sample_frame_indices(guess, num_frames)[0]).tolist()) if guess > 0 else set()
    n, kept, info, last_time, notes = _read(path, wanted, short_side, threads)
    if n == 0:
        raise VideoDecodeError("no decodable frames" + (f" ({'; '.join(notes)})" if notes else ""))
    indices, mask = sample_frame_indices(n, num_frames)
    unique = np.unique(indices)  # (U,) sorted
    if not set(unique.tolist()) <= kept.keys():
        # The declared count was wrong: read again, converting the frames the real count samples.
        n2, kept, _, _, _ = _read(path, set(unique.tolist()), short_side, threads)
        if n2 != n:
            raise VideoDecodeError(f"two reads of the file gave {n} and {n2} frames")
    decoded = np.stack([kept[i] for i in unique.tolist()])  # (U, H, W, 3)
    warning = shortfall_warning(n, info, last_time)
    if warning:
        notes.append(warning)
    return DecodedVideo(gather_slots(unique, decoded, indices), mask, indices, n, backend="pyav", warnings=tuple(notes))


def shortfall_warning(n: int, info: StreamInfo, last_time: Optional[float]) -> Optional[str]:
    """A line when the decodable frames fall well short of what the header announces."""
    expected = info.expected_frames
    if expected <= 0 or expected - n <= max(SHORTFALL_FRAMES, SHORTFALL_FRACTION * expected):
        return None
    what = "declares" if info.header_frames > 0 else "implies (duration x frame rate)"
    msg = f"decoded {n} frames where the header {what} {expected}"
    # The declared count at the declared rate is the nominal length: a truncated AVI's duration
    # field is re-estimated from the bytes that are left, its frame count is not.
    nominal = info.header_frames / info.rate if info.header_frames and info.rate else info.duration
    if nominal and last_time is not None:
        if last_time >= nominal - max(1.0, 0.05 * nominal):
            return msg + (
                f"; they span the whole {nominal:.1f} s, so the file holds fewer frames than its "
                "nominal rate (variable frame rate): frames are sampled over the decoded ones"
            )
        return msg + f"; the frames end at {last_time:.1f} s of {nominal:.1f} s: the file looks truncated"
    return msg + ": the file may be truncated"


def decode_seeking(path: Path, num_frames: int, short_side: Optional[int]) -> Optional[DecodedVideo]:
    """The sampled frames by key-frame seeking, or None when that cannot be trusted for this file."""
    av = _import_av()
    with open_video(path) as (container, stream, info):
        try:
            pts, keys = _timestamps(container, stream)
        except av.FFmpegError:
            return None
        n = len(pts)
        if n == 0 or (info.header_frames and n != info.header_frames) or len(set(pts)) != n or not keys:
            return None
        indices, mask = sample_frame_indices(n, num_frames)
        unique = np.unique(indices)  # (U,) sorted
        try:
            kept = _seek_frames(container, stream, [pts[i] for i in unique.tolist()], keys, short_side)
        except av.FFmpegError:
            return None
    if kept is None:
        return None
    decoded = np.stack(kept)  # (U, H, W, 3)
    return DecodedVideo(gather_slots(unique, decoded, indices), mask, indices, n, backend="pyav-seek")


def _timestamps(container, stream) -> tuple[list[int], list[int]]:
    """Sorted presentation timestamps of every packet and of the key-frame packets (demuxing only)."""
    pts, keys = [], []
    for packet in container.demux(stream):
        if packet.size == 0 or packet.pts is None:
            continue
        pts.append(int(packet.pts))
        if packet.is_keyframe:
            keys.append(int(packet.pts))
    return sorted(pts), sorted(keys)


def _seek_frames(
    container, stream, targets: list[int], keys: list[int], short_side: Optional[int]
) -> Optional[list[np.ndarray]]:
    """The frames with exactly these timestamps (ascending), or None if one does not come out."""
    import bisect

    out: list[np.ndarray] = []
    frames = None
    position = None  # timestamp of the last frame decoded since the last seek
    for target in targets:
        k = bisect.bisect_right(keys, target) - 1
        if k < 0:
            return None
        if frames is None or position is None or keys[k] > position:
            # Seeking pays: the key frame before the target lies beyond what is decoded.
            container.seek(keys[k], stream=stream, backward=True, any_frame=False)
            frames = container.decode(stream)
            position = None
        for frame in frames:
            if frame.pts is None:
                return None
            position = int(frame.pts)
            if position < target:
                continue
            if position > target:
                return None  # the target frame was not output (open GOP, damage): not exact
            out.append(to_rgb(frame, short_side))
            break
        else:
            return None
    return out
