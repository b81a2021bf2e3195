"""score_all: one call of a throwaway :class:`~dab_pipeline.scoring.scorer.Scorer` (validation, evaluation,
scripts); what scores many calls on one model keeps a Scorer instead."""

from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ..core.deprecation import renamed_keywords
from ..core.events import ProgressCallback
from ..model import DABModel
from ..runtime.devices import resolve_device
from .result import ScoreResult
from .scorer import Scorer

__all__ = ["score_all"]

_KEPT = "scorer"  # the key of the Scorer a deprecated ``engines=`` dict keeps


@renamed_keywords(topk="k")
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
    engines: Optional[dict] = None,
) -> ScoreResult:
    """Score every text against every video with the fast engine (same function as the reference).

    ``Scorer(model, device=, dtype=, memory_budget=, text_chunk=, video_chunk=).score(text, frames, mask,
    gt=, k=, progress=, shortlist=)`` in one call: see :class:`~dab_pipeline.scoring.Scorer` for every
    option. text (Q, D), frames (V, F, D), mask (V, F) bool -> ScoreResult, cost (Q, V).

    ``engines`` (deprecated): a dict the caller kept between calls on one unchanging model so that engines
    were built once; it now keeps a Scorer, and a DeprecationWarning says to keep the Scorer itself.
    """
    options = dict(
        device=device, dtype=dtype, memory_budget=memory_budget, text_chunk=text_chunk, video_chunk=video_chunk
    )
    scorer = Scorer(model, **options) if engines is None else _kept_scorer(engines, model, options)
    return scorer.score(text, frames, mask, gt=gt, k=k, progress=progress, shortlist=shortlist)


def _kept_scorer(engines: dict, model: DABModel, options: dict) -> Scorer:
    """The Scorer an ``engines=`` dict keeps for this model and these options (a new one otherwise)."""
    warnings.warn(
        "score_all(engines=) is deprecated: keep a dab_pipeline.scoring.Scorer(model, ...) and call its "
        "score() (it keeps its engines); engines= will be removed in a later release",
        DeprecationWarning,
        stacklevel=3,
    )
    kept = engines.get(_KEPT)
    same = (
        isinstance(kept, Scorer)
        and kept.model is model
        and (kept.device, kept.dtype, kept.memory_budget, kept.text_chunk, kept.video_chunk)
        == (
            resolve_device(options["device"]),
            options["dtype"],
            options["memory_budget"],
            options["text_chunk"],
            options["video_chunk"],
        )
    )
    if not same:
        kept = engines[_KEPT] = Scorer(model, **options)
    return kept
