"""Answers with a risk guarantee: the confidence threshold above which a query is answered, chosen on held-out
queries by Learn-then-Test (Angelopoulos, Bates, Candes, Jordan, Lei 2021) so that, with probability at least
1 - delta over the calibration queries, the error rate of the first hit among answered queries is at most alpha.

Candidate thresholds are tested from the most confident down (fixed-sequence testing, no multiplicity
correction needed): at each, the null "the answered error rate exceeds alpha" is rejected when the binomial
p-value of the errors seen among the n answered calibration queries, P(Binomial(n, alpha) <= errors), is at
most delta; the chosen threshold is the lowest one reached before the first failure. The candidates are a grid
fixed before the data are seen (LTT's hypotheses may not depend on the calibration data). The thresholds that
answer fewer than n_min = ceil(log delta / log(1 - alpha)) queries, the fewest whose p-value can reach delta at
all, come first in the sequence and are passed over (else the sequence would stop at once). None where no
threshold passes (then answer nothing).

**The video as the unit.** The binomial test is valid only where the calibration queries are independent, one
caption a video. Where captions share a video they are not (a hard video makes all its captions wrong together),
and the binomial test, counting them as independent, is over-confident. With ``video`` given, each threshold is
tested on one statistic a video, bounded in [0, 1]: X_v = alpha + (E_v - alpha A_v) / m_v, A_v of the video's m_v
captions answered and E_v of those wrong, whose mean is at most alpha exactly when the error rate among answered
captions of a random caption of a random video is at most alpha. Its p-value is valid for independent bounded
variables: Waudby-Smith & Ramdas's betting test (``wsr``, the default; Bates et al. 2021, "Distribution-free,
risk-controlling prediction sets", appendix) or Hoeffding-Bentkus (``hb``). A threshold whose best case (none of its
answered captions wrong) cannot reach delta is passed over, as above.

**The order of the tests from independent data.** Testing from the highest threshold down stops at the first
failure, and the highest thresholds answer a handful of queries: one unlucky error there ends the sequence before
the thresholds that would pass. Fixed-sequence testing stays valid in *any* order fixed independently of the
held-out data, so :func:`risk_test_order` orders the thresholds by their p-values on the *fitted* half (the most
promising first); the threshold chosen is the lowest of those rejected before the first failure.

What is guaranteed is the *population* error rate among answered queries at the threshold chosen. The error rate
measured on a finite set of held-out queries scatters around it: over 400 draws of 500 calibration queries from a
synthetic gallery, the population rate exceeded alpha = 0.1 in 3.7 % of draws (delta = 0.05), but the rate on 500
other held-out queries (about 270 answered) exceeded it in 8.5 %. tests/metrics/test_conformal.py checks the
former on a population of 100,000 queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

__all__ = [
    "RISK_TESTS",
    "RiskThreshold",
    "binomial_cdf",
    "hoeffding_bentkus_pvalue",
    "learn_then_test",
    "min_answered",
    "risk_test_order",
    "video_statistic",
    "video_statistics",
    "wsr_pvalue",
    "wsr_pvalues",
]

RISK_TESTS = ("wsr", "hb", "binomial")  # per video (betting, Hoeffding-Bentkus); per caption (independent only)


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed in log space (exact to float64 for the n of a validation split)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    i = np.arange(k + 1, dtype=np.float64)
    logs = (
        math.lgamma(n + 1)
        - np.array([math.lgamma(x + 1) + math.lgamma(n - x + 1) for x in i])
        + i * math.log(p)
        + (n - i) * math.log1p(-p)
    )
    top = logs.max()
    return float(min(1.0, math.exp(top) * np.exp(logs - top).sum()))


def hoeffding_bentkus_pvalue(mean: float, n: int, alpha: float) -> float:
    """The Hoeffding-Bentkus p-value of H0: E[X] >= alpha for n independent X in [0, 1] of sample ``mean``."""
    if n <= 0 or mean >= alpha:
        return 1.0
    m = max(float(mean), 0.0)
    h1 = (m * math.log(m / alpha) if m > 0 else 0.0) + (1 - m) * math.log((1 - m) / (1 - alpha))
    hoeffding = math.exp(-n * h1)
    bentkus = math.e * binomial_cdf(math.ceil(n * m - 1e-12), n, alpha)
    return float(min(1.0, hoeffding, bentkus))


def wsr_pvalue(x: np.ndarray, alpha: float, delta: float) -> float:
    """Waudby-Smith & Ramdas's betting p-value of H0: E[X] >= alpha for independent X in [0, 1], taken in the
    order given: 1 / the largest wealth of the bets 1 - nu_i (x_i - alpha), nu_i predictable (Ville's inequality).
    ``delta`` only tunes the bets' size (the RCPS choice)."""
    x = np.asarray(x, np.float64).ravel()  # (n,)
    n = len(x)
    if n == 0:
        return 1.0
    i = np.arange(1, n + 1, dtype=np.float64)
    mu = (0.5 + np.cumsum(x)) / (1.0 + i)  # (n,) the running mean after x_i
    sigma2 = (0.25 + np.cumsum((x - mu) ** 2)) / (1.0 + i)  # (n,)
    before = np.concatenate([[0.25], sigma2[:-1]])  # (n,) what was known before x_i: the bet is predictable
    nu = np.minimum(1.0, np.sqrt(2.0 * math.log(1.0 / delta) / (n * before)))
    with np.errstate(divide="ignore"):
        log_wealth = np.cumsum(np.log(np.maximum(1.0 - nu * (x - alpha), 0.0)))  # (n,)
    top = float(log_wealth.max())
    return float(min(1.0, math.exp(-top))) if top > 0 else 1.0


def video_statistic(answered: np.ndarray, correct: np.ndarray, video: np.ndarray, alpha: float) -> np.ndarray:
    """X_v = alpha + (errors among answered - alpha answered) / captions, per video (N,) in [0, 1], videos in the
    order of their first caption."""
    vid = np.asarray(video).ravel()
    _, first, inverse = np.unique(vid, return_index=True, return_inverse=True)
    n_v = np.bincount(inverse).astype(np.float64)  # (N,)
    a = np.asarray(answered, bool).ravel()
    wrong = a & ~np.asarray(correct, bool).ravel()
    z = np.bincount(inverse, weights=wrong.astype(np.float64), minlength=len(n_v)) - alpha * np.bincount(
        inverse, weights=a.astype(np.float64), minlength=len(n_v)
    )
    x = alpha + z / n_v  # (N,) in the order of np.unique's ids
    return np.clip(x[np.argsort(first, kind="stable")], 0.0, 1.0)


def video_statistics(
    confidence: np.ndarray, correct: np.ndarray, video: np.ndarray, alpha: float, thresholds: np.ndarray
) -> np.ndarray:
    """:func:`video_statistic` at every threshold at once (T, N): answered where confidence >= the threshold."""
    vid = np.asarray(video).ravel()
    _, first, inverse = np.unique(vid, return_index=True, return_inverse=True)
    inverse = np.argsort(np.argsort(first, kind="stable"), kind="stable")[inverse]  # videos by first caption
    n = len(first)
    t = np.asarray(thresholds, np.float64).ravel()
    answered = np.asarray(confidence, np.float64).ravel()[None] >= t[:, None]  # (T, Q)
    wrong = answered & ~np.asarray(correct, bool).ravel()[None]  # (T, Q)
    idx = (np.arange(len(t))[:, None] * n + inverse[None]).ravel()  # (T * Q,) a cell per (threshold, video)
    count = lambda m: np.bincount(idx, weights=m.ravel(), minlength=len(t) * n).reshape(len(t), n)  # noqa: E731
    m_v = np.bincount(inverse, minlength=n).astype(np.float64)  # (N,)
    return np.clip(alpha + (count(wrong) - alpha * count(answered)) / m_v[None], 0.0, 1.0)


def wsr_pvalues(x: np.ndarray, alpha: float, delta: float) -> np.ndarray:
    """:func:`wsr_pvalue` of each row of ``x`` (T, n) at once (T,)."""
    x = np.asarray(x, np.float64)
    t, n = x.shape
    if n == 0:
        return np.ones(t)
    i = np.arange(1, n + 1, dtype=np.float64)[None]
    mu = (0.5 + np.cumsum(x, axis=1)) / (1.0 + i)  # (T, n)
    sigma2 = (0.25 + np.cumsum((x - mu) ** 2, axis=1)) / (1.0 + i)  # (T, n)
    before = np.concatenate([np.full((t, 1), 0.25), sigma2[:, :-1]], axis=1)  # predictable
    nu = np.minimum(1.0, np.sqrt(2.0 * math.log(1.0 / delta) / (n * before)))
    with np.errstate(divide="ignore"):
        top = np.cumsum(np.log(np.maximum(1.0 - nu * (x - alpha), 0.0)), axis=1).max(axis=1)  # (T,)
    return np.where(top > 0, np.minimum(1.0, np.exp(-np.maximum(top, 0.0))), 1.0)


def _pvalues(test: str, x: np.ndarray, alpha: float, delta: float) -> np.ndarray:
    """Each row's p-value (T,) of the per-video statistics ``x`` (T, N)."""
    if test == "wsr":
        return wsr_pvalues(x, alpha, delta)
    return np.array([hoeffding_bentkus_pvalue(float(m), x.shape[1], alpha) for m in x.mean(axis=1)])


@dataclass(frozen=True)
class RiskThreshold:
    """The threshold chosen and what it did on the calibration queries."""

    threshold: Optional[float]  # answer where confidence >= threshold; None: answer nothing
    alpha: float
    delta: float
    answered: int  # calibration queries answered at the threshold
    errors: int  # of those, first hit not a match
    queries: int  # calibration queries in all
    test: str = "binomial"  # the p-value: binomial (captions independent), wsr or hb (one statistic a video)
    videos: Optional[int] = None  # calibration videos, where the video is the unit

    @property
    def answered_share(self) -> float:
        return self.answered / self.queries if self.queries else 0.0


def min_answered(alpha: float, delta: float) -> int:
    """The fewest answered queries whose binomial p-value can reach ``delta`` (none of them wrong)."""
    return max(1, math.ceil(math.log(delta) / math.log1p(-alpha) - 1e-9))


def _grid(grid: Optional[np.ndarray]) -> np.ndarray:
    """The candidate thresholds, highest first (default 0.995, 0.99, ..., 0, for a calibrated probability)."""
    return np.linspace(1.0, 0.0, 201)[1:] if grid is None else np.sort(np.asarray(grid, np.float64))[::-1]


def risk_test_order(
    confidence: np.ndarray,
    correct: np.ndarray,
    video: np.ndarray,
    alpha: float,
    delta: float,
    grid: Optional[np.ndarray] = None,
    test: str = "wsr",
) -> np.ndarray:
    """The thresholds of ``grid`` in the order to test them on held-out data: by their per-video p-value on these
    (fitted-half) queries, the smallest first; ties keep the higher threshold first."""
    a = float(alpha)
    g = _grid(grid)
    p = _pvalues(test, video_statistics(confidence, correct, video, a, g), a, delta)  # (T,)
    return g[np.argsort(p, kind="stable")]


def learn_then_test(
    confidence: np.ndarray,
    correct: np.ndarray,
    alpha: float,
    delta: float,
    grid: Optional[np.ndarray] = None,
    video: Optional[np.ndarray] = None,
    test: Optional[str] = None,
    order: Optional[np.ndarray] = None,
) -> RiskThreshold:
    """The Learn-then-Test threshold on ``confidence`` (Q,) given whether each calibration query's first hit is
    a match (``correct`` (Q,) bool). ``grid``: the candidate thresholds, fixed before the calibration queries are
    seen (default: 0.995, 0.99, ..., 0, for a calibrated probability), tested from the highest down; those whose
    test cannot succeed even with no error are passed over.

    ``video`` (Q,): each query's video; then the test is per video (``wsr``, default, or ``hb``), else the
    binomial test over queries taken as independent (``binomial``). ``order``: the thresholds in the order to test
    them, fixed on other data (:func:`risk_test_order`); then none is passed over, and the threshold chosen is the
    lowest rejected before the first failure."""
    a, d = float(alpha), float(delta)  # in (0, 1): checked where they were given
    conf = np.asarray(confidence, np.float64).ravel()
    ok = np.asarray(correct, bool).ravel()
    if conf.shape != ok.shape:
        raise ValueError(f"confidence {conf.shape} and correct {ok.shape} must have one value a query")
    test = test or ("binomial" if video is None else "wsr")
    if test not in RISK_TESTS:
        raise ValueError(f"unknown risk test {test!r}; valid: {', '.join(RISK_TESTS)}")
    if (test == "binomial") != (video is None):
        raise ValueError("the binomial test takes no video; the per-video tests (wsr, hb) need one")
    videos = None if video is None else len(np.unique(np.asarray(video).ravel()))
    chosen = RiskThreshold(None, a, d, 0, 0, len(conf), test, videos)
    seq = _grid(grid) if order is None else np.asarray(order, np.float64)
    if test != "binomial":  # every threshold's p-value at once, and its best case's (no answered caption wrong)
        p = dict(zip(seq.tolist(), _pvalues(test, video_statistics(conf, ok, video, a, seq), a, d)))
        if order is None:  # only a sequence fixed here passes over thresholds whose best case cannot pass
            best = dict(
                zip(seq.tolist(), _pvalues(test, video_statistics(conf, np.ones_like(ok), video, a, seq), a, d))
            )
    for t in seq:
        answered = conf >= t
        n = int(answered.sum())
        errors = int((~ok[answered]).sum())
        if test == "binomial":
            if order is None and n < min_answered(a, d):
                continue
            passed = binomial_cdf(errors, n, a) <= d
        else:
            if order is None and best[float(t)] > d:
                continue  # its best case, no answered caption wrong, cannot pass: passed over
            passed = p[float(t)] <= d
        if not passed:
            break
        if chosen.threshold is None or t < chosen.threshold:
            chosen = RiskThreshold(float(t), a, d, n, errors, len(conf), test, videos)
    return chosen
