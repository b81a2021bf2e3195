"""What a query's costs say about whether its first hits are right: the features a probability map reads.

From a query's first K0 costs (lower is better, K0 = 20 by default: ``k0``) and nothing else the model has not
already computed:

* ``margin``: the second-best cost minus the best (the paper's top-1/top-2 KL margin);
* ``gap_2`` .. ``gap_{k-1}``: the gaps between the next of the first k costs (k: ``first_k``);
* ``softmax_first``: the softmax of -cost / T *over the first K0 costs* of the best video, T the run's temperature
  (PAC's tau, or one over a cosine run's logit scale): the temperature softmax a user would try first;
* ``softmax_first_k``: that softmax's mass on the first k videos;
* ``log_text_var``: the log of the text Gaussian's mean variance, where the model has one (prob, dab): how
  many videos the caption fits (docs/model.md).

Every feature reads the first K0 costs only, so a search whose shortlist holds the exhaustive search's first K0
videos (an index at K >= K0 with its recall) gives the exhaustive features, hence the same calibrated P(first), at
any K (issue 60): the softmax over every cost used before changed with K for the same query and the same first hit
(0.257 exhaustive, 0.912 at K = 3). A video outside a shortlist (cost +inf) has softmax mass 0 and is never among
the first k. (The features are named ``softmax_*``: ``p_first`` and ``p_first_k`` are the calibrated probabilities
the maps make of them.) ``QueryFeatures.top`` keeps each query's first K0 costs relative to its best, for the maps that
rescale the softmax (temperature scaling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..core.errors import ConfigError
from ..metrics.conformal import cost_softmax

__all__ = [
    "DEFAULT_FIRST_K",
    "DEFAULT_K0",
    "QueryFeatures",
    "feature_names",
    "first_hit_outcomes",
    "query_features",
    "text_variance",
]

DEFAULT_FIRST_K = 5  # the "first k" of P(a match in the first k) and of the cost gaps
DEFAULT_K0 = 20  # the costs every feature reads: a shortlist of K >= K0 gives the exhaustive features


@dataclass(frozen=True)
class QueryFeatures:
    names: tuple[str, ...]
    values: np.ndarray  # (Q, F) float64
    top: Optional[np.ndarray] = None  # (Q, K0) each query's first K0 costs minus its best (+inf: not scored)

    def column(self, name: str) -> np.ndarray:
        return self.values[:, self.names.index(name)]

    def rows(self, idx: np.ndarray) -> "QueryFeatures":
        """The features of the queries ``idx``."""
        return QueryFeatures(self.names, self.values[idx], None if self.top is None else self.top[idx])


def feature_names(first_k: int, with_variance: bool) -> tuple[str, ...]:
    """The features' names, in their column order."""
    gaps = tuple(f"gap_{i}" for i in range(2, first_k))
    return ("margin", *gaps, "softmax_first", "softmax_first_k", *(("log_text_var",) if with_variance else ()))


def _sorted_finite(cost: np.ndarray, k: int) -> np.ndarray:
    """Each row's k smallest costs, ascending (Q, k); a row with fewer than k finite costs repeats its last."""
    c = np.asarray(cost, np.float64)  # (Q, V)
    if c.ndim != 2 or c.shape[1] < 2:
        raise ConfigError(
            f"uncertainty features need a (queries, videos) cost matrix of 2 videos or more, got {c.shape}"
        )
    kk = min(k, c.shape[1])
    part = np.sort(np.partition(c, kk - 1, axis=1)[:, :kk], axis=1)  # (Q, kk)
    if not np.isfinite(part[:, :2]).all():
        raise ConfigError("every query needs at least 2 scored videos (finite costs) for its uncertainty features")
    part = np.where(np.isfinite(part), part, np.nan)
    part = np.fmax.accumulate(part, axis=1)  # a missing cost repeats the last finite one: its gap is 0
    if kk < k:
        part = np.concatenate([part, np.repeat(part[:, -1:], k - kk, axis=1)], axis=1)
    return part


def query_features(
    cost: np.ndarray,
    temperature: float,
    first_k: int = DEFAULT_FIRST_K,
    text_var: Optional[np.ndarray] = None,
    k0: int = DEFAULT_K0,
) -> QueryFeatures:
    """The features of each query (rows of ``cost`` (Q, V)) from its first ``k0`` costs; ``text_var`` (Q,) > 0 or
    None."""
    k = first_k
    if k < 2:
        raise ConfigError(f"first_k must be at least 2, got {k}")
    if k0 < k:
        raise ConfigError(f"k0 (the costs the features read) must be at least first_k={k}, got {k0}")
    first = _sorted_finite(cost, k)  # (Q, k)
    gaps = np.diff(first, axis=1)  # (Q, k - 1): margin, gap_2, ...
    top = first_costs(cost, k0)  # (Q, K0) relative to the best, +inf where not scored
    p = cost_softmax(top, temperature)  # (Q, K0), sorted best first
    mass = np.minimum(p[:, :k].sum(axis=1, keepdims=True), 1.0)  # (Q, 1): a sum may round past 1
    cols = [gaps, p[:, :1], mass]
    if text_var is not None:
        v = np.asarray(text_var, np.float64).reshape(-1, 1)  # (Q, 1)
        if len(v) != len(first) or not (np.isfinite(v).all() and (v > 0).all()):
            raise ConfigError("text_var must hold one finite positive variance a query")
        cols.append(np.log(v))
    return QueryFeatures(feature_names(k, text_var is not None), np.concatenate(cols, axis=1), top)


def first_costs(cost: np.ndarray, k0: int) -> np.ndarray:
    """Each row's ``k0`` smallest costs minus its smallest, ascending (Q, K0); +inf where a row scored fewer."""
    c = np.where(np.isfinite(np.asarray(cost, np.float64)), np.asarray(cost, np.float64), np.inf)  # (Q, V)
    kk = min(k0, c.shape[1])
    part = np.sort(np.partition(c, kk - 1, axis=1)[:, :kk], axis=1)  # (Q, kk)
    if kk < k0:
        part = np.concatenate([part, np.full((len(c), k0 - kk), np.inf)], axis=1)
    return part - part[:, :1]


def first_hit_outcomes(
    cost: np.ndarray, gt: np.ndarray, first_k: int = DEFAULT_FIRST_K
) -> tuple[np.ndarray, np.ndarray]:
    """(whether each query's best video is its match, whether a match is among its first ``first_k``) -> two (Q,)
    bool.

    ``gt`` (Q,): each query's matching video (column of ``cost``). A tie with the match counts the match
    ranked after the tied videos (no credit for a tie)."""
    c = np.asarray(cost, np.float64)
    g = np.asarray(gt, np.int64).ravel()
    if len(g) != len(c):
        raise ConfigError(f"{len(g)} ground-truth videos for {len(c)} queries")
    own = c[np.arange(len(c)), g]  # (Q,)
    rank = (c <= own[:, None]).sum(axis=1)  # (Q,) 1-based, ties against the match
    return rank == 1, rank <= first_k


def text_variance(model, text: torch.Tensor | np.ndarray) -> Optional[np.ndarray]:
    """Each text's mean variance under the model's text Gaussian (Q,), or None for a cosine model."""
    if not model.cfg.gaussian:
        return None
    t = torch.as_tensor(np.asarray(text, np.float32))  # (Q, D)
    param = next(model.parameters())
    with torch.no_grad():
        ts = model.encode_text(t.to(param.device, param.dtype))
    return ts.logvar.exp().mean(dim=-1).double().cpu().numpy()  # (Q,)
