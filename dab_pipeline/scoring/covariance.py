"""All-pairs scoring of models whose Gaussians are not diagonal (``model.covariance`` lowrank:R, mixture:K).

The fast engines (``engines/``) score a non-diagonal model only where it has no per-pair bridge (``prob``,
``dab/constant``: ``engines.base.COVARIANCE_ENGINES``); the others (``dab``: a bridge per component and per pair's
U) are refused there and scored here (:func:`needs_reference`), through the model's own path: the reference
(:func:`~dab_pipeline.scoring.reference.score_all_reference`) in blocks sized from the memory budget, and
a shortlist through :func:`~dab_pipeline.scoring.reference.score_query`, one query at a time.  Exact (the
same function as the training costs) and bounded in memory; not fast (no per-video bases, float32 only).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ..core.events import ProgressCallback
from ..model import DABModel
from .budget import default_memory_budget
from .engines.base import engine_covers
from .reference import score_all_reference, score_query
from .result import ScoreResult

__all__ = ["needs_reference", "covariance_chunks", "score_nondiag", "score_shortlist_nondiag"]


def needs_reference(model: DABModel) -> bool:
    """Whether ``model`` is scored here rather than by a fast engine: a non-diagonal covariance with a per-pair
    bridge (``dab``; ``prob`` and ``dab-const`` have engines for every covariance, ``engines.base.engine_covers``)."""
    return not engine_covers(model.cfg)


def covariance_chunks(
    model: DABModel, n_q: int, n_v: int, device: torch.device, memory_budget: Optional[int]
) -> tuple[int, int]:
    """(text_chunk, video_chunk) whose block of pairs fits ``memory_budget`` bytes (the device's default).

    A pair holds a few (D,) tensors (pooled video, mu, logvar, the cost's temporaries, ~12 D floats), the
    video's factor with its products (~3 D R, lowrank:R) or its K bridged components and their KL terms (~6 D K,
    mixture:K), and where the drift runs (dab) each bridge's state and the drift's hidden layers (~5 H + 8 D
    floats, K bridges a pair for a mixture) and the bridged text's own Woodbury factors (~3 D R, lowrank:R): the
    estimate below, in float32.  Measured at D = 512, H = 1024 as the peak resident growth of one block at the
    64 MiB CPU default: 50-63 MiB for prob's forms; dab's were 83-193 MiB before its bridges were counted.
    """
    cfg = model.cfg
    cov = cfg.covariance_spec
    d = cfg.embed_dim
    per_pair = d * (3 * cov.rank + 12 + (6 * cov.components if cov.kind == "mixture" else 0))
    if cfg.runs_drift:
        per_pair += cov.components * (5 * cfg.drift_hidden + 8 * d) + 3 * d * cov.rank
    per_pair *= 4  # float32
    budget = memory_budget if memory_budget is not None else default_memory_budget(device)
    pairs = max(1, budget // per_pair)
    text_chunk = max(1, min(n_q, math.isqrt(pairs)))
    return text_chunk, max(1, min(n_v, pairs // text_chunk))


def score_nondiag(
    model: DABModel,
    text: Tensor,
    frames: Tensor,
    mask: Tensor,
    gt: Optional[Tensor],
    device: torch.device,
    memory_budget: Optional[int],
    progress: ProgressCallback,
) -> ScoreResult:
    """Every pair through the reference, in budget-sized blocks -> ScoreResult (cost (Q, V), diagnostics)."""
    tc, vc = covariance_chunks(model, text.shape[0], frames.shape[0], device, memory_budget)
    result = score_all_reference(
        model, text, frames, mask, text_chunk=tc, video_chunk=vc, device=device, progress=progress, gt=gt
    )
    result.info = {"engine": f"reference ({model.cfg.covariance})", "text_chunk": tc, "video_chunk": vc}
    return result


def score_shortlist_nondiag(
    model: DABModel, text: Tensor, frames: Tensor, mask: Tensor, cand: np.ndarray
) -> np.ndarray:
    """Each query's candidates ``cand`` (Q, K) through the model's own path; +inf elsewhere -> (Q, V)."""
    cost = np.full((text.shape[0], frames.shape[0]), np.inf, dtype=np.float32)
    for q, row in enumerate(cand):
        idx = torch.as_tensor(row, dtype=torch.long)
        cost[q, row] = score_query(model, text[q], frames[idx], mask[idx])
    return cost
