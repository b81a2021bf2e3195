"""decord's seeking reader, kept for users who ask for it by name (``decode_backend=decord``).

decord maps a frame index to a timestamp through the container's index and
seeks there. That is right for clean MP4/MOV and Matroska/WebM files and wrong
for AVI, where packets carry no presentation timestamps (B-frame MPEG-4 /
XVID comes back shuffled: decord issues 195, 252, 365), and for streams with a
damaged packet (the index counts the packet, the decoder emits no frame, and
every later index is off). It also cannot rotate and resize at once (rotated
files come back squeezed or fail to copy). So files in other containers and
rotated files are decoded by PyAV even under this backend; damaged streams are
not detectable up front, which is why PyAV is the default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from ..core.errors import VideoDecodeError
from .pyav_decoder import StreamInfo, shortfall_warning
from .sampling import gather_slots, resized_shape, sample_frame_indices
from .types import DecodedVideo

_quieted = False


def _quiet(decord) -> None:
    """decord prints FFmpeg's own complaints (``ERROR opening``...) that dab reports itself."""
    global _quieted
    if not _quieted:
        decord.logging.set_level(decord.logging.QUIET)
        _quieted = True


def decord_can_decode(info: StreamInfo, rotation: int) -> bool:
    """Whether decord's frames are trustworthy for a file with this header and rotation."""
    return info.timestamped and rotation == 0


def decode_decord(path: Path, num_frames: int, short_side: Optional[int], info: StreamInfo) -> DecodedVideo:
    import decord  # ImportError is handled by the caller (PyAV instead)

    _quiet(decord)
    size_kwargs: dict[str, int] = {}
    if short_side is not None and info.width > 0 and info.height > 0:
        new_w, new_h = resized_shape(info.width, info.height, short_side)
        if (new_w, new_h) != (info.width, info.height):
            size_kwargs = {"width": new_w, "height": new_h}
    try:
        reader = decord.VideoReader(str(path), num_threads=1, **size_kwargs)
        n = len(reader)
    except Exception as exc:  # noqa: BLE001 - decord raises bare RuntimeErrors/DECORDErrors
        raise VideoDecodeError(f"cannot open ({str(exc).strip().splitlines()[-1][:200]})") from None
    if n <= 0:
        raise VideoDecodeError("video has no frames")
    indices, mask = sample_frame_indices(n, num_frames)
    unique = np.unique(indices)  # (U,) sorted
    try:
        decoded = reader.get_batch(unique.tolist()).asnumpy()  # (U, H, W, 3)
    except Exception as exc:  # noqa: BLE001
        raise VideoDecodeError(
            f"cannot read frames {unique.tolist()} of {n} ({str(exc).strip().splitlines()[-1][:200]})"
        ) from None
    finally:
        del reader
    if decoded.ndim != 4 or decoded.shape[0] != len(unique) or decoded.shape[-1] != 3:
        raise VideoDecodeError(f"unexpected frame batch shape {decoded.shape}")
    if short_side is not None and not size_kwargs and min(decoded.shape[1:3]) != short_side:
        decoded = _resize(decoded, short_side)
    warning = shortfall_warning(n, info, None)
    return DecodedVideo(
        gather_slots(unique, decoded.astype(np.uint8, copy=False), indices),
        mask,
        indices,
        int(n),
        backend="decord",
        warnings=(warning,) if warning else (),
    )


def _resize(frames: np.ndarray, short_side: int) -> np.ndarray:
    from PIL import Image

    h, w = frames.shape[1:3]
    new_w, new_h = resized_shape(w, h, short_side)
    return np.stack([np.asarray(Image.fromarray(f).resize((new_w, new_h), Image.BICUBIC)) for f in frames])
