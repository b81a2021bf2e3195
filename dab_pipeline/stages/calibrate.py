"""``dab calibrate``: a run's validation queries scored against a gallery, and what the costs say of a match,
fitted and written as the run's calibration.json (:mod:`dab_pipeline.calibration`, docs/uncertainty.md)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np

from ..calibration import (
    CALIBRATION_FILE,
    DEFAULT_K,
    DEFAULT_METHOD,
    METHODS,
    Calibration,
    calibrate_costs,
    text_variance,
    write_calibration,
)
from ..calibration.fit import library_versions, require_sklearn
from ..calibration.record import video_ids_digest
from ..core.choices import DEFAULT_SCORE_DTYPE
from ..core.errors import ConfigError, StoreError
from ..core.events import Event, ProgressCallback, null_progress
from ..core.fsutil import sha256_file
from ..core.location import location
from ..index import split_rows, store_fingerprint
from ..runs.load import load_run
from ..runtime.capabilities import resolve_score_dtype
from ..runtime.devices import resolve_device
from ..scoring import Scorer
from ..store import ALL_SPLITS, open_store

__all__ = ["CalibrateConfig", "run_calibrate"]


@dataclass(frozen=True)
class CalibrateConfig:
    """One ``dab calibrate``: the run, the queries it is calibrated on (a split whose queries the run never
    trained on; default its validation split) and the gallery they are searched in (default the same split's
    videos; ``all``: every video of the store, for a search of ``--split all``)."""

    run: Path
    features: Optional[Path] = None  # default: the run's own store
    split: Optional[str] = None  # default: the run's val_split
    gallery: Optional[str] = None  # default: ``split``
    method: str = DEFAULT_METHOD
    k: int = DEFAULT_K
    seed: int = 0
    device: str = "auto"
    dtype: str = DEFAULT_SCORE_DTYPE

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown calibration method {self.method!r}; valid: {', '.join(METHODS)}")
        if not 2 <= int(self.k) <= 1000:
            raise ConfigError(f"k must be an integer in [2, 1000], got {self.k}")


def run_calibrate(cfg: CalibrateConfig, progress: ProgressCallback = null_progress) -> Calibration:
    """Score the queries, fit, and write ``<run>/calibration.json``; returns what was written."""
    require_sklearn()  # before anything loads: a missing extra is said at once
    device = resolve_device(cfg.device)
    run = load_run(cfg.run, device)
    split = cfg.split or run.config.val_split
    gallery = cfg.gallery or split
    if split == ALL_SPLITS:
        raise ConfigError("calibrate on one split's queries (the run's validation split), not 'all'")
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
        pos = {str(v): i for i, v in enumerate(videos.video_ids)}
        missing = [str(v) for v in queries.video_ids if str(v) not in pos]
        if missing:
            raise ConfigError(f"gallery {gallery!r} lacks {len(missing)} videos of split {split!r} ({missing[0]}, ...)")
        gt = np.array([pos[str(v)] for v in queries.video_ids[queries.caption_video]], np.int64)  # (Q,)
        fingerprint = store_fingerprint(store, split_rows(store, gallery))
    progress(Event("start", "calibrate", total=len(gt), message=f"{split} queries against {gallery} videos"))
    choice = resolve_score_dtype(cfg.dtype, device)
    if choice.warning:
        progress(Event("warning", "calibrate", message=choice.warning))
    with Scorer(run.model, device=device, dtype=choice.dtype) as scorer:
        cost = scorer.score(queries.text, videos.frames, videos.frame_mask).cost  # (Q, V)
    tv = text_variance(run.model, queries.text)  # (Q,) or None
    temperature = float(run.model.temperature().detach().cpu())
    cal = calibrate_costs(cost, gt, temperature, tv, method=cfg.method, k=cfg.k, seed=cfg.seed)
    cal = replace(
        cal,
        provenance={
            "run": str(run.run_dir),
            "checkpoint_sha256": sha256_file(run.checkpoint),
            "split": split,
            "gallery": {
                "split": gallery,
                "videos": len(videos.video_ids),
                "store": str(store_path),
                "fingerprint": fingerprint,
                "video_ids_sha256": video_ids_digest(videos.video_ids),
            },
            "libraries": library_versions(),
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        },
    )
    write_calibration(run.run_dir / CALIBRATION_FILE, cal)
    progress(Event("advance", "calibrate", n=len(gt)))
    progress(Event("end", "calibrate", total=len(gt)))
    return cal
