"""``dab calibrate``: a run's validation queries scored against a gallery, and what the costs say of a match,
fitted and written as the run's calibration.json (:mod:`dab_pipeline.calibration`, docs/uncertainty.md)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..calibration import (
    CALIBRATION_FILE,
    DEFAULT_FIRST_K,
    DEFAULT_K0,
    Calibration,
    calibrate_costs,
    text_variance,
    write_calibration,
)
from ..calibration.build import split_videos
from ..calibration.fit import library_versions, require_sklearn
from ..calibration.groups import describe_groups, parse_groups
from ..calibration.record import video_ids_digest
from ..core.choices import CALIBRATION_METHODS, DEFAULT_CALIBRATION_METHOD, DEFAULT_SCORE_DTYPE
from ..core.errors import ConfigError, StoreError
from ..core.events import Event, ProgressCallback, null_progress
from ..core.fsutil import sha256_file
from ..core.location import location
from ..metrics.conformal import check_alpha, video_weights
from ..runs.load import load_run
from ..runtime.capabilities import resolve_score_dtype
from ..runtime.devices import resolve_device
from ..scoring import DEFAULT_SHORTLIST, Scorer
from ..scoring.first_stage import check_shortlist
from ..search import SearcherOptions, open_searcher
from ..store import ALL_SPLITS, open_store, split_rows, store_fingerprint

__all__ = ["CalibrateConfig", "describe_groups", "run_calibrate"]


@dataclass(frozen=True)
class CalibrateConfig:
    """One ``dab calibrate``: the run, the queries it is calibrated on (a split whose queries the run never
    trained on; default its validation split) and the gallery they are searched in (default the same split's
    videos; ``all``: every video of the store, for a search of ``--split all``)."""

    run: Path
    features: Optional[Path] = None  # default: the run's own store
    split: Optional[str] = None  # default: the run's val_split
    gallery: Optional[str] = None  # default: ``split``
    method: str = DEFAULT_CALIBRATION_METHOD
    first_k: int = DEFAULT_FIRST_K  # the k of P(a match in the first k)
    seed: int = 0
    device: str = "auto"
    dtype: str = DEFAULT_SCORE_DTYPE
    groups: Optional[str] = None  # "uncertainty:3" (Mondrian bands), "uncertainty:3,length:2" (conditional)
    k0: int = DEFAULT_K0  # the first costs every probability reads: a shortlist of K >= k0 gives the same
    # the whole pipeline (issue 60): the queries searched as a search does, through this index at this shortlist
    # and nprobe (a match the first stage missed is outside every set); its searches must use the same
    index: Optional[Path] = None
    shortlist: Optional[int] = None  # with an index: default DEFAULT_SHORTLIST
    nprobe: Optional[int] = None  # with an index: default the index's own
    # with an index and no shortlist: choose the shortlist this coverage needs (issue 60, item 2) on the fitted
    # half's videos; the quantiles then come from the held-out half alone
    coverage: Optional[float] = None

    def __post_init__(self) -> None:
        if self.method not in CALIBRATION_METHODS:
            raise ConfigError(f"unknown calibration method {self.method!r}; valid: {', '.join(CALIBRATION_METHODS)}")
        if not 2 <= int(self.first_k) <= 1000:
            raise ConfigError(f"--first-k must be an integer in [2, 1000], got {self.first_k}")
        if not int(self.first_k) <= int(self.k0) <= 1000:
            raise ConfigError(f"--k0 must be an integer in [first_k={self.first_k}, 1000], got {self.k0}")
        if self.index is None and (self.shortlist is not None or self.nprobe is not None or self.coverage is not None):
            raise ConfigError("--shortlist, --nprobe and --coverage calibrate through an index: give --index too")
        if self.coverage is not None:
            object.__setattr__(self, "coverage", check_alpha(self.coverage, "coverage"))
            if self.shortlist is not None:
                raise ConfigError("--coverage chooses the shortlist: give --shortlist or --coverage, not both")
        if self.shortlist is not None:  # checked here, once, and kept as an int (a JSON number in the file)
            object.__setattr__(self, "shortlist", check_shortlist(self.shortlist))
        if self.shortlist is not None and self.shortlist < self.k0:
            raise ConfigError(
                f"--shortlist {self.shortlist} is below --k0 {self.k0}: every probability reads the first k0 costs"
            )
        parse_groups(self.groups)  # a bad spec is one line before anything loads


def run_calibrate(cfg: CalibrateConfig, progress: ProgressCallback = null_progress) -> Calibration:
    """Score the queries, fit, and write ``<run>/calibration.json``; returns what was written."""
    require_sklearn()  # before anything loads: a missing extra is said at once
    device = resolve_device(cfg.device)
    run = load_run(cfg.run, device)
    split, gallery = _splits(cfg, run)
    got = _read(cfg, run, split, gallery)
    progress(Event("start", "calibrate", total=len(got.gt), message=f"{split} queries against {gallery} videos"))
    choice = resolve_score_dtype(cfg.dtype, device)
    if choice.warning:
        progress(Event("warning", "calibrate", message=choice.warning))
    if cfg.index is None:
        with Scorer(run.model, device=device, dtype=choice.dtype) as scorer:
            cost = scorer.score(got.queries.text, got.videos.frames, got.videos.frame_mask).cost  # (Q, V)
        first_stage = None
    else:
        cost, first_stage = _through_index(cfg, run, gallery, got, choice.dtype)
    cal = calibrate_costs(
        cost,
        got.gt,
        float(run.model.temperature().detach().cpu()),
        text_variance(run.model, got.queries.text),  # (Q,) or None
        method=cfg.method,
        first_k=cfg.first_k,
        seed=cfg.seed,
        video=np.asarray(got.queries.caption_video, np.int64),
        groups=parse_groups(cfg.groups),
        texts=got.texts,
        k0=cfg.k0,
    )
    cal = replace(cal, provenance={**_provenance(cfg, run, split, gallery, got), "index": first_stage})
    write_calibration(run.run_dir / CALIBRATION_FILE, cal)
    progress(Event("advance", "calibrate", n=len(got.gt)))
    progress(Event("end", "calibrate", total=len(got.gt)))
    return cal


def _splits(cfg: CalibrateConfig, run) -> tuple[str, str]:
    """(the queries' split, the gallery's), refusing 'all' and any split the run trained on."""
    split = cfg.split or run.config.val_split
    if split == ALL_SPLITS:
        raise ConfigError("calibrate on one split's queries (the run's validation split), not 'all'")
    if split == run.config.train_split:
        raise ConfigError(
            f"--split {split!r} is the split {run.run_dir} trained on: its probabilities, sets and risk threshold "
            f"would be fitted on captions the model has seen; calibrate on {run.config.val_split!r} (the default)"
        )
    return split, cfg.gallery or split


def _through_index(cfg: CalibrateConfig, run, gallery: str, got, dtype: str) -> tuple[np.ndarray, dict[str, Any]]:
    """The queries' costs as a search through ``cfg.index`` gives them (Q, V): each query's shortlist re-ranked, +inf
    for every video outside it; and the first stage's identity (what a search must match). With ``cfg.coverage``
    the shortlist is the one :func:`choose_shortlist` picks on the fitted half's videos."""
    n_videos = len(got.videos.video_ids)
    grid = shortlist_grid(cfg.k0, n_videos) if cfg.coverage is not None else None
    shortlist = grid[-1] if grid else DEFAULT_SHORTLIST if cfg.shortlist is None else int(cfg.shortlist)
    cost = np.full((len(got.gt), n_videos), np.inf, np.float64)  # (Q, V)
    order = np.full((len(got.gt), shortlist), -1, np.int64)  # (Q, K) the first stage's ranking, as positions
    opened = open_searcher(
        SearcherOptions(run.run_dir, got.store_path, gallery, cfg.index, cfg.device, dtype), encoder=False
    )
    with opened as s:
        for start in range(0, len(cost), 64):  # a batch of queries a first-stage call
            text = got.queries.text[start : start + 64]
            for i, r in enumerate(s.rank([""] * len(text), text, 1, shortlist, cfg.nprobe), start=start):
                cost[i, r.positions] = r.costs
            if grid:
                got_order = s.first_stage_order(text, shortlist, cfg.nprobe)
                order[start : start + len(text), : got_order.shape[1]] = got_order
        if not grid:
            return cost, s.first_stage_identity(shortlist, cfg.nprobe)
        fit, _ = split_videos(np.asarray(got.queries.caption_video), cfg.seed)  # calibrate_costs's own split
        chosen, misses = choose_shortlist(
            order[fit], got.gt[fit], np.asarray(got.queries.caption_video)[fit], grid, 1 - cfg.coverage
        )
        identity = s.first_stage_identity(chosen, cfg.nprobe)
    kept = np.full_like(cost, np.inf)
    rows = np.repeat(np.arange(len(cost))[:, None], chosen, axis=1)
    first = order[:, :chosen]  # (Q, K') each query's shortlist at the chosen K
    ok = first >= 0
    kept[rows[ok], first[ok]] = cost[rows[ok], first[ok]]
    identity["chosen_for"] = {
        "coverage": cfg.coverage,
        "rule": "the smallest K of the grid whose first stage misses at most half of 1 - coverage of the fitted "
        "half's queries (each weighted by one over its video's captions); the quantiles from the held-out half",
        "miss_share": {str(k): m for k, m in misses.items()},
        "re_ranks_saved": 1.0 - chosen / n_videos,
    }
    return kept, identity


