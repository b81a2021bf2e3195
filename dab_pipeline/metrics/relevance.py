"""Retrieval against every relevant video: AP, nDCG@k and P@1 per query, when a query can be true of many videos.

R@K against one annotated video cannot reward a model for the one-to-many ambiguity DAB's
uncertainty is meant to model: for a generic query true of m videos no model beats 1/m.
Where the relevant videos are known (the procedural world's claims), these score the whole
ranking against all of them.

``cost (Q, V)`` is lower-is-better as everywhere in dab; ``relevant (Q, V)`` is bool. Ties
are broken **pessimistically**, as the rank metrics do: among videos of equal cost the
irrelevant ones come first. Every function returns per-query arrays, so callers can average,
group by caption level, or bootstrap over queries (:mod:`.stats`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import ConfigError
from .retrieval import as_cost


def _as_relevant(relevant: Any, shape: tuple[int, int]) -> np.ndarray:
    rel = np.asarray(relevant)
    if rel.shape != shape:
        raise ConfigError(f"relevant must have the cost's shape {shape}, got {rel.shape}")
    rel = rel.astype(bool)
    if not rel.any(axis=1).all():
        raise ConfigError(f"{int((~rel.any(axis=1)).sum())} queries have no relevant video")
    return rel


def ranked_relevance(cost: Any, relevant: Any) -> np.ndarray:
    """Each query's relevance in ranked order (Q, V) bool: best cost first, ties pessimistic."""
    c = as_cost(cost)
    rel = _as_relevant(relevant, c.shape)
    # lexsort: by cost, then irrelevant (0) before relevant (1) among equal costs
    order = np.lexsort((rel.astype(np.int8), c), axis=1)  # (Q, V)
    return np.take_along_axis(rel, order, axis=1)


def relevance_metrics(cost: Any, relevant: Any, k: int = 10) -> dict[str, np.ndarray]:
    """Per-query ``AP`` (average precision over the whole ranking), ``nDCG@k`` (binary gains,
    ``1 / log2(rank + 1)`` discount, normalised by the ideal ranking's) and ``P@1`` (is the best
    video relevant), each (Q,) in [0, 1]; and ``relevant`` (Q,), the number of relevant videos."""
    ranked = ranked_relevance(cost, relevant)  # (Q, V)
    n_q, n_v = ranked.shape
    if not 1 <= k:
        raise ConfigError(f"k must be >= 1, got {k}")
    hits = np.cumsum(ranked, axis=1)  # (Q, V) relevant videos among the first r
    ranks = np.arange(1, n_v + 1)  # (V,)
    n_rel = hits[:, -1].astype(np.float64)  # (Q,)
    ap = (ranked * hits / ranks).sum(axis=1) / n_rel  # (Q,)
    kk = min(k, n_v)
    disc = 1.0 / np.log2(np.arange(2, kk + 2))  # (k,)
    dcg = (ranked[:, :kk] * disc).sum(axis=1)
    ideal = np.cumsum(disc)[np.minimum(n_rel.astype(np.int64), kk) - 1]  # (Q,)
    return {"AP": ap, f"nDCG@{k}": dcg / ideal, "P@1": ranked[:, 0].astype(np.float64), "relevant": n_rel}
