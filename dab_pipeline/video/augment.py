"""Augmented training views for `dab extract --train-views N`: X-Pool's train transform, seeded.

X-Pool trains on ``RandomResizedCrop(S, scale=(0.5, 1.0))`` and ``RandomHorizontalFlip()``
applied to a whole clip at once (one crop and one flip for all its frames), then CLIP's
normalisation. Here the crop and the flip of view ``j`` of a video are drawn from a generator
seeded by the video's id and ``j`` only, so a rerun, a resume or another worker layout gives the
same pixels; the crop is taken from the decoded frames (decoded at CLIP's size by default,
``--decode-short-side`` for more) and resized bicubically to S x S.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import numpy as np
import torch

__all__ = ["VIEW_TRANSFORM", "crop_params", "view_seed", "augmented_views"]

SCALE = (0.5, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
VIEW_TRANSFORM = (
    "X-Pool's train transform: RandomResizedCrop(S, scale=(0.5, 1.0), ratio=(3/4, 4/3)) + "
    "RandomHorizontalFlip(0.5), one draw per clip, seeded by (video id, view); bicubic resize; "
    "CLIP's mean/std"
)


def view_seed(video_id: str, view: int) -> int:
    """A 63-bit seed from the video's id and the view index (stable across runs and machines)."""
    digest = hashlib.sha256(f"{video_id}\0{view}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def crop_params(h: int, w: int, gen: torch.Generator) -> tuple[int, int, int, int, bool]:
    """(top, left, height, width, flip) of one RandomResizedCrop + flip draw, torchvision's algorithm."""
    area = h * w
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    crop = None
    for _ in range(10):
        target = area * (SCALE[0] + (SCALE[1] - SCALE[0]) * float(torch.rand(1, generator=gen)))
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * float(torch.rand(1, generator=gen)))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            top = int(torch.randint(0, h - ch + 1, (1,), generator=gen))
            left = int(torch.randint(0, w - cw + 1, (1,), generator=gen))
            crop = (top, left, ch, cw)
            break
    if crop is None:  # torchvision's fallback: the central crop within the ratio bounds
        in_ratio = w / h
        if in_ratio < RATIO[0]:
            cw, ch = w, int(round(w / RATIO[0]))
        elif in_ratio > RATIO[1]:
            ch, cw = h, int(round(h * RATIO[1]))
        else:
            cw, ch = w, h
        crop = ((h - ch) // 2, (w - cw) // 2, ch, cw)
    flip = bool(torch.rand(1, generator=gen) < 0.5)
    return (*crop, flip)


def augmented_views(
    frames: Sequence[np.ndarray], video_id: str, views: int, size: int, mean: Sequence[float], std: Sequence[float]
) -> torch.Tensor:
    """``views`` augmented copies of a clip -> (N, F, 3, S, S) float32, normalised like CLIP's input.

    frames: F decoded frames (H, W, 3) uint8, all the same size.
    """
    from PIL import Image

    h, w = frames[0].shape[:2]
    m = torch.tensor(list(mean), dtype=torch.float32)[:, None, None]  # (3, 1, 1)
    s = torch.tensor(list(std), dtype=torch.float32)[:, None, None]
    out = torch.empty(views, len(frames), 3, size, size)  # (N, F, 3, S, S)
    for j in range(views):
        top, left, ch, cw, flip = crop_params(h, w, torch.Generator().manual_seed(view_seed(video_id, j)))
        for i, f in enumerate(frames):
            img = Image.fromarray(f).crop((left, top, left + cw, top + ch)).resize((size, size), Image.BICUBIC)
            if flip:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)  # (3, S, S)
            out[j, i] = (x - m) / s
    return out