def shortlist_grid(k0: int, videos: int) -> list[int]:
    """The shortlists a coverage may choose from: 20, 50, 100, 200, 500, ... (at least ``k0``), up to every video."""
    grid, base = [], [2, 5, 10]
    scale = 10
    while True:
        for b in base:
            k = b * scale
            if k >= videos:
                return sorted(set([g for g in grid if g >= k0] + [videos]))
            grid.append(k)
        scale *= 10


def choose_shortlist(
    order: np.ndarray, gt: np.ndarray, video: np.ndarray, grid: list[int], alpha: float
) -> tuple[int, dict[int, float]]:
    """(the smallest K of ``grid`` whose first stage misses the match of at most alpha / 2 of these queries,
    each weighted by one over its video's captions; every K's miss share). The other alpha / 2 is left to the
    ranking within the shortlist. The largest K where none does."""
    w = video_weights(video)
    misses = {}
    for k in grid:
        hit = (order[:, :k] == gt[:, None]).any(axis=1)
        misses[k] = float(np.average(~hit, weights=w))
    good = [k for k in grid if misses[k] <= alpha / 2]
    return (good[0] if good else grid[-1]), misses


@dataclass(frozen=True)
class _Inputs:
    store_path: Any
    queries: Any  # the split's SplitData
    videos: Any  # the gallery's SplitData
    gt: np.ndarray  # (Q,) each query's match: its column in the gallery
    texts: list[str]  # (Q,) each query's caption (for length groups)
    fingerprint: str  # the gallery's


