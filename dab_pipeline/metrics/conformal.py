"""Split conformal retrieval sets: from a run's costs, per query the smallest list of videos that holds a match
with probability at least 1 - alpha, calibrated on held-out queries.

The guarantee (Vovk et al.; Angelopoulos & Bates, "A Gentle Introduction to Conformal Prediction") is
*marginal*: over exchangeable calibration and test queries, P(match in the set) >= 1 - alpha, and (with
continuous scores) at most 1 - alpha + 1/(n + 1). It says nothing of one given query, and nothing where the
queries or the gallery searched differ from those it was calibrated on.

A score says how badly a video conforms to a query (larger: worse); the set of a query is every video whose
score is at most the calibration queries' conformal quantile of their true video's score. Four scores:

* ``lac``: 1 - p (Sadinle et al., least ambiguous set-valued classifiers), p the softmax of -cost / T;
* ``aps``: the probability mass of the videos ranked at or above it (Romano et al., adaptive prediction sets);
* ``raps``: APS + lambda * max(0, rank - k_reg) (Angelopoulos et al., regularised APS), which keeps sets short;
* ``normalized``: (1 - p) / d, d the query's predicted difficulty (the Gaussian text variance, say): sets grow
  where the model says a caption is ambiguous.

**The video as the unit.** Captions come many to a video, and the captions of one video are not independent; the
exchangeable units are the videos (Lee, Barber & Willett 2023, "clustered data"). :func:`weighted_quantile` weighs
each calibration caption by one over its video's captions (:func:`video_weights`) and puts the test point's mass,
one video, at +inf: the set then covers "a random caption of a new video" with probability at least 1 - alpha.
With one caption a video it is the plain split-conformal quantile.

**Per band** (Mondrian conformal, Vovk 2012): :func:`band_quantiles` takes the quantile separately within each
band of a query-time signal (:func:`band_of`), so that the coverage holds within every band, not only on average.

Plain numpy over the cost matrix, each function tested against a loop (tests/metrics/test_conformal.py). An
``alpha`` (or ``delta``) taken here is in (0, 1): :func:`check_alpha` checks it once, where a user gives it (a
stage's config, a server's query parameter, :class:`~dab_pipeline.calibration.UncertaintyRequest`), and nothing
here checks it again (issue 62); :func:`conformal_quantile`, which no search reaches, checks its own.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..core.choices import CONFORMAL_SCORES
from ..core.errors import ConfigError

__all__ = [
    "CONFORMAL_SCORES",
    "band_edges",
    "band_of",
    "band_quantiles",
    "check_alpha",
    "conformal_quantile",
    "conformal_scores",
    "conformal_sets",
    "cost_softmax",
    "needed_calibration",
    "video_weights",
    "weighted_quantile",
]


def check_alpha(alpha: float, what: str = "alpha") -> float:
    """``alpha`` as a float in (0, 1), else a one-line ConfigError: the one check of a coverage, a risk or a delta,
    where it enters (a config, a query parameter, an UncertaintyRequest)."""
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number in (0, 1), got {alpha!r}") from None
    if not 0.0 < value < 1.0 or math.isnan(value):
        raise ConfigError(f"{what} must be in (0, 1), got {alpha!r}")
    return value


def needed_calibration(alpha: float) -> int:
    """The fewest calibration queries for which a 1 - alpha set is not the whole gallery: n >= 1/alpha - 1."""
    return max(1, math.ceil(1.0 / float(alpha) - 1.0 - 1e-9))


def conformal_quantile(scores: np.ndarray, alpha: float) -> float:
    """The ceil((n + 1)(1 - alpha))-th smallest of the n calibration scores; a ConfigError naming how many
    queries are needed where n is too small for alpha (the quantile would be +inf: every video in every set)."""
    s = np.sort(np.asarray(scores, np.float64).ravel())  # (n,)
    n, a = len(s), check_alpha(alpha)  # an entry of its own: no search reaches it (the studies and tests call it)
    k = math.ceil((n + 1) * (1.0 - a) - 1e-9)
    if k > n:
        raise ConfigError(
            f"{n} calibration queries are too few for alpha={a:g}: at least {needed_calibration(a)} are needed"
        )
    return float(s[max(k, 1) - 1])


def video_weights(video: np.ndarray) -> np.ndarray:
    """Each caption's weight, one over its video's captions (Q,) float64, from each caption's video (Q,) (any
    hashable ids): every video weighs 1 in all."""
    _, inverse, counts = np.unique(np.asarray(video).ravel(), return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse].astype(np.float64)


def weighted_quantile(scores: np.ndarray, alpha: float, weights: Optional[np.ndarray] = None) -> float:
    """The conformal quantile of ``scores`` (n,) with ``weights`` (n,) (default 1 each): the smallest s whose
    calibration weight at or below it reaches (1 - alpha)(W + 1), W the weights' sum and 1 the test point's
    mass (one video), put at +inf. +inf where no s reaches it (W < 1/alpha - 1: too little calibration).

    With unit weights it is the ceil((n + 1)(1 - alpha))-th smallest score (:func:`conformal_quantile`)."""
    a = float(alpha)
    s = np.asarray(scores, np.float64).ravel()  # (n,)
    w = np.ones_like(s) if weights is None else np.asarray(weights, np.float64).ravel()  # (n,)
    if w.shape != s.shape:
        raise ConfigError(f"{len(w)} weights for {len(s)} scores")
    order = np.argsort(s, kind="stable")
    cum = np.cumsum(w[order])  # (n,)
    need = (1.0 - a) * (float(w.sum()) + 1.0)
    # (1 - alpha)(n + 1) = k exactly must count as reached, whatever the rounding: the tolerance of
    # conformal_quantile's ceil(... - 1e-9)
    at = int(np.searchsorted(cum, need - 1e-9, side="left"))
    return float(s[order[at]]) if at < len(s) else math.inf


def band_edges(signal: np.ndarray, bands: int) -> np.ndarray:
    """The ``bands - 1`` inner edges that cut ``signal`` (n,) into bands of equal counts (its quantiles at
    1/B, ..., (B-1)/B), fixed on data the quantiles never see."""
    if int(bands) < 1:
        raise ConfigError(f"the number of bands must be a positive integer, got {bands!r}")
    x = np.asarray(signal, np.float64).ravel()
    if not np.isfinite(x).all() or len(x) == 0:
        raise ConfigError("band edges need one finite signal value a query, and at least one query")
    return np.quantile(x, np.arange(1, int(bands)) / int(bands))


def band_of(signal: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each query's band (Q,) int64 in [0, len(edges)]: band b holds edges[b - 1] < signal <= edges[b]."""
    return np.searchsorted(np.asarray(edges, np.float64), np.asarray(signal, np.float64).ravel(), side="left")


