"""What a calibration says of new queries: calibrated probabilities, conformal retrieval sets and whether a
query is answered under a risk guarantee (:func:`assess`), each from a query's costs over the gallery searched.

What holds (docs/uncertainty.md): a set of coverage 1 - alpha holds a match with probability at least 1 - alpha
for a random caption of a new video like the validation ones, searched in a gallery like the one calibrated on:
on average over queries, or, where the calibration has ``--groups``, within the query's band (or each of its
groups). The risk threshold keeps the error rate of the first hit among answered queries at most ``max_risk`` with
probability at least 1 - ``delta`` over the calibration draw, the video as the unit. Neither is a statement about
one query. A set always holds the first hit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from ..core.choices import DEFAULT_CONFORMAL_SCORE
from ..core.errors import ConfigError
from ..metrics.conditional import ConditionalQuantiles
from ..metrics.conformal import (
    CONFORMAL_SCORES,
    band_quantiles,
    check_alpha,
    conformal_scores,
    conformal_sets,
    cost_softmax,
    needed_calibration,
    weighted_quantile,
)
from ..metrics.risk import RiskThreshold, learn_then_test, risk_test_order
from .features import QueryFeatures, query_features
from .groups import Groups, parse_groups, query_signals
from .maps import nested_probabilities
from .record import Calibration

__all__ = [
    "CAVEAT_KINDS",
    "DEFAULT_CONFORMAL_SCORE",
    "DEFAULT_DELTA",
    "QueryUncertainty",
    "UncertaintyRequest",
    "assess",
]

DEFAULT_DELTA = 0.05


@dataclass(frozen=True)
class UncertaintyRequest:
    """What a search asks of a calibration: a set of this coverage, answers under this risk (or neither)."""

    coverage: Optional[float] = None  # in (0, 1): each query's set holds a match with this probability
    score: str = DEFAULT_CONFORMAL_SCORE  # the conformal score the set is built with
    max_risk: Optional[float] = None  # in (0, 1): error rate of the first hit among answered queries
    delta: float = DEFAULT_DELTA  # the risk guarantee fails with probability at most delta

    def __post_init__(self) -> None:
        """Every value checked here, once, and kept as a float: nothing downstream checks it again (issue 62)."""
        if self.coverage is not None:
            object.__setattr__(self, "coverage", check_alpha(self.coverage, "coverage"))
            if 1.0 - self.coverage >= 1.0:
                raise ConfigError(
                    f"coverage {self.coverage!r} is too small to mean anything (1 - coverage rounds to 1); "
                    "give a coverage in (0, 1) such as 0.9"
                )
        if self.max_risk is not None:
            object.__setattr__(self, "max_risk", check_alpha(self.max_risk, "max-risk"))
        object.__setattr__(self, "delta", check_alpha(self.delta, "delta"))
        if self.score not in CONFORMAL_SCORES:
            raise ConfigError(f"unknown conformal score {self.score!r}; valid: {', '.join(CONFORMAL_SCORES)}")

    @property
    def active(self) -> bool:
        return self.coverage is not None or self.max_risk is not None


_PROBABILITIES_ONLY = UncertaintyRequest()  # built once: nothing to check again a query

# a QueryUncertainty's caveat_kind: why its numbers are not what the calibration promises
CAVEAT_KINDS = {
    # a shortlist the run was not calibrated through, of any length: a search cannot check that it holds the
    # exhaustive first k0 videos its probabilities read ("set_shortlist", a shortlist of at least k0 whose
    # probabilities were said to hold, is no longer given: docs/uncertainty.md)
    "shortlist": "scored over a shortlist not calibrated through: nothing holds, nothing is decided",
    "gallery": "the gallery searched is not the one calibrated on: nothing holds, nothing is decided",
    # a run calibrated through an index searched through another first stage (none, another index, K or nprobe)
    "first_stage": "the first stage is not the one calibrated through: nothing holds, nothing is decided",
    "unknown_words": "every word of the query is unknown to the model: the numbers describe no query, no set",
}


@dataclass(frozen=True)
class QueryUncertainty:
    """One query's calibrated answer."""

    p_first: float  # calibrated P(the first hit is a match)
    p_first_k: float  # calibrated P(a match among the first first_k)
    first_k: int
    coverage: Optional[float] = None  # the set's coverage, where one was asked for
    set_indices: Optional[np.ndarray] = None  # the set: positions in the query's scored videos, best first
    answered: Optional[bool] = None  # where a risk was asked: whether P(first) passes its threshold
    risk: Optional[RiskThreshold] = None
    group: Optional[str] = None  # the query's group where the calibration has --groups ("uncertainty 3/3 ...")
    # what the set's coverage holds over: "marginal" (on average over queries), "band" (within the query's band,
    # Mondrian), "groups" (within each of its groups, conditional conformal); None without a set
    set_scope: Optional[str] = None
    scope_note: Optional[str] = None  # why a query with a group got a marginal set (its group too small)
    # why these numbers do not mean what the calibration promises: scored over a shortlist of the gallery calibrated
    # on (P(first) may not be the exhaustive one, the set covers less); None where they do
    caveat: Optional[str] = None
    # which caveat it is (CAVEAT_KINDS), for a reader that says it in a few words (dab search's lines) and needs
    # to know whether the probabilities still hold; None without a caveat
    caveat_kind: Optional[str] = None
    # the kind of P(first)'s map ("softmax": the raw softmax, nothing fitted) and how calibration.json got it
    # ("auto": least cross-validated log loss; else the --method asked for): what a "calibrated" label stands on
    first_map: Optional[str] = None
    map_method: Optional[str] = None

    @property
    def probabilities_hold(self) -> bool:
        """Whether p_first and p_first_k are the calibrated ones: only without a caveat."""
        return self.caveat_kind is None


