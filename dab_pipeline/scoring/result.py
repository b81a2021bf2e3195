"""What every scorer shares: the result type, the dtypes it offers, and its input checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..model import DABModel

SCORE_DTYPES = ("float32", "bfloat16")


MiB = 1 << 20


GiB = 1 << 30


@dataclass
class ScoreResult:
    """Costs of every (query, video) pair plus optional ground-truth diagnostics and top-k."""

    cost: np.ndarray  # (Q, V) float32, lower is better (+inf: not scored, shortlist mode)
    text_var: Optional[np.ndarray] = None  # (Q,) mean sigma^2 of the text Gaussian
    bridged_var: Optional[np.ndarray] = None  # (Q,) ... of the bridged text for (q, gt[q])
    video_var: Optional[np.ndarray] = None  # (Q,) ... of the video Gaussian for (q, gt[q])
    topk_indices: Optional[np.ndarray] = None  # (Q, k) int64, each query's best videos, best first
    topk_costs: Optional[np.ndarray] = None  # (Q, k) float32, their costs
    shortlist: Optional[int] = None  # K of shortlist mode (None: every pair scored exactly)
    info: dict = field(default_factory=dict)  # engine plan: dtype, blocks, budget (for benchmarks / logs)


def as_tensor(x: np.ndarray | Tensor) -> Tensor:
    if isinstance(x, Tensor):
        return x
    a = np.asarray(x)
    # torch warns on (and must not write through) read-only arrays such as memory maps
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def prepare_inputs(
    model: DABModel, text, frames, mask, gt, text_chunk: Optional[int], video_chunk: Optional[int]
) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """Inputs as float32 / bool / long tensors, checked against the model: text (Q, D), frames (V, F, D), mask (V, F), gt (Q,)."""
    text_t = as_tensor(text).to(torch.float32)
    frames_t = as_tensor(frames).to(torch.float32)
    mask_t = as_tensor(mask).to(torch.bool)
    gt_t = None if gt is None else as_tensor(gt).to(torch.long)
    _check_inputs(model, text_t, frames_t, mask_t, text_chunk, video_chunk, gt_t)
    return text_t, frames_t, mask_t, gt_t


def _check_inputs(
    model: DABModel,
    text: Tensor,
    frames: Tensor,
    mask: Tensor,
    text_chunk: Optional[int],
    video_chunk: Optional[int],
    gt: Optional[Tensor],
) -> None:
    d = model.cfg.embed_dim
    if text.dim() == 2 and text.shape[0] == 0:
        raise ConfigError("no queries to score: text is (0, D)")
    if frames.dim() == 3 and frames.shape[0] == 0:
        raise ConfigError("no videos to score: frames is (0, F, D)")
    if text.dim() != 2 or text.shape[1] != d:
        raise ConfigError(f"text must be (Q, {d}), got {tuple(text.shape)}")
    if frames.dim() != 3 or frames.shape[2] != d:
        raise ConfigError(f"frames must be (V, F, {d}), got {tuple(frames.shape)}")
    if tuple(mask.shape) != tuple(frames.shape[:2]):
        raise ConfigError(f"mask must be {tuple(frames.shape[:2])}, got {tuple(mask.shape)}")
    if (text_chunk is not None and text_chunk < 1) or (video_chunk is not None and video_chunk < 1):
        raise ConfigError(f"chunk sizes must be positive, got text_chunk={text_chunk}, video_chunk={video_chunk}")
    if gt is not None:
        if tuple(gt.shape) != (text.shape[0],):
            raise ConfigError(f"gt must be ({text.shape[0]},), got {tuple(gt.shape)}")
        if len(gt) and (int(gt.min()) < 0 or int(gt.max()) >= frames.shape[0]):
            raise ConfigError(
                f"gt indexes videos 0..{frames.shape[0] - 1}, got values in [{int(gt.min())}, {int(gt.max())}]"
            )