def band_quantiles(
    scores: np.ndarray, band: np.ndarray, bands: int, alpha: float, weights: Optional[np.ndarray] = None
) -> np.ndarray:
    """Per band, the weighted conformal quantile of the calibration scores that fall in it (B,); +inf for a band
    whose calibration weight is too small for ``alpha`` (Mondrian conformal: coverage 1 - alpha in each band)."""
    s = np.asarray(scores, np.float64).ravel()
    b = np.asarray(band, np.int64).ravel()
    w = np.ones_like(s) if weights is None else np.asarray(weights, np.float64).ravel()
    return np.array([weighted_quantile(s[b == i], alpha, w[b == i]) for i in range(int(bands))])


def cost_softmax(cost: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """(Q, V) costs (lower is better) -> each row's softmax of -cost / T, float64."""
    if not temperature > 0:
        raise ConfigError(f"temperature must be positive, got {temperature!r}")
    z = -np.asarray(cost, np.float64) / float(temperature)  # (Q, V)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _ranked_mass(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rank (Q, V) 1-based, each video's cumulative mass of the videos ranked at or above it (Q, V)); ties in p
    ranked by video index, as a stable sort does."""
    order = np.argsort(-p, axis=1, kind="stable")  # (Q, V)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(1, p.shape[1] + 1)[None].repeat(len(p), 0), axis=1)
    cum = np.take_along_axis(np.cumsum(np.take_along_axis(p, order, axis=1), axis=1), rank - 1, axis=1)
    return rank, cum


def conformal_scores(
    p: np.ndarray,
    score: str,
    *,
    difficulty: Optional[np.ndarray] = None,
    lam: float = 0.01,
    k_reg: int = 5,
    u: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Every (query, video) score (Q, V) from the probabilities ``p`` (Q, V): larger conforms worse.

    ``u`` (Q,) in [0, 1): APS/RAPS's randomisation (a video's own mass counts u * p instead of p; exact coverage
    in expectation); None counts it whole (conservative, deterministic). ``difficulty`` (Q,) > 0: the
    ``normalized`` score's divisor."""
    p = np.asarray(p, np.float64)
    if score == "lac":
        return 1.0 - p
    if score == "normalized":
        if difficulty is None:
            raise ConfigError("the 'normalized' score needs each query's difficulty (its predicted uncertainty)")
        d = np.asarray(difficulty, np.float64).reshape(-1, 1)  # (Q, 1)
        if not (np.isfinite(d).all() and (d > 0).all()):
            raise ConfigError("a query's difficulty must be finite and positive")
        return (1.0 - p) / d
    if score in ("aps", "raps"):
        rank, cum = _ranked_mass(p)  # (Q, V) each
        s = cum if u is None else cum - (1.0 - np.asarray(u, np.float64).reshape(-1, 1)) * p
        if score == "raps":
            s = s + lam * np.maximum(0, rank - k_reg)
        return s
    raise ConfigError(f"unknown conformal score {score!r}; valid: {', '.join(CONFORMAL_SCORES)}")


def conformal_sets(scores: np.ndarray, qhat: float | np.ndarray, cost: Optional[np.ndarray] = None) -> list[np.ndarray]:
    """Each query's set: the videos whose score is at most ``qhat`` (one for all, or (Q,) per query as Mondrian
    conformal gives).

    Without ``cost``: ascending indices. With the queries' costs (Q, V): only scored videos (finite cost), best
    first, and **never empty**: the first hit is always in the set (a deterministic APS set is empty when the
    first video's mass alone passes the quantile, exactly where the model is surest). Adding it can only raise
    coverage, and a set grows by at most one video."""
    s = np.asarray(scores, np.float64)  # (Q, V)
    q = np.broadcast_to(np.asarray(qhat, np.float64), (len(s),))
    if cost is None:
        return [np.flatnonzero(s[i] <= q[i]) for i in range(len(s))]
    c = np.asarray(cost, np.float64)  # (Q, V)
    out = []
    for i in range(len(s)):
        inside = np.flatnonzero((s[i] <= q[i]) & np.isfinite(c[i]))
        first = int(np.argmin(np.where(np.isfinite(c[i]), c[i], np.inf)))
        if first not in inside and np.isfinite(c[i, first]):
            inside = np.append(inside, first)
        out.append(inside[np.argsort(c[i, inside], kind="stable")])
    return out
