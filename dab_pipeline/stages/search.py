"""``dab search``: the best videos of a store's split for free-text queries, with a trained run.

The search itself is library code (:class:`dab_pipeline.search.Searcher`, shared with ``dab serve``); this
stage is its one-shot entry, shaped like the others: :class:`SearchConfig` and :func:`run_search`, which also
writes the results as a page (``dab search --html``) while the store is open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..calibration import DEFAULT_CONFORMAL_SCORE, DEFAULT_DELTA, UncertaintyRequest
from ..core.choices import DEFAULT_SCORE_DTYPE
from ..core.location import StoreURL, location
from ..results.page import build_queries, render_page
from ..scoring.first_stage import check_shortlist
from ..search import (
    Searcher,
    SearcherOptions,
    SearchResult,
    check_queries,
    load_descriptions,
    open_searcher,
    uncertainty_payload,
)

__all__ = ["SearchConfig", "run_search"]


@dataclass(frozen=True)
class SearchConfig:
    """One ``dab search``: the run, the store, the queries and how they are ranked; checked when it is built, before
    anything loads.

    ``index``: a ``dab index`` folder as the first stage (then ``shortlist`` defaults to 100 and only those videos
    are read); ``shortlist`` without an index: a cosine first stage over the split in memory. ``dtype``
    (``float32``: exact, the default; ``bfloat16``; ``auto``) is resolved for the device first
    (:func:`dab_pipeline.runtime.capabilities.resolve_score_dtype`): bf16 asked where it is not native runs in
    float32 and :func:`run_search`'s ``warn`` gets the reason. A calibrated run (``dab calibrate``) gives each
    result its calibrated probabilities; ``coverage`` asks for each query's conformal set (``conformal_score``:
    lac, aps, raps, normalized), ``max_risk`` for answers whose first hit errs at most that often (with
    probability 1 - ``delta``): docs/uncertainty.md. Paths may be given as strings, ``features`` as an fsspec URL,
    the queries as any sequence."""

    run: Path
    features: Path | StoreURL
    queries: tuple[str, ...]
    k: int = 10
    split: str = "test"
    device: str = "auto"
    dtype: str = DEFAULT_SCORE_DTYPE
    shortlist: Optional[int] = None
    index: Optional[Path] = None
    nprobe: Optional[int] = None
    memory_budget: Optional[int] = None
    # with a calibrated run (`dab calibrate`): a conformal set of this coverage, answers under this risk
    coverage: Optional[float] = None
    conformal_score: str = DEFAULT_CONFORMAL_SCORE
    max_risk: Optional[float] = None
    delta: float = DEFAULT_DELTA
    # also write a page of the results (thumbnails from the store, costs, margins), ``descriptions`` beside the hits
    html: Optional[Path] = None
    descriptions: Optional[Path] = None
    # what the search asks of the calibration: coverage, conformal_score, max_risk and delta, checked once, here
    uncertainty: UncertaintyRequest = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "run", Path(self.run))
        object.__setattr__(self, "features", location(self.features))
        object.__setattr__(self, "queries", tuple(check_queries(self.queries, self.k)))  # refused before a tuple
        for name in ("index", "html", "descriptions"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        if self.shortlist is not None:  # before anything loads (first_stage checks it too: a Python caller's)
            check_shortlist(self.shortlist)
        # built (and checked) once: a coverage or risk outside (0, 1) is refused before anything loads
        request = UncertaintyRequest(self.coverage, self.conformal_score, self.max_risk, self.delta)
        object.__setattr__(self, "uncertainty", request)

    def searcher_options(self) -> SearcherOptions:
        """What the search's Searcher opens."""
        return SearcherOptions(self.run, self.features, self.split, self.index, self.device, self.dtype)


def run_search(cfg: SearchConfig, warn: Callable[[str], None] = lambda message: None) -> list[SearchResult]:
    """Each query's ``cfg.k`` videos, best first, with its margin: a one-shot :class:`~dab_pipeline.search.Searcher`;
    with ``cfg.html``, the results written there as a page too."""
    about = load_descriptions(cfg.descriptions) if cfg.html is not None and cfg.descriptions else {}
    with open_searcher(cfg.searcher_options(), warn=warn) as s:
        results = s.search(
            list(cfg.queries),
            cfg.k,
            shortlist=cfg.shortlist,
            nprobe=cfg.nprobe,
            memory_budget=cfg.memory_budget,
            uncertainty=cfg.uncertainty,
        )
        if cfg.html is not None:
            _write_page(cfg, cfg.html, s, results, about)
    return results


def _write_page(cfg: SearchConfig, path: Path, s: Searcher, results: list[SearchResult], about: dict) -> Path:
    """The free-text queries' results as an examples page (no ground truth to mark): each query's top k with
    thumbnails, captions (``about``'s descriptions first), costs and margin, a plot of its costs, and where the run
    is calibrated its calibrated answer (probabilities, conformal set, risk decision) as dab serve's page shows it."""
    # with an index every query scored its own shortlist: the union of the videos, +inf where not scored
    videos = np.unique(np.concatenate([np.asarray(r.video_ids) for r in results]))  # (V,)
    cost = np.full((len(results), len(videos)), np.inf, np.float32)  # (M, V)
    for i, r in enumerate(results):
        cost[i, np.searchsorted(videos, np.asarray(r.video_ids))] = r.costs
    thumbs, captions = _store_context(s, results)
    queries = build_queries(
        cost,
        range(len(results)),
        [r.query for r in results],
        videos,
        thumbs=thumbs,
        captions={**captions, **about},  # a description (world ground truth) says more than a caption
        k=cfg.k,
        plots=bool(np.isfinite(cost).all()),
    )
    for q, r in zip(queries, results):
        q.unknown_words = r.unknown_words
        q.add_uncertainty(uncertainty_payload(r))  # as dab serve's page shows it: probabilities, set, risk decision
    summary = [("run", str(cfg.run)), ("store", str(cfg.features)), ("videos searched", str(len(videos)))]
    asked = [f"coverage {cfg.coverage:g} ({cfg.conformal_score})"] if cfg.coverage is not None else []
    asked += [f"max risk {cfg.max_risk:g} (delta {cfg.delta:g})"] if cfg.max_risk is not None else []
    if asked:
        summary.append(("asked of the calibration", ", ".join(asked)))
    return render_page(path, f"dab search: {len(results)} queries", summary, queries)


def _store_context(s: Searcher, results: list[SearchResult]) -> tuple[dict, dict]:
    """The thumbnails and first captions of every video the results scored, by video id, from the open store."""
    row_of = {str(v): int(s.rows[p]) for r in results for v, p in zip(r.video_ids, r.positions)}
    ids = sorted(row_of, key=row_of.__getitem__)  # in store order: the reads coalesce
    thumbs = dict(zip(ids, s.store.read_thumbnails([row_of[v] for v in ids])))
    first, text = s.store.first_caption_rows(), s.store.caption_text  # (N,), (M,)
    return thumbs, {v: str(text[first[row_of[v]]]) for v in ids if first[row_of[v]] >= 0}