def conformal_threshold(cal: Calibration, coverage: float, score: str) -> float:
    """The calibration's marginal quantile of ``score`` for a set of ``coverage`` (in (0, 1), as an
    :class:`UncertaintyRequest` checked it), every query weighted by one over its video's captions, computed once a
    calibration and kept in ``cal.cache``; one line where the calibration lacks the score or holds too few videos
    for it."""
    if score not in cal.conformal:
        why = " (it needs a Gaussian model's text variance)" if score == "normalized" else ""
        raise ConfigError(
            f"this calibration has no {score!r} score{why}; available: {', '.join(sorted(cal.conformal))}"
        )
    key = ("marginal", score, coverage)
    if key not in cal.cache:
        check_alpha(coverage, "coverage")  # a public function: checked once a calibration, as it is cached
        alpha = 1.0 - coverage
        rows = cal.quantile_rows()
        scores, w = cal.scores(score)[rows], np.asarray(cal.weights)[rows]
        q = weighted_quantile(scores, alpha, w)
        missed = int((~np.isfinite(scores)).sum())
        videos = float(w.sum())  # the calibration videos the quantile is over (all, or the held-out half's)
        too_few = (1.0 - alpha) * (videos + 1.0) - 1e-9 > videos  # not even with every match found
        if not np.isfinite(q) and missed and not too_few:
            raise ConfigError(
                f"coverage {coverage:g} cannot be reached through this first stage: its shortlist missed the match "
                f"of {missed} of the {len(scores)} calibration queries, more than the {1 - coverage:.0%} a set may "
                "miss; ask for less coverage, or calibrate with a larger --shortlist (or --nprobe)"
            )
        if not np.isfinite(q):
            raise ConfigError(
                f"{videos:.0f} calibration videos are too few for coverage {coverage:g}: at least "
                f"{needed_calibration(alpha)} are needed"
            )
        cal.cache[key] = q
    return cal.cache[key]


def risk_threshold(cal: Calibration, max_risk: float, delta: float) -> RiskThreshold:
    """Learn-then-Test on the calibration's held-out queries, the video as the unit, for ``max_risk`` and ``delta``
    in (0, 1) (an :class:`UncertaintyRequest`'s): computed once a calibration and kept in ``cal.cache``."""
    key = ("risk", max_risk, delta)
    if key not in cal.cache:
        check_alpha(max_risk, "max-risk")  # a public function: checked once a calibration, as it is cached
        check_alpha(delta, "delta")
        r, fit = cal.risk, cal.risk["fit"]
        order = risk_test_order(
            np.asarray(fit["confidence"], np.float64),
            np.asarray(fit["correct"], bool),
            np.asarray(fit["video"]),
            max_risk,
            delta,
            test=r["test"],
        )
        cal.cache[key] = learn_then_test(
            np.asarray(r["confidence"], np.float64),
            np.asarray(r["correct"], bool),
            max_risk,
            delta,
            video=np.asarray(r["video"]),
            test=r["test"],
            order=order,
        )
    return cal.cache[key]


