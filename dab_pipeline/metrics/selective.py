"""Selective prediction (paper 4.4, Figure 4): the KL margin, risk-coverage curves and AURC."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..core.errors import ConfigError
from .retrieval import as_1d, as_cost, row_blocks, t2v_ranks


def kl_margin(cost: Any) -> np.ndarray:
    """Confidence of each query: cost of its second-best video minus its best.

    With KL costs this is the paper's "top-1 / top-2 KL margin"; larger means
    more confident, 0 when the two best videos tie.  cost (Q, V), V >= 2 -> (Q,).
    """
    c = as_cost(cost)
    q_count, v_count = c.shape
    if v_count < 2:
        raise ConfigError(f"kl_margin needs at least 2 videos, cost has shape {c.shape}")
    out = np.empty(q_count, dtype=np.float64)
    for rows in row_blocks(q_count, v_count):
        two = np.partition(c[rows], 1, axis=1)[:, :2].astype(np.float64)  # (b, 2)
        out[rows] = two[:, 1] - two[:, 0]
    return out


def _check_pair(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    conf = as_1d(confidence, "confidence")
    corr = as_1d(correct, "correct")
    if conf.shape != corr.shape:
        raise ConfigError(f"confidence {conf.shape} and correct {corr.shape} must have the same shape")
    if np.isnan(conf).any():
        raise ConfigError("confidence contains NaN")
    return conf, corr


def risk_coverage(confidence: Any, correct: Any, *, ties: str = "average") -> tuple[np.ndarray, np.ndarray]:
    """Risk-coverage curve of selective prediction.

    Queries are kept from the most to the least confident; at coverage
    ``k / Q`` the risk is ``1 - accuracy`` of the ``k`` kept queries.
    ``correct`` is bool or a 0/1 (or fractional) score per query.

    Ties: queries are sorted with a stable sort on descending confidence.
    With ``ties="average"`` (default) every query of a block of equal
    confidence contributes the block's mean correctness, which is the
    expected curve under uniformly random tie-breaking; a constant confidence
    therefore gives exactly the random-ordering curve.  ``ties="stable"``
    keeps the input order inside a block instead.

    -> coverage (Q,) = (1..Q)/Q, risk (Q,).
    """
    conf, corr = _check_pair(confidence, correct)
    if ties not in ("average", "stable"):
        raise ConfigError(f"ties must be 'average' or 'stable', got {ties!r}")
    n = conf.shape[0]
    order = np.argsort(-conf, kind="stable")  # (Q,)
    sorted_conf = conf[order]
    sorted_corr = corr[order]
    if ties == "average":
        starts = np.flatnonzero(np.r_[True, sorted_conf[1:] != sorted_conf[:-1]])
        lengths = np.diff(np.r_[starts, n])
        block_mean = np.add.reduceat(sorted_corr, starts) / lengths
        sorted_corr = np.repeat(block_mean, lengths)
    kept = np.arange(1, n + 1, dtype=np.float64)
    risk = 1.0 - np.cumsum(sorted_corr) / kept
    # Cumulative sums of exact 0/1 values can land a hair below 0.
    risk = np.clip(risk, 0.0, 1.0)
    return kept / n, risk


def aurc(confidence: Any, correct: Any, *, ties: str = "average") -> float:
    """Area under the risk-coverage curve: the mean risk over coverages 1/Q..Q/Q."""
    _, risk = risk_coverage(confidence, correct, ties=ties)
    return float(np.mean(risk))


def aurc_random(correct: Any) -> float:
    """Expected AURC of a random ordering: ``1 - mean(correct)``.

    Under a uniformly random order the expected accuracy of any ``k`` kept
    queries is the overall accuracy, so the expected risk is flat.
    """
    corr = as_1d(correct, "correct")
    return float(1.0 - np.mean(corr))


def aurc_random_mc(correct: Any, *, trials: int = 200, seed: int = 0) -> float:
    """Monte-Carlo estimate of :func:`aurc_random` from ``trials`` seeded permutations."""
    corr = as_1d(correct, "correct")
    if trials < 1:
        raise ConfigError(f"trials must be >= 1, got {trials}")
    rng = np.random.default_rng(seed)
    n = corr.shape[0]
    kept = np.arange(1, n + 1, dtype=np.float64)
    total = 0.0
    for _ in range(trials):
        perm = corr[rng.permutation(n)]
        total += float(np.mean(1.0 - np.cumsum(perm) / kept))
    return total / trials


def aurc_optimal(correct: Any) -> float:
    """AURC of an oracle confidence that ranks every correct query first.

    With ``c`` correct out of ``Q`` the risk is 0 up to coverage c/Q and
    ``1 - c/k`` after, so AURC* = ``(Q - c - c * (H_Q - H_c)) / Q`` (``H`` the
    harmonic numbers).  Binary ``correct`` only.
    """
    corr = as_1d(correct, "correct")
    n = corr.shape[0]
    c = int(np.count_nonzero(corr))
    k = np.arange(c + 1, n + 1, dtype=np.float64)
    return float(np.sum(1.0 - c / k) / n)


def accuracy_at_coverage(confidence: Any, correct: Any, coverage: float, *, ties: str = "average") -> float:
    """Accuracy (fraction in [0, 1]) of the ``ceil(coverage * Q)`` most confident queries."""
    cov = float(coverage)
    if not (0.0 < cov <= 1.0):
        raise ConfigError(f"coverage must be in (0, 1], got {coverage!r}")
    _, risk = risk_coverage(confidence, correct, ties=ties)
    n = risk.shape[0]
    return float(1.0 - risk[_keep_count(cov, n) - 1])


def _keep_count(coverage: float, n: int) -> int:
    # The epsilon keeps 0.25 * 1000 at 250 despite float error in the product.
    return min(n, max(1, math.ceil(coverage * n - 1e-9)))


def _coverage_key(coverage: float) -> str:
    return f"{100.0 * coverage:g}%"


def selective_report(
    cost: Any,
    gt: Any,
    *,
    confidence: Any | None = None,
    confidence_name: str = "kl_margin",
    coverages: Sequence[float] = (0.25, 0.10),
    ks: Sequence[int] = (1, 5),
) -> dict[str, Any]:
    """Selective-prediction summary of a cost matrix (paper Figure 4).

    Confidence defaults to :func:`kl_margin`.  For each ``k`` in ``ks`` a
    query is correct when its t2v rank is <= k.  Returns::

        {"confidence": name, "n": Q,
         "R@1": {"accuracy": %, "aurc": f, "aurc_random": f, "aurc_optimal": f,
                 "at_coverage": {"25%": %, "10%": %}},
         "R@5": {...},
         "curves": {"coverage": (Q,), "risk": {"R@1": (Q,), ...},
                    "random": {"R@1": f, ...}}}

    Accuracies are percentages (like recalls), AURCs fractions (like the paper).
    ``curves`` holds numpy arrays for plotting; :mod:`dab_pipeline.results.report`
    keeps them out of metrics.json.
    """
    c = as_cost(cost)
    ranks = t2v_ranks(c, gt)
    if confidence is None:
        conf = kl_margin(c)
    else:
        conf = as_1d(confidence, "confidence")
        if conf.shape[0] != c.shape[0]:
            raise ConfigError(f"confidence has shape {conf.shape}, expected ({c.shape[0]},) for cost {c.shape}")
    for cov in coverages:
        if not (0.0 < float(cov) <= 1.0):
            raise ConfigError(f"coverage must be in (0, 1], got {cov!r}")
    out: dict[str, Any] = {"confidence": confidence_name, "n": int(c.shape[0])}
    curves: dict[str, Any] = {"coverage": None, "risk": {}, "random": {}}
    for k in ks:
        key = f"R@{int(k)}"
        correct = (ranks <= k).astype(np.float64)
        coverage, risk = risk_coverage(conf, correct)
        curves["coverage"] = coverage
        curves["risk"][key] = risk
        curves["random"][key] = aurc_random(correct)
        at: dict[str, float] = {}
        for cov in coverages:
            k_keep = _keep_count(float(cov), risk.shape[0])
            at[_coverage_key(cov)] = 100.0 * float(1.0 - risk[k_keep - 1])
        out[key] = {
            "accuracy": 100.0 * float(np.mean(correct)),
            "aurc": float(np.mean(risk)),
            "aurc_random": aurc_random(correct),
            "aurc_optimal": aurc_optimal(correct),
            "at_coverage": at,
        }
    out["curves"] = curves
    return out


def threshold_outcome(confidence: Any, correct: Any, threshold: float) -> tuple[float, float]:
    """Answer only the queries whose confidence is at least ``threshold`` (abstain on the rest).

    -> (coverage: share of queries answered, precision: mean correctness of the answered ones; NaN when none
    is answered).
    """
    conf, corr = _check_pair(confidence, correct)
    keep = conf >= threshold
    if not keep.any():
        return 0.0, float("nan")
    return float(keep.mean()), float(corr[keep].mean())
