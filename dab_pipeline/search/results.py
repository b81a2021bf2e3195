"""What a search returns (:class:`SearchResult`, :class:`SearchHit`) and how a scored row becomes one."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..calibration import QueryUncertainty
from ..core.errors import ConfigError

__all__ = ["SearchHit", "SearchResult", "check_queries", "result_payload", "uncertainty_payload"]


@dataclass(frozen=True)
class SearchHit:
    """One retrieved video."""

    rank: int  # 1-based
    video_index: int  # row of the video in the split
    video_id: str
    cost: float  # lower is better (KL / W2 for prob/dab, -cos for xpool/bridge)


@dataclass
class SearchResult:
    """A query's ranked videos and its margin."""

    query: str
    hits: list[SearchHit]
    # best-vs-second-best cost gap over the whole split (the paper's top-1/top-2 KL
    # margin for KL runs); larger is more confident; None with fewer than 2 videos
    margin: Optional[float]
    # the costs of the videos scored for this query (V,) and their ids, for result pages: the whole split
    # (+inf outside a cosine shortlist), or with an index only the K shortlisted videos
    costs: Optional[np.ndarray] = None
    video_ids: Optional[np.ndarray] = None
    shortlist: Optional[int] = None  # K videos re-ranked (None: every video of the split scored)
    # words of the query the store's CLIP has no embedding for (a compact-vocabulary model such as dab-world):
    # each was read as a blank (a zero embedding, which still moves the ranking); empty for a model that knows
    # every word
    unknown_words: tuple[str, ...] = ()
    # the positions in the split of the videos of ``costs`` (V,)
    positions: Optional[np.ndarray] = None
    # with a calibrated run (``dab calibrate``): the calibrated probabilities, and the conformal set and the
    # risk decision where a search asked for them (docs/uncertainty.md); None for a run without calibration.json
    uncertainty: Optional[QueryUncertainty] = None
    text_var: Optional[float] = None  # the query's text variance (a calibrated Gaussian run), for a re-assessment

    @property
    def coverage_set(self) -> Optional[list[SearchHit]]:
        """The conformal set asked for (``coverage=``), best first; None where none was asked for."""
        u = self.uncertainty
        if u is None or u.set_indices is None:
            return None
        assert self.costs is not None and self.video_ids is not None and self.positions is not None
        return [
            SearchHit(
                rank=r + 1,
                video_index=int(self.positions[j]),
                video_id=str(self.video_ids[j]),
                cost=float(self.costs[j]),
            )
            for r, j in enumerate(u.set_indices)
        ]


@dataclass
class Ranked:
    """The parts of a ScoreResult that :func:`make_result` reads."""

    cost: np.ndarray  # (M, V)
    topk_indices: np.ndarray  # (M, k)
    topk_costs: np.ndarray  # (M, k)


def tick(timings: dict, name: str, t0: float) -> float:
    """Add the seconds since ``t0`` to ``timings[name]``; returns now."""
    now = time.perf_counter()
    timings[name] = timings.get(name, 0.0) + now - t0
    return now


def check_queries(queries: Sequence[str], k: int) -> list[str]:
    """The queries as strings; ConfigError for none, an empty one, or a ``k`` below 1 (a shortlist is
    :func:`~dab_pipeline.scoring.first_stage.check_shortlist`'s). One string is refused, not read as a sequence
    of one-letter queries."""
    if isinstance(queries, str):
        raise ConfigError(f"queries must be a list of strings, not one string: give [{queries!r}]")
    queries = [str(q) for q in queries]
    if not queries or any(not q.strip() for q in queries):
        raise ConfigError("dab search needs at least one non-empty query")
    if k < 1:
        raise ConfigError(f"k must be a positive integer, got {k}")
    return queries


def make_result(
    query: str, res, i: int, ids: np.ndarray, split_pos: np.ndarray, k: int, shortlist: Optional[int]
) -> SearchResult:
    """Row ``i`` of a ScoreResult over the videos ``ids`` (their positions in the split: ``split_pos``)."""
    assert res.topk_indices is not None and res.topk_costs is not None
    idx, costs = res.topk_indices[i], res.topk_costs[i]
    margin = float(costs[1] - costs[0]) if len(ids) >= 2 and np.isfinite(costs[:2]).all() else None
    # a video outside a cosine shortlist was not scored (+inf): never a hit
    hits = [
        SearchHit(rank=r + 1, video_index=int(split_pos[j]), video_id=str(ids[j]), cost=float(c))
        for r, (j, c) in enumerate(zip(idx[:k], costs[:k]))
        if np.isfinite(c)
    ]
    row = np.asarray(res.cost[i], np.float32) if res.cost is not None else None
    return SearchResult(
        query=query,
        hits=hits,
        margin=margin,
        costs=row,
        video_ids=np.asarray(ids),
        shortlist=shortlist,
        positions=np.asarray(split_pos),
    )


def uncertainty_payload(result: SearchResult) -> Optional[dict]:
    """A result's calibrated answer as JSON (``dab search --json``, ``dab serve``'s API); None without one."""
    u = result.uncertainty
    if u is None:
        return None
    # p_first and p_first_<k> are kept where they do not hold (probabilities_hold false), for the readers that read
    # them before that key: a query of no known word's describe no query (dab search and the pages show none)
    out: dict = {"p_first": u.p_first, f"p_first_{u.first_k}": u.p_first_k, "k": u.first_k}
    # which of calibration/assess.py's CAVEAT_KINDS keeps these numbers from the calibrated ones (None: none), and
    # whether p_first and p_first_<k> still hold (only without a caveat)
    out["caveat_kind"] = u.caveat_kind
    out["probabilities_hold"] = u.probabilities_hold
    if u.caveat is not None:
        # why these numbers are not the calibrated ones (a shortlist, another gallery or first stage, every word unknown)
        out["caveat"] = u.caveat
    if u.group is not None:
        out["group"] = u.group  # the band (or groups) the query fell in, where the calibration has --groups
    hits = result.coverage_set
    if hits is not None:
        out["coverage"] = u.coverage
        # what the coverage holds over: marginal (on average), band (within the query's band), groups (each group)
        out["set_scope"] = u.set_scope
        if u.scope_note:
            out["scope_note"] = u.scope_note
        out["set"] = [{"rank": h.rank, "video_id": h.video_id, "cost": h.cost} for h in hits]
    if u.risk is not None:
        out["answered"] = u.answered
        r = u.risk
        out["risk"] = {
            "max_risk": r.alpha,
            "delta": r.delta,
            # a value of the grid the test chose from (0.995, 0.99, ...): as the grid writes it, not 0.18499999999999994
            "threshold": None if r.threshold is None else round(r.threshold, 6),
            "answered_share_on_calibration": r.answered_share,
            "held_out": {"queries": r.queries, "videos": r.videos},  # what the test counted (the video is the unit)
        }
    return out


def result_payload(result: SearchResult, descriptions: Optional[dict] = None) -> dict:
    """A result as JSON (``dab search --json``; ``dab serve``'s API adds its own fields): the query, its margin,
    the words the model cannot read, the calibrated answer where there is one, and the hits (each video's
    description where ``descriptions`` has them)."""
    return {
        "query": result.query,
        "margin": result.margin,
        "unknown_words": list(result.unknown_words),
        **({"uncertainty": uncertainty_payload(result)} if result.uncertainty is not None else {}),
        "hits": [
            {
                "rank": h.rank,
                "video_id": h.video_id,
                "cost": h.cost,
                **({"description": descriptions.get(h.video_id)} if descriptions else {}),
            }
            for h in result.hits
        ],
    }