def query_groups(
    cal: Calibration, margin: np.ndarray, text_var: Optional[np.ndarray], texts: Optional[Sequence[str]]
) -> Optional[dict[str, np.ndarray]]:
    """Each query's band per kind (Q,) where the calibration has groups; None where it has none."""
    if cal.groups is None:
        return None
    g = _groups_of(cal)
    tv = text_var if g.signal == "log_text_var" else None
    if g.signal == "log_text_var" and tv is None:
        raise ConfigError("this calibration's bands read the text variance, which this search did not give")
    return g.bands(query_signals([k for k, _ in g.spec.kinds], margin, tv, texts))


def _groups_of(cal: Calibration) -> Groups:
    spec = parse_groups(cal.groups["spec"])
    return Groups(spec, cal.groups["signal"], cal.groups["edges"])


def group_thresholds(
    cal: Calibration, coverage: float, score: str, bands: dict[str, np.ndarray]
) -> tuple[np.ndarray, list[Optional[str]]]:
    """Each query's quantile (Q,) from the held-out half's queries of its group (Mondrian: its band; conditional:
    every group it is in), and a note where its group holds too little calibration for ``coverage`` (the marginal
    quantile then, labelled). The quantiles per band (or the groups' program) are computed once a calibration and
    coverage, and kept in ``cal.cache``."""
    g = _groups_of(cal)
    alpha = 1.0 - coverage
    held = np.asarray(cal.held_out, bool)
    s = cal.scores(score)[held]  # (C,)
    w = np.asarray(cal.weights, np.float64)[held]  # (C,)
    cal_bands = {k: np.asarray(v, np.int64)[held] for k, v in cal.groups["bands"].items()}
    key = ("groups", score, coverage)
    if g.conditional:
        if key not in cal.cache:
            cal.cache[key] = ConditionalQuantiles(s, g.indicators(cal_bands), alpha, w)
        q = cal.cache[key].cutoffs(g.indicators(bands))  # (Q,)
    else:
        kind, count = g.spec.kinds[0]
        if key not in cal.cache:
            cal.cache[key] = band_quantiles(s, cal_bands[kind], count, alpha, w)  # (B,)
        q = cal.cache[key][bands[kind]]  # (Q,)
    notes: list[Optional[str]] = [None] * len(q)
    if not np.isfinite(q).all():
        marginal = conformal_threshold(cal, coverage, score)
        for i in np.flatnonzero(~np.isfinite(q)):
            notes[i] = (
                f"its group's calibration cannot reach {coverage:.0%} (too few videos, or matches the first stage "
                "missed): the marginal set instead"
            )
        q = np.where(np.isfinite(q), q, marginal)
    return q, notes


def assess(
    cal: Calibration,
    costs: Sequence[np.ndarray],
    text_var: Optional[np.ndarray] = None,
    request: Optional[UncertaintyRequest] = None,
    texts: Optional[Sequence[str]] = None,
) -> list[QueryUncertainty]:
    """Each query's calibrated answer from its costs over the videos it scored (``costs[i]`` (V_i,), +inf: not
    scored), for a Gaussian model its text variance (M,), and its text (M,) where the groups read its length.
    ``request``: the set and the risk decision asked for (None: the probabilities alone)."""
    request = request or _PROBABILITIES_ONLY
    qhat = conformal_threshold(cal, request.coverage, request.score) if request.coverage is not None else None
    risk = risk_threshold(cal, request.max_risk, request.delta) if request.max_risk is not None else None
    # a calibration made with a text variance reads it (its maps, its bands or the normalized score)
    uses_var = "normalized" in cal.conformal or "log_text_var" in _read(cal)
    tv_all = None if text_var is None or not uses_var else np.asarray(text_var, np.float64)
    rows = [np.asarray(row, np.float64)[None] for row in costs]  # each (1, V_i)
    feats = [
        query_features(c, cal.temperature, cal.first_k, None if tv_all is None else tv_all[i : i + 1], cal.k0)
        for i, c in enumerate(rows)
    ]
    bands = query_groups(cal, np.array([f.column("margin")[0] for f in feats]), tv_all, texts)
    groups = None if bands is None else _groups_of(cal)  # parsed once a call, not once a query
    labels = (
        [None] * len(rows)
        if groups is None
        else [groups.label({k: v[i] for k, v in bands.items()}) for i in range(len(rows))]
    )
    notes: list[Optional[str]] = [None] * len(rows)
    per_query = None
    if qhat is not None and bands is not None:
        per_query, notes = group_thresholds(cal, request.coverage, request.score, bands)
    scope = "marginal" if groups is None else ("groups" if groups.conditional else "band")
    return [
        _answer_one(
            cal,
            c,
            feats[i],
            None if tv_all is None else tv_all[i : i + 1],
            request,
            labels[i],
            (scope, notes[i], qhat if per_query is None else per_query[i]) if qhat is not None else None,
            risk,
        )
        for i, c in enumerate(rows)
    ]


