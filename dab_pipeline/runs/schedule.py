"""What each epoch of a run visits and its learning-rate schedule: pure functions of (seed, epoch), so a resumed
run replays them exactly, and shared by `dab train` and `dab distill` (a student counts its updates like its teacher)."""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["epoch_order", "epoch_length", "epoch_views", "lr_lambda"]


def epoch_order(caption_video: np.ndarray, mode: str, seed: int, epoch: int) -> torch.Tensor:
    """The training captions of one epoch, in order; a pure function of (seed, epoch).

    "captions": a permutation of every caption. "videos": one caption per video,
    uniformly at random, the videos in random order (the first caption of each
    video in a random permutation of all captions gives both at once).
    """
    gen = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(len(caption_video), generator=gen)  # (Q,)
    if mode == "captions":
        return perm
    _, first = np.unique(np.asarray(caption_video)[perm.numpy()], return_index=True)
    return perm[np.sort(first)]  # (V,)


def epoch_length(caption_video: np.ndarray, mode: str) -> int:
    return len(caption_video) if mode == "captions" else len(np.unique(np.asarray(caption_video)))


def lr_lambda(total_updates: int, warmup_ratio: float):
    """Linear warm-up over ``warmup_ratio`` of the ``total_updates`` optimiser updates, then cosine decay to zero."""
    warmup = int(round(total_updates * warmup_ratio))

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_updates - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def epoch_views(num_videos: int, num_views: int, seed: int, epoch: int) -> torch.Tensor:
    """The augmented view (0..N-1) each training video uses in ``epoch``; a pure function of (seed, epoch)."""
    gen = torch.Generator().manual_seed(seed * 1000 + epoch + 500_000_000)  # apart from epoch_order's stream
    return torch.randint(0, num_views, (num_videos,), generator=gen)  # (V,)
