"""Which frames to take (X-Pool's segment midpoints) and at what size."""

from __future__ import annotations

import numpy as np

from ..core.errors import ConfigError, VideoDecodeError


def sample_frame_indices(num_video_frames: int, num_frames: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the ``num_frames`` frames to read from a video of ``num_video_frames``.

    X-Pool's ``uniform`` rule: ``[0, n)`` is cut into ``k = min(F, n)`` segments at
    ``np.linspace(0, n, k + 1).astype(int)`` and the midpoint
    ``(start + end_inclusive) // 2`` of each is taken. Returns
    ``(indices (F,) int64, mask (F,) bool)``: for ``n >= F`` every index is distinct
    and ``mask`` is all True; for ``n < F`` the indices are ``0..n-1`` followed by
    ``n-1`` repeated (X-Pool clones the last frame too) and ``mask`` marks the first
    ``n`` slots as real.
    """
    if num_frames < 1:
        raise ConfigError(f"num_frames must be >= 1, got {num_frames}")
    n = int(num_video_frames)
    if n <= 0:
        raise VideoDecodeError(f"video has no frames (frame count {num_video_frames})")
    k = min(num_frames, n)
    bounds = np.linspace(0, n, k + 1).astype(np.int64)  # (k+1,)
    starts, ends = bounds[:-1], bounds[1:] - 1  # inclusive segment ends, as X-Pool
    real = (starts + ends) // 2  # (k,)
    indices = np.empty(num_frames, dtype=np.int64)  # (F,)
    indices[:k] = real
    indices[k:] = real[-1]
    mask = np.zeros(num_frames, dtype=bool)  # (F,)
    mask[:k] = True
    return indices, mask


def resized_shape(width: int, height: int, short_side: int) -> tuple[int, int]:
    """(width, height) after scaling so the shorter side is ``short_side``, aspect kept."""
    if short_side < 1:
        raise ConfigError(f"short_side must be >= 1, got {short_side}")
    if width <= height:
        return short_side, max(1, round(height * short_side / width))
    return max(1, round(width * short_side / height)), short_side


def gather_slots(unique: np.ndarray, decoded: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """(F, H, W, 3) frames of the slots from one decoded frame per unique index (repeats reuse it)."""
    pos = np.searchsorted(unique, indices)  # (F,)
    return np.ascontiguousarray(decoded[pos])