def _answer_one(
    cal: Calibration,
    c: np.ndarray,
    feats: QueryFeatures,
    tv: Optional[np.ndarray],
    request: UncertaintyRequest,
    label: Optional[str],
    set_at: Optional[tuple[str, Optional[str], float]],
    risk: Optional[RiskThreshold],
) -> QueryUncertainty:
    """One query's answer from its costs ``c`` (1, V) and features: its probabilities, and where asked its set
    (``set_at``: the set's scope, the note of a group that fell back to the marginal set, its quantile) and its risk
    decision."""
    p1, pk = nested_probabilities(cal.maps["first"], cal.maps["first_k"], feats)
    caveat = shortlist_caveat(cal, c[0])
    part: dict[str, Any] = dict(
        p_first=float(p1[0]),
        p_first_k=float(pk[0]),
        first_k=cal.first_k,
        group=label,
        caveat=caveat,
        caveat_kind=None if caveat is None else "shortlist",
        first_map=cal.maps["first"].kind,
        map_method=cal.method,
    )
    if set_at is not None:
        scope, note, q = set_at
        p = cost_softmax(c, cal.temperature)  # (1, V)
        lam, k_reg = cal.conformal_params["lam"], int(cal.conformal_params["k_reg"])
        s = conformal_scores(p, request.score, difficulty=tv, lam=lam, k_reg=k_reg)  # (1, V)
        part.update(
            coverage=request.coverage,
            set_indices=conformal_sets(s, q, c)[0],
            set_scope="marginal" if note else scope,
            scope_note=note,
        )
    if risk is not None:
        # a probability from a shortlist is not the one the threshold was chosen on: no decision (issue 59)
        decided = None if caveat else risk.threshold is not None and part["p_first"] >= risk.threshold
        part.update(answered=decided, risk=risk)
    return QueryUncertainty(**part)


def shortlist_caveat(cal: Calibration, cost: np.ndarray) -> Optional[str]:
    """One line where a query's costs (V,) scored a shortlist of the gallery calibrated on, through a first stage
    the run was not calibrated through; None where it scored every video, or through that first stage.

    Such a shortlist's numbers are not the calibrated ones: the features read the first k0 costs, so a shortlist
    holding the exhaustive first k0 videos would give the exhaustive probabilities exactly, but a search cannot
    check that it does (the demo's "a large red circle" read 0.21 over a cosine shortlist of 30 that missed the
    exhaustive first hit, 0.17 over every video); a set over it covers less than asked. Fewer than k0 scored,
    P(first) reads high whatever the shortlist holds. The line says how to get calibrated numbers: a cosine
    shortlist (the whole split's costs, +inf where unscored) by searching every video, an index's (its K
    videos' costs only) by calibrating through it."""
    if cal.provenance.get(
        "index"
    ):  # calibrated through its first stage: a search refuses a set or a decision through another
        return None
    cost = np.asarray(cost, np.float64)
    calibrated_on = int(cal.gallery.get("videos") or 0)  # 0: a calibration that did not record its gallery
    scored = int(np.isfinite(cost).sum())
    if calibrated_on:
        if scored >= calibrated_on:
            return None
    elif scored == len(cost) and scored >= cal.k0:  # every video given was scored, at least the k0 read
        return None
    of = f" of the {calibrated_on} videos calibrated on" if calibrated_on else ""
    if scored < cal.k0:
        what = f"a shortlist of {scored}{of}, fewer than the {cal.k0} the probabilities read"
    else:
        what = f"a shortlist of {scored}{of} may miss the first {cal.k0} the probabilities read"
    if calibrated_on and len(cost) < calibrated_on:  # an index's shortlist: its K videos' costs only
        fix = f"calibrate through it (dab calibrate --index INDEX --shortlist {len(cost)}; docs/uncertainty.md)"
    else:  # a cosine shortlist: no calibration goes through one
        fix = "search every video"
    return f"{what}: {fix}"


def _read(cal: Calibration) -> set[str]:
    """The features the calibration's maps read."""
    return {f for m in cal.maps.values() for f in m.features}
