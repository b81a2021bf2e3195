"""score_all: one call of a throwaway :class:`~dab_pipeline.scoring.scorer.Scorer` (validation, evaluation,
scripts); what scores many calls on one model keeps a Scorer instead."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ..core.events import ProgressCallback
from ..model import DABModel
from .result import ScoreResult
from .scorer import Scorer

__all__ = ["score_all"]


def score_all(
    model: DABModel,
    text: np.ndarray | Tensor,
    frames: np.ndarray | Tensor,
    mask: np.ndarray | Tensor,
    *,
    text_chunk: Optional[int] = None,
    video_chunk: Optional[int] = None,
    device: str | torch.device = "cpu",
    progress: ProgressCallback | None = None,
    gt: np.ndarray | Tensor | None = None,
    k: Optional[int] = None,
    memory_budget: Optional[int] = None,
    dtype: str = "float32",
    shortlist: Optional[int] = None,
) -> ScoreResult:
    """Score every text against every video with the fast engine (same function as the reference).

    ``Scorer(model, device=, dtype=, memory_budget=, text_chunk=, video_chunk=).score(text, frames, mask,
    gt=, k=, progress=, shortlist=)`` in one call: see :class:`~dab_pipeline.scoring.Scorer` for every
    option. text (Q, D), frames (V, F, D), mask (V, F) bool -> ScoreResult, cost (Q, V).
    """
    options = dict(
        device=device, dtype=dtype, memory_budget=memory_budget, text_chunk=text_chunk, video_chunk=video_chunk
    )
    return Scorer(model, **options).score(text, frames, mask, gt=gt, k=k, progress=progress, shortlist=shortlist)
