"""The result of decoding one video."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DecodedVideo:
    frames: np.ndarray  # (F, H, W, 3) uint8 RGB, as displayed (rotation applied)
    mask: np.ndarray  # (F,) bool, True for real (not repeated) frames
    indices: np.ndarray  # (F,) int64, decoded frame index of each slot
    num_video_frames: int
    backend: str = "pyav"  # what produced the frames: "pyav", "pyav-seek" or "decord"
    # Things a user should know that did not stop decoding (truncation, damaged packets).
    warnings: tuple[str, ...] = ()
