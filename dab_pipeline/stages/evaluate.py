"""Evaluation: everything the paper reports, from a run's cost file (or any cost file).

Reads the cost matrix `dab train` wrote (or a user's own cost/similarity file),
computes text-to-video and video-to-text retrieval metrics, the uncertainty
diagnostics of paper §4.4, and writes ``metrics.json``, ``report.md`` and plots.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from .. import metrics as M
from ..core.choices import POSTPROCESS, V2T_CONVENTIONS
from ..core.errors import ConfigError, DabError, StoreError
from ..core.events import Event, ProgressCallback, null_progress
from ..metrics import selective_report, t2v_metrics
from ..results.page import build_queries, render_page, select_queries
from ..results.report import write_report
from ..runs.costfile import CostMatrix, read_costs
from ..runs.run_folder import RunFolder, locate_store
from ..scoring import PROBE_SIDE, constant_bridge, probe_bridge, score_all
from ..store import open_store
from .search import load_run
from .train import SplitArrays, TrainConfig
from .train.scoring import score_inputs


@dataclass(frozen=True)
class EvaluateConfig:
    run: Optional[Path] = None  # a run folder written by `dab train`
    costs: Optional[Path] = None  # or any cost file of the documented layout
    features: Optional[Path] = None  # store for the neighbourhood diagnostic (default: the run's store)
    out: Optional[Path] = None  # where reports go (default: the run folder / the cost file's folder)
    postprocess: str = "none"  # none | dsl (dual softmax) | is (inverted softmax); always labelled
    # several captions per video: rank the other videos by their best caption (X-Pool, CLIP4Clip) or
    # every caption ("captions"); labelled in metrics.json and the report
    v2t: str = "videos"
    temperature: float = 0.01  # of the post-processing softmax, on similarities = -cost
    taus: tuple[float, ...] = (0.6, 0.7, 0.8, 0.9)
    topk: int = 10
    seed: int = 0
    plots: bool = True
    examples: int = 24  # queries shown in examples.html (thumbnails of what was retrieved); 0: no page

    def __post_init__(self) -> None:
        if self.run is None and self.costs is None:
            raise ConfigError("give a run folder (--run) or a cost file (--costs)")
        if self.postprocess not in POSTPROCESS:
            raise ConfigError(f"postprocess must be one of {', '.join(POSTPROCESS)}, got {self.postprocess!r}")
        if self.v2t not in V2T_CONVENTIONS:
            raise ConfigError(f"v2t must be one of {', '.join(V2T_CONVENTIONS)}, got {self.v2t!r}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.examples < 0:
            raise ConfigError(f"examples must be >= 0, got {self.examples}")
        if self.topk < 1:
            raise ConfigError(f"topk must be >= 1, got {self.topk}")


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


def store_context(store_path: Optional[Path], video_ids: np.ndarray, query_ids: Optional[np.ndarray] = None
                  ) -> tuple[dict[str, Optional[bytes]], dict[str, str], dict[str, str]]:
    """From a store (when it exists): thumbnails and first captions of these videos, texts of these queries."""
    if store_path is None or not Path(store_path).exists():
        return {}, {}, {}
    with open_store(store_path) as st:
        pos = {str(v): i for i, v in enumerate(st.video_ids)}
        rows = sorted({pos[str(v)] for v in video_ids if str(v) in pos})
        thumbs = dict(zip((str(st.video_ids[r]) for r in rows), st.read_thumbnails(rows)))
        text, cids = st.caption_text, st.caption_ids
        first = st.first_caption_rows()  # (N,)
        captions = {str(st.video_ids[v]): str(text[c]) for v, c in enumerate(first) if c >= 0}
        wanted = {str(q) for q in query_ids} if query_ids is not None else set()
        texts = {str(cids[c]): str(text[c]) for c in range(len(cids)) if str(cids[c]) in wanted}
    return thumbs, captions, texts


def _write_examples(path: Path, cfg: EvaluateConfig, cm, cost: np.ndarray, gt: np.ndarray, results: dict,
                    store_path: Optional[Path]) -> Path:
    """examples.html: a seeded sample of queries across the confidence range, with thumbnails."""
    picks = select_queries(cost, gt, cfg.examples, seed=cfg.seed)
    videos = np.asarray(cm.video_ids)
    thumbs, captions, texts = store_context(store_path, videos, np.asarray(cm.query_ids)[picks])
    qtext = [texts.get(str(q), str(q)) for q in np.asarray(cm.query_ids)]
    queries = build_queries(cost, picks, qtext, videos, gt=gt, thumbs=thumbs, captions=captions, plots=cfg.plots)
    run = results.get("run", {})
    t2v = results["t2v"]
    summary = [("source", results["source"]), ("variant", str(run.get("variant", "-"))),
               ("recipe", _recipe_of(cfg)), ("queries x videos", f"{results['queries']} x {results['videos']}"),
               ("text-to-video", f"R@1 {t2v['R@1']:.1f}, R@5 {t2v['R@5']:.1f}, R@10 {t2v['R@10']:.1f}, "
                                 f"MnR {t2v['MnR']:.1f}"),
               ("shown", f"{len(picks)} queries across the confidence range (seed {cfg.seed}), failures included"),
               ("thumbnails", "from " + str(store_path) if any(thumbs.values()) else "none in the store")]
    return render_page(path, f"dab examples: {Path(cfg.run).name if cfg.run else Path(results['source']).name}",
                       summary, queries)


def _recipe_of(cfg: EvaluateConfig) -> str:
    if cfg.run is None or not RunFolder(cfg.run).is_run():
        return "-"
    return str(json.loads(RunFolder(cfg.run).config_path.read_text()).get("recipe") or "(none: the defaults)")


# Below this pair-dependent share (of mu and of logvar alike) the bridge is reported to act as a constant shift.
CONSTANT_SHARE = 0.05


def bridge_report(run: Path, cm, store_path: Optional[Path], seed: int = 0,
                  progress: ProgressCallback = null_progress) -> Optional[dict[str, Any]]:
    """What a bridge run's bridge does per pair on the cost file's split (None for a run without a bridge).

    ``pair_dependent_share``: the share of the bridge's squared shift (bridged minus text, per
    feature) that its mean over pairs does not explain, for mu (the point bridge: x) and log
    sigma^2, on a seeded grid of at most PROBE_SIDE texts x PROBE_SIDE videos of the split, split
    further into what depends on the text, the video and the pair (``decomposition``).
    ``constant_control``: the t2v metrics of the same model with its bridge replaced by that mean
    shift, scored on every pair of the split, beside the real ones, and how alike the two rankings
    are (``same_top1``: % of queries with the same best video; ``rank_correlation``: the mean
    per-query Spearman correlation of the two cost rows).
    """
    import torch

    run_cfg = RunFolder(run).load_config(TrainConfig)
    if not run_cfg.model.uses_bridge:
        return None
    if run_cfg.model.drift == "constant":
        return {"drift": "constant", "pair_dependent_share": {"mu": 0.0, "logvar": 0.0}}  # by construction
    if store_path is None or not Path(store_path).exists():
        progress(Event("warning", message=f"store {store_path} not found: skipping the bridge diagnostics"))
        return None
    try:
        loaded = load_run(run, heads=True)
    except DabError as exc:
        progress(Event("warning", message=f"skipping the bridge diagnostics: {exc}"))
        return None
    split = str((cm.attrs or {}).get("split") or run_cfg.test_split)
    device = torch.device("cpu")
    with open_store(store_path) as st:
        st.require_complete("dab evaluate (the bridge diagnostics read the split)")
        tuned = loaded.heads is not None
        feats = SplitArrays(st.load_split(split, with_states=tuned), device, with_states=tuned)
    if [str(c) for c in feats.caption_ids] != [str(q) for q in cm.query_ids]:
        progress(Event("warning", message=f"the {split!r} split of {store_path} does not hold the cost file's "
                                          "queries in its order: skipping the bridge diagnostics"))
        return None
    with torch.no_grad():
        text, frames = score_inputs(loaded.heads, feats, device, 0, feats.num_queries)
    probe = probe_bridge(loaded.model, text, frames, feats.mask, seed=seed)
    control = constant_bridge(loaded.model, probe.mean_shift_mu, probe.mean_shift_logvar)
    cost = score_all(control, text, frames, feats.mask).cost  # (Q, V)
    gt = feats.caption_video.numpy()
    aurc = selective_report(cost, gt).get("R@1", {}).get("aurc") if feats.num_videos > 1 else None
    share = probe.pair_dependent
    out: dict[str, Any] = {
        "pair_dependent_share": share,
        "decomposition": probe.shares,
        "probe": {"texts": int(len(probe.texts)), "videos": int(len(probe.videos)),
                  "pairs": int(len(probe.texts) * len(probe.videos)), "split": split,
                  "of": [int(feats.num_queries), int(feats.num_videos)], "max_side": PROBE_SIDE, "seed": seed},
        "mean_shift": {"mu_norm": float(np.linalg.norm(probe.mean_shift_mu))}
        | ({} if probe.mean_shift_logvar is None else {"logvar_mean": float(probe.mean_shift_logvar.mean())}),
        "constant_control": t2v_metrics(cost, gt) | {"aurc": aurc} | _agreement(_cost_of(cm), cost),
        "acts_as_constant": bool(max(share.values()) < CONSTANT_SHARE),
    }
    if out["acts_as_constant"]:
        progress(Event("warning", message=bridge_warning(out)))
    return out


def _cost_of(cm) -> np.ndarray:
    return np.asarray(cm.to_cost() if hasattr(cm, "to_cost") else cm.cost, np.float64)


def _agreement(real: np.ndarray, control: np.ndarray) -> dict[str, float]:
    """How alike two rankings of the same queries are: the share of queries with the same best video (%), and the
    mean over queries of the Spearman correlation of their costs over the videos (ties broken by index)."""
    same = float(np.mean(real.argmin(axis=1) == control.argmin(axis=1)) * 100)
    if real.shape[1] < 2:
        return {"same_top1": same}
    ra = real.argsort(axis=1).argsort(axis=1).astype(np.float64)  # (Q, V) ranks
    rb = np.asarray(control, np.float64).argsort(axis=1).argsort(axis=1).astype(np.float64)
    ra -= ra.mean(axis=1, keepdims=True)
    rb -= rb.mean(axis=1, keepdims=True)
    rho = (ra * rb).sum(axis=1) / np.sqrt((ra * ra).sum(axis=1) * (rb * rb).sum(axis=1))
    return {"same_top1": same, "rank_correlation": float(rho.mean())}


def bridge_warning(bridge: dict[str, Any]) -> str:
    """The one line a user reads when the bridge moves every pair (nearly) alike."""
    shares = ", ".join(f"{k} {v * 100:.1f} %" for k, v in bridge["pair_dependent_share"].items())
    return (f"the bridge acts as a constant shift (a temperature) on this data: its pair-dependent share is "
            f"{shares} (under {CONSTANT_SHARE:.0%})")


def run_evaluate(cfg: EvaluateConfig, progress: ProgressCallback = null_progress) -> dict[str, Any]:
    """Compute every metric and diagnostic; write metrics.json, report.md and plots.

    The output folder is made only once everything is computed, by the first file written in it: an
    evaluation that fails (NaN costs, a store that does not fit) leaves no new folder behind.
    """
    costs_path = Path(cfg.costs) if cfg.costs is not None else find_costs(Path(cfg.run))
    cm = read_costs(costs_path)
    cost = cm.to_cost() if hasattr(cm, "to_cost") else cm.cost  # (Q, V), lower is better
    gt = np.asarray(cm.gt, dtype=np.int64)  # (Q,)
    if (gt < 0).any():
        raise StoreError(f"{costs_path}: {int((gt < 0).sum())} queries have no ground-truth video (gt = -1)")
    out_dir = Path(cfg.out) if cfg.out else (Path(cfg.run) if cfg.run else costs_path.parent)

    results: dict[str, Any] = {
        "source": str(costs_path),
        "queries": int(cost.shape[0]),
        "videos": int(cost.shape[1]),
    }
    # Post-processing changes the retrieval metrics only (and is labelled there);
    # the uncertainty diagnostics always read the model's own costs.
    results.update(M.evaluate_all(cost, gt, postprocess=cfg.postprocess, temperature=cfg.temperature,
                                   v2t_convention=cfg.v2t))
    sel = M.selective_report(cost, gt)
    curves = sel.pop("curves", None) if isinstance(sel, dict) else None
    results["selective"] = sel
    ex = cm.extras or {}
    if all(k in ex for k in ("text_var", "bridged_var", "video_var")):
        results["variance"] = M.variance_asymmetry(ex["text_var"], ex["bridged_var"], ex["video_var"])

    store_path = store_of(cfg, cm, costs_path)
    _store_diagnostics(results, cfg, cm, cost, gt, store_path, progress)

    if cm.attrs:
        results["run"] = {k: v for k, v in cm.attrs.items() if k != "config"}
    title = f"dab evaluation: {Path(cfg.run).name if cfg.run else costs_path.name}"
    ranks = M.t2v_ranks(cost, gt)
    with _removed_if_left_empty(out_dir):
        files = write_report(out_dir, results, title=title, curves=curves if cfg.plots else None,
                             ranks=ranks if cfg.plots else None)
    if cfg.examples:
        files["examples"] = _write_examples(out_dir / RunFolder.EXAMPLES, cfg, cm, cost, gt, results, store_path)
    results["files"] = {k: str(v) for k, v in files.items()}
    progress(Event("info", message=f"wrote {', '.join(str(p) for p in files.values())}"))
    return results


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
        return Path(cfg.features)
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


def _store_diagnostics(results: dict[str, Any], cfg: EvaluateConfig, cm: CostMatrix, cost: np.ndarray, gt: np.ndarray,
                       store_path: Optional[Path], progress: ProgressCallback) -> None:
    """The neighbourhood diagnostic and a run's bridge report, into ``results``; a missing store is warned of."""
    if store_path is not None and store_path.exists():
        feats = _frame_mean_features(store_path, cm.video_ids)
        topk = min(cfg.topk, cost.shape[1])
        if topk < cfg.topk:
            progress(Event("warning", message=f"neighbourhood: only {cost.shape[1]} videos, using top-{topk}"))
        results["neighbourhood"] = M.semantic_neighbourhood(cost, gt, feats, taus=cfg.taus, topk=topk, seed=cfg.seed)
    elif store_path is not None:
        progress(Event("warning", message=f"store {store_path} not found: skipping the neighbourhood diagnostic"))
    if cfg.run is not None and RunFolder(cfg.run).is_run():
        bridge = bridge_report(Path(cfg.run), cm, store_path, cfg.seed, progress)
        if bridge is not None:
            results["bridge"] = bridge
