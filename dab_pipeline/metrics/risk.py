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

from .conformal import check_alpha

__all__ = ["RiskThreshold", "binomial_cdf", "learn_then_test", "min_answered"]


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


@dataclass(frozen=True)
class RiskThreshold:
    """The threshold chosen and what it did on the calibration queries."""

    threshold: Optional[float]  # answer where confidence >= threshold; None: answer nothing
    alpha: float
    delta: float
    answered: int  # calibration queries answered at the threshold
    errors: int  # of those, first hit not a match
    queries: int  # calibration queries in all

    @property
    def answered_share(self) -> float:
        return self.answered / self.queries if self.queries else 0.0


def min_answered(alpha: float, delta: float) -> int:
    """The fewest answered queries whose binomial p-value can reach ``delta`` (none of them wrong)."""
    return max(1, math.ceil(math.log(delta) / math.log1p(-alpha) - 1e-9))


def learn_then_test(
    confidence: np.ndarray,
    correct: np.ndarray,
    alpha: float,
    delta: float,
    grid: Optional[np.ndarray] = None,
) -> RiskThreshold:
    """The Learn-then-Test threshold on ``confidence`` (Q,) given whether each calibration query's first hit is
    a match (``correct`` (Q,) bool). ``grid``: the candidate thresholds, fixed before the calibration queries are
    seen (default: 0.995, 0.99, ..., 0, for a calibrated probability), tested from the highest down; those that
    answer fewer than :func:`min_answered` queries are passed over (their test cannot succeed)."""
    a, d = check_alpha(alpha), check_alpha(delta, "delta")
    conf = np.asarray(confidence, np.float64).ravel()
    ok = np.asarray(correct, bool).ravel()
    if conf.shape != ok.shape:
        raise ValueError(f"confidence {conf.shape} and correct {ok.shape} must have one value a query")
    grid = np.linspace(1.0, 0.0, 201)[1:] if grid is None else np.sort(np.asarray(grid, np.float64))[::-1]
    chosen = RiskThreshold(None, a, d, 0, 0, len(conf))
    for t in grid:
        answered = conf >= t
        n = int(answered.sum())
        if n < min_answered(a, d):
            continue
        errors = int((~ok[answered]).sum())
        if binomial_cdf(errors, n, a) > d:
            break
        chosen = RiskThreshold(float(t), a, d, n, errors, len(conf))
    return chosen
