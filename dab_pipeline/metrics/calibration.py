"""How well probabilities of correctness are calibrated: ECE over equal-width and equal-mass bins, the Brier
score, log loss, AUROC of correctness and the reliability diagram's bins.

Plain numpy, so that ``dab evaluate`` reads a calibrated run without scikit-learn; each function is tested
against a loop and, where scikit-learn has it (Brier, log loss, AUROC), against scikit-learn
(tests/metrics/test_calibration_measures.py). ECE is in neither scikit-learn nor numpy; its definition here is
Guo et al. 2017's (the bins' weighted mean |accuracy - mean probability|, their "confidence"), with the two binnings of Nixon et al. 2019.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import ConfigError

__all__ = [
    "BINNINGS",
    "ReliabilityBins",
    "auroc",
    "brier_score",
    "calibration_report",
    "expected_calibration_error",
    "log_loss",
    "reliability_bins",
    "top_bins",
]

BINNINGS = ("width", "mass")
_EPS = 1e-12  # log loss clips probabilities to [eps, 1 - eps], as scikit-learn's does for float64


def _pair(prob, correct) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(prob, np.float64).ravel()
    y = np.asarray(correct, np.float64).ravel()
    if p.shape != y.shape:
        raise ConfigError(f"probabilities {p.shape} and outcomes {y.shape} must have one value a query")
    if len(p) == 0:
        raise ConfigError("no queries to measure calibration on")
    if not (np.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()):
        raise ConfigError("probabilities must be finite and in [0, 1]")
    return p, y


@dataclass(frozen=True)
class ReliabilityBins:
    """The bins of a reliability diagram: per non-empty bin its mean probability, accuracy and count."""

    lower: np.ndarray  # (B,) each bin's lower edge
    upper: np.ndarray  # (B,)
    mean_probability: np.ndarray  # (B,) the bin's mean predicted probability
    accuracy: np.ndarray  # (B,) share of the bin's queries that were correct
    count: np.ndarray  # (B,) int


def _edges(p: np.ndarray, bins: int, binning: str) -> np.ndarray:
    if binning == "width":
        return np.linspace(0.0, 1.0, bins + 1)
    if binning == "mass":  # each bin about len(p) / bins queries: edges at the probabilities' quantiles
        e = np.quantile(p, np.linspace(0.0, 1.0, bins + 1))
        e[0], e[-1] = 0.0, 1.0
        return e
    raise ConfigError(f"binning must be one of {', '.join(BINNINGS)}, got {binning!r}")


def reliability_bins(prob, correct, bins: int = 15, binning: str = "width") -> ReliabilityBins:
    """The non-empty bins of ``bins`` equal-width (or equal-mass) bins over [0, 1]; a probability on an inner
    edge goes to the bin above it, 1.0 to the last."""
    p, y = _pair(prob, correct)
    if bins < 1:
        raise ConfigError(f"bins must be a positive integer, got {bins}")
    edges = _edges(p, bins, binning)  # (bins + 1,)
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, bins - 1)  # (Q,)
    count = np.bincount(which, minlength=bins)
    conf = np.bincount(which, weights=p, minlength=bins)
    acc = np.bincount(which, weights=y, minlength=bins)
    keep = count > 0
    n = count[keep]
    return ReliabilityBins(edges[:-1][keep], edges[1:][keep], conf[keep] / n, acc[keep] / n, n)


def expected_calibration_error(prob, correct, bins: int = 15, binning: str = "width") -> float:
    """ECE: sum over bins of (bin size / Q) * |accuracy - mean probability|."""
    r = reliability_bins(prob, correct, bins, binning)
    return float(np.sum(r.count * np.abs(r.accuracy - r.mean_probability)) / r.count.sum())


def brier_score(prob, correct) -> float:
    """Mean squared difference between the probability and the 0/1 outcome."""
    p, y = _pair(prob, correct)
    return float(np.mean((p - y) ** 2))


def log_loss(prob, correct) -> float:
    """Mean negative log likelihood of the outcomes (probabilities clipped to [1e-12, 1 - 1e-12])."""
    p, y = _pair(prob, correct)
    p = np.clip(p, _EPS, 1.0 - _EPS)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def auroc(score, correct) -> float:
    """Area under the ROC curve of ``score`` separating correct from wrong queries (ties count a half): the
    probability that a random correct query scores above a random wrong one. NaN when all are one class."""
    s = np.asarray(score, np.float64).ravel()
    y = np.asarray(correct, bool).ravel()
    if s.shape != y.shape:
        raise ConfigError(f"scores {s.shape} and outcomes {y.shape} must have one value a query")
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(s, kind="stable")
    ranks = np.empty(len(s), np.float64)
    sorted_s = s[order]
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    mid = (starts + ends + 1) / 2.0  # the average 1-based rank of each block of ties
    ranks[order] = np.repeat(mid, ends - starts)
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def calibration_report(prob, correct, bins: int = 15) -> dict[str, float]:
    """The figures ``dab evaluate`` and ``dab calibrate`` print for one probability: ECE (equal width and equal
    mass), Brier, log loss, AUROC, and the mean probability beside the accuracy."""
    p, y = _pair(prob, correct)
    return {
        "ece": expected_calibration_error(p, y, bins, "width"),
        "ece_mass": expected_calibration_error(p, y, bins, "mass"),
        "brier": brier_score(p, y),
        "log_loss": log_loss(p, y),
        "auroc": auroc(p, y),
        "mean_probability": float(p.mean()),
        "accuracy": float(y.mean()),
        "queries": int(len(p)),
    }


def top_bins(prob, correct, low: float = 0.5, min_count: int = 100) -> list[dict[str, float]]:
    """Reliability where a probability is used (risk thresholds sit there): the queries with p >= ``low``, in
    equal-mass bins of at least ``min_count`` queries (as many as fit), each with its mean p, the observed rate and
    the observed rate's 95 % Wilson interval; empty where fewer than ``min_count`` queries reach ``low``."""
    p, y = _pair(prob, correct)
    keep = p >= low
    n = int(keep.sum())
    if n < min_count:
        return []
    order = np.argsort(p[keep], kind="stable")
    ps, ys = p[keep][order], y[keep][order]
    out = []
    for part in np.array_split(np.arange(n), n // min_count):  # equal mass, each >= min_count
        m, k = len(part), float(ys[part].sum())
        rate = k / m
        z = 1.959963984540054
        centre = (rate + z * z / (2 * m)) / (1 + z * z / m)
        half = z * np.sqrt(rate * (1 - rate) / m + z * z / (4 * m * m)) / (1 + z * z / m)
        out.append(
            {
                "low": float(ps[part[0]]),
                "high": float(ps[part[-1]]),
                "count": m,
                "mean_p": float(ps[part].mean()),
                "observed": rate,
                "interval": [float(centre - half), float(centre + half)],
            }
        )
    return out
