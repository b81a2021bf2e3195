"""A calibration from one split's costs: the probability maps, the conformal scores and the risk check.

The validation *videos* are split at random (``seed``) into two disjoint halves, each video's captions going
together (captions of one video are not independent: the video is the unit). The maps, and the band edges of any
``groups``, are fitted on the first half; the second holds out: the figures printed are its own, the risk threshold
is chosen on its calibrated confidences, which the maps never saw (Learn-then-Test needs a confidence fixed before
its calibration data), and the per-group quantiles come from it alone. The marginal conformal quantile needs no
fitted map (it reads the softmax at the run's temperature and the model's own text variance), so it uses every
validation query. Every query is weighted by one over its video's captions.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..core.choices import CALIBRATION_METHODS, DEFAULT_CALIBRATION_METHOD
from ..core.errors import ConfigError
from ..metrics.calibration import calibration_report, top_bins
from ..metrics.conformal import CONFORMAL_SCORES, conformal_scores, cost_softmax, video_weights
from .features import DEFAULT_FIRST_K, DEFAULT_K0, first_hit_outcomes, query_features
from .fit import choose_map, fit_map
from .groups import Groups, GroupSpec, query_signals
from .maps import nested_probabilities
from .record import Calibration

__all__ = ["MIN_QUERIES", "calibrate_costs", "true_video_scores"]

MIN_QUERIES = 4  # two to fit on, two held out: below this nothing can be said
MIN_VIDEOS = 2  # one video a half


def split_videos(video: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fitted, held-out) query indices (ascending), the videos split at random into halves (the held-out half
    gets the odd one)."""
    ids, inverse = np.unique(np.asarray(video).ravel(), return_inverse=True)
    order = np.random.default_rng(seed).permutation(len(ids))
    fit_videos = np.zeros(len(ids), bool)
    fit_videos[order[: len(ids) // 2]] = True
    in_fit = fit_videos[inverse]  # (Q,)
    return np.flatnonzero(in_fit), np.flatnonzero(~in_fit)


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
    gt = np.asarray(gt, np.int64)
    missed = ~np.isfinite(np.asarray(cost, np.float64)[rows, gt])  # (Q,) a first stage's shortlist left it out
    out = {}
    for name in CONFORMAL_SCORES:
        if name == "normalized" and text_var is None:
            continue
        s = conformal_scores(p, name, difficulty=text_var, lam=lam, k_reg=k_reg)  # (Q, V)
        out[name] = np.where(missed, np.inf, s[rows, gt])  # a missed match is outside every set
    return out


def calibrate_costs(
    cost: np.ndarray,
    gt: np.ndarray,
    temperature: float,
    text_var: Optional[np.ndarray] = None,
    *,
    method: str = DEFAULT_CALIBRATION_METHOD,
    first_k: int = DEFAULT_FIRST_K,
    seed: int = 0,
    lam: float = 0.01,
    k_reg: int = 5,
    video: Optional[np.ndarray] = None,
    groups: Optional[GroupSpec] = None,
    texts: Optional[list[str]] = None,
    k0: int = DEFAULT_K0,
) -> Calibration:
    """A :class:`Calibration` (without provenance) from the costs of Q queries over a gallery (Q, V), each
    query's matching video ``gt`` (Q,) and, for a Gaussian model, its text variance (Q,). ``video`` (Q,): each
    query's video, the unit (default ``gt``: the matching video); ``groups`` with ``texts`` (each query's
    caption, for ``length``): the groups whose coverage the calibration holds (:mod:`.groups`). ``method``: a map
    kind, or ``auto``: each target's of least cross-validated log loss on the fitted half (:func:`choose_map`);
    ``k0``: the first costs the features read (:mod:`.features`)."""
    cost = np.asarray(cost, np.float64)
    video = _checked_videos(cost, gt, video, method)
    feats = query_features(cost, temperature, first_k, text_var, k0)
    first, in_first_k = first_hit_outcomes(cost, gt, first_k)  # (Q,) each
    fit, check = split_videos(video, seed)
    chosen = _choose(feats, first, in_first_k, video, fit, method, first_k, temperature)
    maps, report, p_check, p_fit = _fit_maps(feats, first, in_first_k, fit, check, chosen, first_k, temperature)
    scores = true_video_scores(cost, gt, temperature, text_var, lam, k_reg)
    held_out = np.zeros(len(cost), np.int64)
    held_out[check] = 1
    return Calibration(
        method=method,
        first_k=first_k,
        k0=k0,
        temperature=float(temperature),
        queries=len(cost),
        videos=int(len(np.unique(video))),
        fit_queries=len(fit),
        check_queries=len(check),
        seed=seed,
        maps=maps,
        # +inf (a match the first stage missed) is written as null: JSON holds no Infinity
        conformal={name: [float(x) if np.isfinite(x) else None for x in s] for name, s in scores.items()},
        weights=video_weights(video).tolist(),
        held_out=held_out.tolist(),
        conformal_params={"lam": lam, "k_reg": k_reg},
        risk={
            **_outcomes(p_check, first[check], video[check]),
            "test": "wsr",
            # the fitted half's own (in-sample) confidences: only the order in which the thresholds are tested
            "fit": _outcomes(p_fit, first[fit], video[fit]),
        },
        report=report,
        groups=None if groups is None else _groups(groups, feats, text_var, texts, fit),
    )


def _checked_videos(cost: np.ndarray, gt: np.ndarray, video: Optional[np.ndarray], method: str) -> np.ndarray:
    """Each query's video (Q,) (default: its match), after one-line refusals of what cannot be calibrated."""
    if method not in CALIBRATION_METHODS:
        raise ConfigError(f"unknown calibration method {method!r}; valid: {', '.join(CALIBRATION_METHODS)}")
    n = len(cost)
    video = np.asarray(gt if video is None else video).ravel()
    if len(video) != n:
        raise ConfigError(f"{len(video)} video ids for {n} queries")
    if n < MIN_QUERIES or len(np.unique(video)) < MIN_VIDEOS:
        raise ConfigError(
            f"{n} validation queries of {len(np.unique(video))} videos are too few to calibrate on: at least "
            f"{MIN_QUERIES} queries of {MIN_VIDEOS} videos are needed"
        )
    return video


def _choose(feats, first, in_first_k, video, fit, method, first_k, temperature) -> dict[str, tuple[str, dict]]:
    """Each target's map kind and the cross-validated log losses behind the choice (none for a kind given)."""
    wrong = fit[~first[fit]]
    if method != "auto":  # a kind asked for; the conditional map needs queries whose first hit is wrong
        return {"first": (method, {}), "first_k": (method if len(wrong) else "softmax", {})}
    # first_k is fitted on the queries whose first hit is wrong (conditional)
    return {
        "first": choose_map(feats.rows(fit), first[fit], video[fit], "first", first_k, temperature),
        "first_k": choose_map(feats.rows(wrong), in_first_k[wrong], video[wrong], "first_k", first_k, temperature),
    }


def _fit_maps(
    feats, first, in_first_k, fit, check, chosen, first_k, temperature
) -> tuple[dict, dict, np.ndarray, np.ndarray]:
    """(the maps fitted on ``fit``, the held-out figures on ``check``, P(first) of the held-out queries, P(first)
    of the fitted ones, in-sample)."""
    sub = feats.rows
    kw = dict(first_k=first_k, temperature=temperature)
    wrong = fit[~first[fit]]
    maps = {
        "first": fit_map(sub(fit), first[fit], chosen["first"][0], target="first", **kw),
        # P(a match in the first k | the first hit is not one): nested under P(first) by construction
        "first_k": fit_map(sub(wrong), in_first_k[wrong], chosen["first_k"][0], target="first_k", **kw),
        "margin_sigmoid": fit_map(sub(fit), first[fit], "logistic", ("margin",)),
    }
    held = sub(check)
    p_first, p_first_k = nested_probabilities(maps["first"], maps["first_k"], held)  # (C,) each
    report = {
        "first": {
            "calibrated": calibration_report(p_first, first[check]),
            "margin_sigmoid": calibration_report(maps["margin_sigmoid"].predict(held), first[check]),
            "softmax": calibration_report(held.column("softmax_first"), first[check]),
        },
        "first_k": {
            "calibrated": calibration_report(p_first_k, in_first_k[check]),
            "softmax": calibration_report(held.column("softmax_first_k"), in_first_k[check]),
        },
        # the map chosen for each target and why (cross-validated log loss on the fitted half; empty: given)
        "selection": {name: {"chosen": kind, "cv_log_loss": losses} for name, (kind, losses) in chosen.items()},
        # where the probabilities are used (risk thresholds): P(first) >= 0.5, bins of at least 100 queries
        "top_bins": {
            "calibrated": top_bins(p_first, first[check]),
            "softmax": top_bins(held.column("softmax_first"), first[check]),
        },
    }
    p_fit, _ = nested_probabilities(maps["first"], maps["first_k"], sub(fit))  # (F,)
    return maps, report, p_first, p_fit


def _outcomes(confidence: np.ndarray, correct: np.ndarray, video: np.ndarray) -> dict[str, list]:
    """The risk block's columns, as JSON (a video id a query: int or str)."""
    ids = [v.item() if hasattr(v, "item") else v for v in video]
    return {
        "confidence": confidence.tolist(),
        "correct": correct.astype(int).tolist(),
        "video": [v if isinstance(v, (int, str)) else str(v) for v in ids],
    }


def _groups(spec: GroupSpec, feats, text_var, texts, fit: np.ndarray) -> dict:
    """The groups' edges (from the fitted half) and every query's band per kind."""
    kinds = [kind for kind, _ in spec.kinds]
    signals = query_signals(kinds, feats.column("margin"), text_var, texts)  # kind -> (Q,)
    g = Groups.fit(spec, {kind: v[fit] for kind, v in signals.items()}, _signal_name(text_var))
    return {**g.to_dict(), "bands": {kind: b.tolist() for kind, b in g.bands(signals).items()}}


def _signal_name(text_var: Optional[np.ndarray]) -> str:
    return "log_text_var" if text_var is not None else "minus_margin"
