"""What a calibration says of new queries: calibrated probabilities, conformal retrieval sets and whether a
query is answered under a risk guarantee (:func:`assess`), each from a query's costs over the gallery searched.

What holds (docs/uncertainty.md): a set of coverage 1 - alpha holds a match with probability at least 1 - alpha
*on average over queries* like the validation ones, searched in a gallery like the one calibrated on; the risk
threshold keeps the error rate of the first hit among answered queries at most ``max_risk`` with probability at
least 1 - ``delta`` over the calibration draw. Neither is a statement about one query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..core.choices import DEFAULT_CONFORMAL_SCORE
from ..core.errors import ConfigError
from ..metrics.conformal import CONFORMAL_SCORES, check_alpha, conformal_quantile, conformal_scores, cost_softmax
from ..metrics.risk import RiskThreshold, learn_then_test
from .features import query_features
from .maps import nested_probabilities
from .record import Calibration

__all__ = ["DEFAULT_CONFORMAL_SCORE", "DEFAULT_DELTA", "QueryUncertainty", "UncertaintyRequest", "assess"]

DEFAULT_DELTA = 0.05


@dataclass(frozen=True)
class UncertaintyRequest:
    """What a search asks of a calibration: a set of this coverage, answers under this risk (or neither)."""

    coverage: Optional[float] = None  # in (0, 1): each query's set holds a match with this probability
    score: str = DEFAULT_CONFORMAL_SCORE  # the conformal score the set is built with
    max_risk: Optional[float] = None  # in (0, 1): error rate of the first hit among answered queries
    delta: float = DEFAULT_DELTA  # the risk guarantee fails with probability at most delta

    def __post_init__(self) -> None:
        if self.coverage is not None:
            check_alpha(self.coverage, "coverage")
        if self.max_risk is not None:
            check_alpha(self.max_risk, "max-risk")
        check_alpha(self.delta, "delta")
        if self.score not in CONFORMAL_SCORES:
            raise ConfigError(f"unknown conformal score {self.score!r}; valid: {', '.join(CONFORMAL_SCORES)}")

    @property
    def active(self) -> bool:
        return self.coverage is not None or self.max_risk is not None


@dataclass(frozen=True)
class QueryUncertainty:
    """One query's calibrated answer."""

    p_first: float  # calibrated P(the first hit is a match)
    p_first_k: float  # calibrated P(a match among the first k)
    k: int
    coverage: Optional[float] = None  # the set's coverage, where one was asked for
    set_indices: Optional[np.ndarray] = None  # the set: positions in the query's scored videos, best first
    answered: Optional[bool] = None  # where a risk was asked: whether P(first) passes its threshold
    risk: Optional[RiskThreshold] = None


def conformal_threshold(cal: Calibration, coverage: float, score: str) -> float:
    """The calibration's quantile of ``score`` for a set of ``coverage``; one line where the calibration lacks
    the score or holds too few queries for it."""
    if score not in cal.conformal:
        why = " (it needs a Gaussian model's text variance)" if score == "normalized" else ""
        raise ConfigError(
            f"this calibration has no {score!r} score{why}; available: {', '.join(sorted(cal.conformal))}"
        )
    return conformal_quantile(np.asarray(cal.conformal[score]), 1.0 - check_alpha(coverage, "coverage"))


def risk_threshold(cal: Calibration, max_risk: float, delta: float) -> RiskThreshold:
    """Learn-then-Test on the calibration's held-out queries."""
    return learn_then_test(
        np.asarray(cal.risk["confidence"], np.float64), np.asarray(cal.risk["correct"], bool), max_risk, delta
    )


def assess(
    cal: Calibration,
    costs: Sequence[np.ndarray],
    text_var: Optional[np.ndarray] = None,
    request: UncertaintyRequest = UncertaintyRequest(),
) -> list[QueryUncertainty]:
    """Each query's calibrated answer from its costs over the videos it scored (``costs[i]`` (V_i,), +inf: not
    scored) and, for a Gaussian model, its text variance (M,)."""
    qhat = conformal_threshold(cal, request.coverage, request.score) if request.coverage is not None else None
    risk = risk_threshold(cal, request.max_risk, request.delta) if request.max_risk is not None else None
    out = []
    for i, row in enumerate(costs):
        c = np.asarray(row, np.float64)[None]  # (1, V)
        tv = None if text_var is None else np.asarray(text_var, np.float64)[i : i + 1]
        feats = query_features(c, cal.temperature, cal.k, tv if "log_text_var" in _read(cal) else None)
        p1, pk = nested_probabilities(cal.maps["first"], cal.maps["first_k"], feats)
        part = dict(p_first=float(p1[0]), p_first_k=float(pk[0]), k=cal.k)
        if qhat is not None:
            p = cost_softmax(c, cal.temperature)  # (1, V)
            lam, k_reg = cal.conformal_params["lam"], int(cal.conformal_params["k_reg"])
            s = conformal_scores(p, request.score, difficulty=tv, lam=lam, k_reg=k_reg)[0]  # (V,)
            inside = np.flatnonzero((s <= qhat) & np.isfinite(c[0]))
            part.update(coverage=request.coverage, set_indices=inside[np.argsort(c[0, inside], kind="stable")])
        if risk is not None:
            part.update(answered=risk.threshold is not None and part["p_first"] >= risk.threshold, risk=risk)
        out.append(QueryUncertainty(**part))
    return out


def _read(cal: Calibration) -> set[str]:
    """The features the calibration's maps read."""
    return {f for m in cal.maps.values() for f in m.features}
