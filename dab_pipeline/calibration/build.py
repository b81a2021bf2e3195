"""A calibration from one split's costs: the probability maps, the conformal scores and the risk check.

The validation queries are split at random (``seed``) into two disjoint halves. The maps are fitted on the
first; the second holds out: the figures printed are its own, and the risk threshold is chosen on its
calibrated confidences, which the maps never saw (Learn-then-Test needs a confidence fixed before its
calibration data). The conformal scores need no fitted map (they read the softmax at the run's temperature and
the model's own text variance), so they use every validation query.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..core.choices import DEFAULT_CALIBRATION_METHOD
from ..core.errors import ConfigError
from ..metrics.calibration import calibration_report
from ..metrics.conformal import CONFORMAL_SCORES, conformal_scores, cost_softmax
from .features import DEFAULT_K, first_hit_outcomes, query_features
from .fit import fit_map
from .maps import MAP_KINDS, nested_probabilities
from .record import Calibration

__all__ = ["DEFAULT_METHOD", "METHODS", "MIN_QUERIES", "calibrate_costs", "true_video_scores"]

METHODS = MAP_KINDS
DEFAULT_METHOD = DEFAULT_CALIBRATION_METHOD
MIN_QUERIES = 4  # two to fit on, two held out: below this nothing can be said


def true_video_scores(
    cost: np.ndarray,
    gt: np.ndarray,
    temperature: float,
    text_var: Optional[np.ndarray],
    lam: float = 0.01,
    k_reg: int = 5,
) -> dict[str, np.ndarray]:
    """Each conformal score of each query's matching video (Q,) (the ``normalized`` score only with a text
    variance)."""
    p = cost_softmax(cost, temperature)  # (Q, V)
    rows = np.arange(len(p))
    out = {}
    for name in CONFORMAL_SCORES:
        if name == "normalized" and text_var is None:
            continue
        s = conformal_scores(p, name, difficulty=text_var, lam=lam, k_reg=k_reg)  # (Q, V)
        out[name] = s[rows, np.asarray(gt, np.int64)]
    return out


def calibrate_costs(
    cost: np.ndarray,
    gt: np.ndarray,
    temperature: float,
    text_var: Optional[np.ndarray] = None,
    *,
    method: str = DEFAULT_METHOD,
    k: int = DEFAULT_K,
    seed: int = 0,
    lam: float = 0.01,
    k_reg: int = 5,
) -> Calibration:
    """A :class:`Calibration` (without provenance) from the costs of Q queries over a gallery (Q, V), each
    query's matching video ``gt`` (Q,) and, for a Gaussian model, its text variance (Q,)."""
    if method not in METHODS:
        raise ConfigError(f"unknown calibration method {method!r}; valid: {', '.join(METHODS)}")
    cost = np.asarray(cost, np.float64)
    n = len(cost)
    if n < MIN_QUERIES:
        raise ConfigError(f"{n} validation queries are too few to calibrate on: at least {MIN_QUERIES} are needed")
    feats = query_features(cost, temperature, k, text_var)
    first, first_k = first_hit_outcomes(cost, gt, k)  # (Q,) each
    order = np.random.default_rng(seed).permutation(n)
    fit, check = np.sort(order[: n // 2]), np.sort(order[n // 2 :])
    sub = lambda f, idx: type(f)(f.names, f.values[idx])  # noqa: E731
    maps = {
        "first": fit_map(sub(feats, fit), first[fit], method),
        "first_k": fit_map(sub(feats, fit), first_k[fit], method),
        "margin_sigmoid": fit_map(sub(feats, fit), first[fit], "logistic", ("margin",)),
    }
    held = sub(feats, check)
    p_first, p_first_k = nested_probabilities(maps["first"], maps["first_k"], held)  # (C,) each
    report = {
        "first": {
            "calibrated": calibration_report(p_first, first[check]),
            "margin_sigmoid": calibration_report(maps["margin_sigmoid"].predict(held), first[check]),
            "softmax": calibration_report(held.column("p_first"), first[check]),
        },
        "first_k": {
            "calibrated": calibration_report(p_first_k, first_k[check]),
            "softmax": calibration_report(held.column("p_first_k"), first_k[check]),
        },
    }
    scores = true_video_scores(cost, gt, temperature, text_var, lam, k_reg)
    return Calibration(
        method=method,
        k=k,
        temperature=float(temperature),
        queries=n,
        fit_queries=len(fit),
        check_queries=len(check),
        seed=seed,
        maps=maps,
        conformal={name: np.sort(s).tolist() for name, s in scores.items()},
        conformal_params={"lam": lam, "k_reg": k_reg},
        risk={"confidence": p_first.tolist(), "correct": first[check].astype(int).tolist()},
        report=report,
    )