def _read(cfg: CalibrateConfig, run, split: str, gallery: str) -> _Inputs:
    """The queries and the gallery from the store, after one-line refusals of what cannot be calibrated."""
    store_path = location(cfg.features if cfg.features is not None else run.config.features)
    with open_store(store_path) as store:
        store.require_complete("dab calibrate")
        if store.dim != run.model.cfg.embed_dim:
            raise ConfigError(
                f"{store_path} holds D={store.dim} features but the run has embed_dim={run.model.cfg.embed_dim}"
            )
        queries = store.load_split(split)
        if len(queries.caption_ids) == 0:
            raise StoreError(
                f"{store_path}: split {split!r} has no encoded captions to calibrate on "
                "(give a split of queries the run did not train on with --split)"
            )
        videos = queries if gallery == split else store.load_split(gallery)
        gt = queries.matches_in(videos)  # (Q,)
        held = {str(v) for v in videos.video_ids}
        missing = [str(v) for v in queries.video_ids if str(v) not in held]
        if missing:
            raise ConfigError(f"gallery {gallery!r} lacks {len(missing)} videos of split {split!r} ({missing[0]}, ...)")
        if cfg.first_k >= len(videos.video_ids):
            raise ConfigError(
                f"--first-k {cfg.first_k} is not below the gallery's {len(videos.video_ids)} videos (split {gallery!r}): "
                "P(a match in the first k) would be 1 for every query; give a smaller --first-k"
            )
        return _Inputs(
            store_path=store_path,
            queries=queries,
            videos=videos,
            gt=gt,
            texts=[str(t) for t in store.caption_text[queries.caption_index]],
            fingerprint=store_fingerprint(store, split_rows(store, gallery)),
        )


def _provenance(cfg: CalibrateConfig, run, split: str, gallery: str, got: _Inputs) -> dict[str, Any]:
    return {
        "run": str(run.run_dir),
        "checkpoint_sha256": sha256_file(run.checkpoint),
        "split": split,
        "gallery": {
            "split": gallery,
            "videos": len(got.videos.video_ids),
            # absolute (a local path): `dab evaluate` and `dab search` find it from any working directory
            "store": str(got.store_path.resolve()) if isinstance(got.store_path, Path) else str(got.store_path),
            "fingerprint": got.fingerprint,
            "video_ids_sha256": video_ids_digest(got.videos.video_ids),
        },
        "libraries": library_versions(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
