"""run_evaluate: the metrics of a cost file, the diagnostics that read its store, and the report."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from ... import metrics as M
from ...core.errors import ConfigError, StoreError
from ...core.events import Event, ProgressCallback, null_progress
from ...core.location import location
from ...results.published import published_zero_shot
from ...results.report import write_report
from ...runs.config import TrainConfig
from ...runs.costfile import CostMatrix, read_costs
from ...runs.run_folder import RunFolder, locate_store
from ...store import open_store
from .bridge_report import bridge_report
from .calibration_report import calibration_section
from .config import EvaluateConfig
from .covariance_report import covariance_report
from .examples import write_examples
from .zeroshot import write_zero_shot_costs


def find_costs(run: Path) -> Path:
    """The cost file inside a run folder (costs_test.h5 / .zarr)."""
    return RunFolder(run).find_costs()


def _frame_mean_features(store_path: Path, video_ids: np.ndarray) -> Optional[np.ndarray]:
    """Frame-mean CLIP features of the given videos (paper Table 7 uses visual features)."""
    with open_store(store_path) as st:
        st.require_complete("dab evaluate (the neighbourhood diagnostic reads its video features)")
        pos = {str(v): i for i, v in enumerate(st.video_ids)}
        try:
            idx = np.array([pos[str(v)] for v in video_ids], dtype=np.int64)
        except KeyError as exc:
            raise StoreError(f"{store_path} has no video {exc.args[0]!r} of the cost file") from None
        frames, mask = st.read_videos(idx)  # (V, F, D), (V, F)
    m = mask.astype(np.float32)[..., None]  # (V, F, 1)
    return (frames * m).sum(1) / np.maximum(m.sum(1), 1.0)  # (V, D)


def run_evaluate(cfg: EvaluateConfig, progress: ProgressCallback = null_progress) -> dict[str, Any]:
    """Compute every metric and diagnostic; write metrics.json, report.md and plots.

    The output folder is made only once everything is computed, by the first file written in it: an
    evaluation that fails (NaN costs, a store that does not fit) leaves no new folder behind (a zero-shot run's
    cost file is written there first).
    """
    costs_path, out_dir = _inputs(cfg)
    cm = read_costs(costs_path, kind=cfg.costs_kind)
    cost = cm.to_cost() if hasattr(cm, "to_cost") else cm.cost  # (Q, V), lower is better
    gt = np.asarray(cm.gt, dtype=np.int64)  # (Q,)
    if (gt < 0).any():
        raise StoreError(f"{costs_path}: {int((gt < 0).sum())} queries have no ground-truth video (gt = -1)")

    results: dict[str, Any] = {
        "source": str(costs_path),
        "queries": int(cost.shape[0]),
        "videos": int(cost.shape[1]),
    }
    # Post-processing changes the retrieval metrics only (and is labelled there);
    # the uncertainty diagnostics always read the model's own costs.
    results.update(
        M.evaluate_all(
            cost,
            gt,
            postprocess=cfg.postprocess,
            postprocess_temperature=cfg.postprocess_temperature,
            v2t_convention=cfg.v2t,
        )
    )
    store_path = store_of(cfg, cm, costs_path)
    curves, calibrated = _uncertainty_sections(results, cfg, cm, cost, gt, store_path, progress)
    _store_diagnostics(results, cfg, cm, cost, gt, store_path, progress)

    if cm.attrs:
        results["run"] = {k: v for k, v in cm.attrs.items() if k != "config"}
    published = _published(cm, store_path, results["t2v"])
    if published is not None:
        results["published"] = published
    title = f"dab evaluation: {Path(cfg.run).name if cfg.run else costs_path.name}"
    ranks = M.t2v_ranks(cost, gt)
    with _removed_if_left_empty(out_dir):
        files = write_report(
            out_dir,
            results,
            title=title,
            curves=curves if cfg.plots else None,
            ranks=ranks if cfg.plots else None,
            reliability=calibrated["reliability"] if cfg.plots and calibrated else None,
        )
    if cfg.examples:
        files["examples"] = write_examples(out_dir / RunFolder.EXAMPLES, cfg, cm, cost, gt, results, store_path)
    results["files"] = {k: str(v) for k, v in files.items()}
    progress(Event("info", message=f"wrote {', '.join(str(p) for p in files.values())}"))
    return results


def _uncertainty_sections(
    results: dict[str, Any],
    cfg: EvaluateConfig,
    cm: CostMatrix,
    cost: np.ndarray,
    gt: np.ndarray,
    store_path: Optional[Path],
    progress: ProgressCallback,
) -> tuple[Optional[dict], Optional[dict]]:
    """Selective prediction, the variances and a calibrated run's calibration, into ``results``; returns the
    risk-coverage curves and the calibration section (for the plots)."""
    sel = M.selective_report(cost, gt)
    curves = sel.pop("curves", None) if isinstance(sel, dict) else None
    results["selective"] = sel
    ex = cm.extras or {}
    if all(k in ex for k in ("text_var", "bridged_var", "video_var")):
        results["variance"] = M.variance_asymmetry(ex["text_var"], ex["bridged_var"], ex["video_var"])
    calibrated = calibration_section(Path(cfg.run) if cfg.run else None, cm, cost, gt, progress, store_path)
    if calibrated is not None:
        results["calibration"] = calibrated
    return curves, calibrated


def _inputs(cfg: EvaluateConfig) -> tuple[Path, Path]:
    """The cost file to read (a zero-shot run's is written first) and the folder the reports go to."""
    if cfg.zero_shot:
        store = location(cfg.features)
        out_dir = Path(cfg.out) if cfg.out else Path("runs") / f"{store.name.split('.')[0]}-zero-shot"
        return write_zero_shot_costs(store, out_dir / "costs_test.h5"), out_dir
    costs_path = Path(cfg.costs) if cfg.costs is not None else find_costs(Path(cfg.run))
    return costs_path, Path(cfg.out) if cfg.out else (Path(cfg.run) if cfg.run else costs_path.parent)


def _published(cm: CostMatrix, store_path: Optional[Path], t2v: dict[str, Any]) -> Optional[dict[str, Any]]:
    """A zero-shot run's published counterpart for its store's dataset and CLIP (None for any other run, a store
    that cannot be read, or a pair nothing is published for)."""
    if (cm.attrs or {}).get("variant") != "zero-shot" or store_path is None or not location(store_path).exists():
        return None
    with open_store(store_path) as st:
        manifest = dict(st.manifest)
    return published_zero_shot(manifest, t2v)


@contextmanager
def _removed_if_left_empty(folder: Path) -> Iterator[None]:
    """Folders the block creates (``folder`` and missing parents) are removed again when it fails before
    writing anything in them (e.g. a full disk at the first file); a folder that existed is never removed."""
    new = [p for p in (folder, *folder.parents) if not p.exists()]  # innermost first
    try:
        yield
    except BaseException:
        for p in new:
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        raise


def store_of(cfg: EvaluateConfig, cm: CostMatrix, costs_path: Path) -> Optional[Path]:
    """The store the diagnostics read: ``--features``, else the first that exists of the store the cost file
    names (from the cwd, then beside the cost file) and the run's (config.json: from the cwd, the run folder,
    then the absolute path recorded at training), so a copied run or another cwd keeps its diagnostics;
    else the path named, for the warning that it is missing (None when nothing names one)."""
    if cfg.features is not None:
        return location(cfg.features)
    named: list[Path] = []
    recorded = (cm.attrs or {}).get("store")
    if recorded:
        named.append(locate_store(recorded, costs_path.parent))
    run = Path(cfg.run) if cfg.run is not None else costs_path.parent
    if RunFolder(run).is_run():
        try:
            named.append(Path(RunFolder(run).load_config(TrainConfig).features))
        except ConfigError:  # a config.json this dab cannot read: the cost file's record alone
            pass
    return next((p for p in named if p.exists()), named[0] if named else None)


def _store_diagnostics(
    results: dict[str, Any],
    cfg: EvaluateConfig,
    cm: CostMatrix,
    cost: np.ndarray,
    gt: np.ndarray,
    store_path: Optional[Path],
    progress: ProgressCallback,
) -> None:
    """The neighbourhood diagnostic and a run's bridge and covariance reports, into ``results``; a missing store is
    warned of."""
    if store_path is not None and store_path.exists():
        feats = _frame_mean_features(store_path, cm.video_ids)
        k = min(cfg.k, cost.shape[1])
        if k < cfg.k:
            progress(Event("warning", message=f"neighbourhood: only {cost.shape[1]} videos, using top-{k}"))
        results["neighbourhood"] = M.semantic_neighbourhood(
            cost, gt, feats, cosine_thresholds=cfg.cosine_thresholds, k=k, seed=cfg.seed
        )
    elif store_path is not None:
        progress(Event("warning", message=f"store {store_path} not found: skipping the neighbourhood diagnostic"))
    if cfg.run is not None and RunFolder(cfg.run).is_run():
        bridge = bridge_report(Path(cfg.run), cm, store_path, cfg.seed, progress)
        if bridge is not None:
            results["bridge"] = bridge
        covariance = covariance_report(Path(cfg.run), cm, store_path, cfg.k, progress)
        if covariance is not None:
            results["covariance"] = covariance
