"""Conditional conformal over overlapping groups (Gibbs, Cherian & Candès 2023, "Conformal prediction with
conditional guarantees"): a set whose coverage is 1 - alpha within *every* group of a finite family at once, where
the groups may overlap (uncertainty bands and caption lengths, say), which Mondrian conformal (one partition) cannot.

For a test query with group indicators phi (d,), the method fits the (1 - alpha) quantile regression over the
calibration queries' indicators Phi (n, d) *and* the test query with an imputed score S, and keeps S when it is at
most the fitted value at the test query. That holds exactly while the test query's dual variable is below
1 - alpha, and the dual grows with S, so the cutoff is the largest such S (found by bisection, each step one linear
program: the dual of quantile regression, solved by HiGHS through scipy).

The cutoff depends on the test query only through its indicators, so a family of G groups has at most 2^G
cutoffs: :class:`ConditionalQuantiles` computes each pattern's once and keeps it. Weights (the video as the unit:
one over a video's captions) scale each query's pinball loss, the test query's weight is one video.

The authors' package (``conditionalconformal`` on PyPI) computes the same cutoff with unit weights;
tests/metrics/test_conditional.py checks this against it where it is installed and against Mondrian conformal
(disjoint groups) everywhere.
"""

from __future__ import annotations

import math
import time
from typing import Optional

import numpy as np

from ..core.errors import ConfigError

__all__ = ["ConditionalQuantiles", "conditional_cutoff"]


def _linprog():
    try:
        from scipy.optimize import linprog
    except ImportError:
        raise ConfigError(
            "conditional conformal (--groups with overlapping groups) solves a linear program with scipy, which "
            "is not installed: pip install 'dab-pipeline[calibrate]'"
        ) from None
    return linprog


def _solve(linprog, s_cal, phi_all, lower, upper, S: float) -> tuple[float, np.ndarray]:
    """(the test query's dual variable, the fit's coefficients (d,)) at imputed score ``S``."""
    c = -np.append(s_cal, S)  # maximise sum(eta * s)
    try:
        res = linprog(
            c, A_eq=phi_all.T, b_eq=np.zeros(phi_all.shape[1]), bounds=np.stack([lower, upper], 1), method="highs"
        )
    except ValueError as exc:
        raise ConfigError(f"the conditional conformal program cannot be set up ({exc})") from None
    if res.status != 0:
        raise ConfigError(f"the conditional conformal program failed ({res.message})")
    return float(res.x[-1]), -np.asarray(res.eqlin.marginals, np.float64)


def conditional_cutoff(
    scores: np.ndarray,
    phi: np.ndarray,
    phi_test: np.ndarray,
    alpha: float,
    weights: Optional[np.ndarray] = None,
    test_weight: float = 1.0,
    rtol: float = 1e-7,
) -> float:
    """The unrandomised conditional-conformal cutoff of one test query: its set holds the videos whose score is at
    most it. ``scores`` (n,), ``phi`` (n, d) the calibration queries' group indicators (an intercept column
    included by the caller), ``phi_test`` (d,); +inf where the test query's groups hold too little calibration
    for ``alpha`` (the fit can follow any S there)."""
    linprog = _linprog()
    tau = 1.0 - float(alpha)  # alpha in (0, 1): checked where it was given
    s = np.asarray(scores, np.float64).ravel()  # (n,)
    finite = np.isfinite(s)
    if not finite.all():  # +inf: a match the first stage missed; the program needs finite numbers, in the same order
        base = s[finite] if finite.any() else np.zeros(1)
        sentinel = float(base.max() + 1.0 + (base.max() - base.min()))
        got = conditional_cutoff(np.where(finite, s, sentinel), phi, phi_test, alpha, weights, test_weight, rtol)
        return math.inf if got >= sentinel else got  # a cutoff at the sentinel would hold a missed match
    Phi = np.asarray(phi, np.float64)  # (n, d)
    w = np.ones_like(s) if weights is None else np.asarray(weights, np.float64).ravel()
    phi_all = np.vstack([Phi, np.asarray(phi_test, np.float64).reshape(1, -1)])  # (n + 1, d)
    keep = np.flatnonzero(np.abs(phi_all).sum(axis=0) > 0)  # a group nobody is in constrains nothing
    phi_all = phi_all[:, keep]
    ww = np.append(w, float(test_weight))  # (n + 1,)
    lower, upper = ww * (tau - 1.0), ww * tau
    solve = lambda S: _solve(linprog, s, phi_all, lower, upper, S)  # noqa: E731
    inside = lambda S: solve(S)[0] < upper[-1] * (1 - 1e-9)  # noqa: E731
    span = float(s.max() - s.min()) if len(s) else 1.0
    lo, hi = float(s.min()) - 1.0 - span, float(s.max()) + 1.0 + span
    dual, beta = solve(hi)
    if dual < upper[-1] * (1 - 1e-9):
        return math.inf
    # Above the cutoff the test query sits above the fit, whose coefficients then do not depend on S: the cutoff
    # is that fit's value at the test query (checked on both sides; a degenerate program falls back to bisection)
    fitted = float(phi_all[-1] @ beta)
    eps = rtol * (1.0 + abs(fitted))
    if inside(fitted - eps) and not inside(fitted + eps):
        return fitted
    if not inside(lo):
        return lo
    while hi - lo > rtol * (1.0 + abs(hi) + abs(lo)):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if inside(mid) else (lo, mid)
    return lo


class ConditionalQuantiles:
    """The cutoffs of a calibration's queries (their scores and group indicators) for one alpha, one a pattern of
    group memberships, computed when first asked and kept; ``seconds`` adds up the programs' time."""

    def __init__(self, scores: np.ndarray, phi: np.ndarray, alpha: float, weights: Optional[np.ndarray] = None) -> None:
        self.scores = np.asarray(scores, np.float64).ravel()
        self.phi = np.asarray(phi, np.float64)
        if self.phi.shape[0] != len(self.scores):
            raise ConfigError(f"{self.phi.shape[0]} group rows for {len(self.scores)} calibration scores")
        self.alpha = float(alpha)
        self.weights = weights
        self.cache: dict[tuple, float] = {}
        self.seconds = 0.0
        self.solved = 0

    def cutoff(self, phi_test: np.ndarray) -> float:
        key = tuple(int(v) for v in np.asarray(phi_test).ravel())
        if key not in self.cache:
            t0 = time.perf_counter()
            self.cache[key] = conditional_cutoff(self.scores, self.phi, np.asarray(key), self.alpha, self.weights)
            self.seconds += time.perf_counter() - t0
            self.solved += 1
        return self.cache[key]

    def cutoffs(self, phi_test: np.ndarray) -> np.ndarray:
        """One cutoff a test query (Q,) from their indicators (Q, d)."""
        return np.array([self.cutoff(row) for row in np.asarray(phi_test)])
