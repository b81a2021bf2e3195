"""``dab search``: the best videos of a store's split for free-text queries, with a trained run.

The search itself is library code (:class:`dab_pipeline.search.Searcher`, shared with ``dab serve``); this
stage is its one-shot entry, shaped like the others: :class:`SearchConfig`, :func:`run_search`, and
:func:`search`, the same from keyword values (what the CLI calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..calibration import DEFAULT_CONFORMAL_SCORE, DEFAULT_DELTA, UncertaintyRequest
from ..core.choices import DEFAULT_SCORE_DTYPE
from ..core.location import location
from ..search import SearcherOptions, SearchResult, check_queries, open_searcher

__all__ = ["SearchConfig", "run_search", "search"]


@dataclass(frozen=True)
class SearchConfig:
    """One ``dab search``: the run, the store, the queries and how they are ranked (the arguments of
    :func:`search`); the queries are checked when it is built, before anything loads."""

    run: Path
    features: Path
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

    def __post_init__(self) -> None:
        check_queries(self.queries, self.k, self.shortlist)
        _ = self.uncertainty  # a coverage or risk outside (0, 1) is refused before anything loads

    @property
    def uncertainty(self) -> UncertaintyRequest:
        return UncertaintyRequest(self.coverage, self.conformal_score, self.max_risk, self.delta)

    @property
    def searcher_options(self) -> SearcherOptions:
        return SearcherOptions(self.run, self.features, self.split, self.index, self.device, self.dtype)


def run_search(cfg: SearchConfig, warn: Callable[[str], None] = lambda message: None) -> list[SearchResult]:
    """Each query's ``cfg.k`` videos, best first, with its margin: a one-shot :class:`~dab_pipeline.search.Searcher`."""
    with open_searcher(cfg.searcher_options, warn=warn) as s:
        return s.search(
            list(cfg.queries),
            cfg.k,
            shortlist=cfg.shortlist,
            nprobe=cfg.nprobe,
            memory_budget=cfg.memory_budget,
            uncertainty=cfg.uncertainty,
        )


def search(
    run_dir: str | Path,
    store_path: str | Path,
    queries: Sequence[str],
    k: int = 10,
    split: str = "test",
    device: str = "auto",
    *,
    dtype: str = DEFAULT_SCORE_DTYPE,
    shortlist: Optional[int] = None,
    index: str | Path | None = None,
    nprobe: Optional[int] = None,
    memory_budget: Optional[int] = None,
    coverage: Optional[float] = None,
    conformal_score: str = DEFAULT_CONFORMAL_SCORE,
    max_risk: Optional[float] = None,
    delta: float = DEFAULT_DELTA,
    warn: Callable[[str], None] = lambda message: None,
) -> list[SearchResult]:
    """The ``k`` videos of ``split`` for each free-text query, best first, with each query's margin.

    One-shot :class:`~dab_pipeline.search.Searcher`. ``index``: a ``dab index`` folder as the first stage (then ``shortlist``
    defaults to 100 and only those videos are read); ``shortlist`` without an index: a cosine first stage over
    the split in memory. ``dtype`` (``float32``: exact, the default; ``bfloat16``; ``auto``) is resolved for the
    device first (:func:`dab_pipeline.runtime.capabilities.resolve_score_dtype`): bf16 asked where it is not
    native runs in float32 and ``warn`` gets the reason. A calibrated run (``dab calibrate``) gives each result its
    calibrated probabilities; ``coverage`` asks for each query's conformal set (``conformal_score``: lac, aps,
    raps, normalized), ``max_risk`` for answers whose first hit errs at most that often (with probability
    1 - ``delta``): docs/uncertainty.md.
    """
    cfg = SearchConfig(
        run=Path(run_dir),
        features=location(store_path),
        queries=tuple(queries),
        k=k,
        split=split,
        device=device,
        dtype=dtype,
        shortlist=shortlist,
        index=None if index is None else Path(index),
        nprobe=nprobe,
        memory_budget=memory_budget,
        coverage=coverage,
        conformal_score=conformal_score,
        max_risk=max_risk,
        delta=delta,
    )
    return run_search(cfg, warn)
