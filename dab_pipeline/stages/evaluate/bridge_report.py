"""The bridge report of `dab evaluate`: what a bridge run's bridge does per pair, and how a constant shift in its
place ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

from ...core.events import Event, ProgressCallback, null_progress
from ...metrics import selective_report, t2v_metrics
from ...runs.config import TrainConfig
from ...runs.inputs import SplitArrays
from ...runs.run_folder import RunFolder
from ...scoring import PROBE_SIDE, BridgeProbe, Scorer, constant_bridge, probe_bridge
from .inputs import model_inputs

# Below this pair-dependent share (of mu and of logvar alike) the bridge is reported to act as a constant shift.
CONSTANT_SHARE = 0.05


def bridge_report(
    run: Path, cm, store_path: Optional[Path], seed: int = 0, progress: ProgressCallback = null_progress
) -> Optional[dict[str, Any]]:
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

    run_cfg = RunFolder(run).load_config(TrainConfig)
    if not run_cfg.model.uses_bridge:
        return None
    if run_cfg.model.drift == "constant":
        return {"drift": "constant", "pair_dependent_share": {"mu": 0.0, "logvar": 0.0}}  # by construction
    found = model_inputs(run, cm, store_path, run_cfg.test_split, progress, "the bridge diagnostics")
    if found is None:
        return None
    loaded, feats, split, text, frames = found
    probe = probe_bridge(loaded.model, text, frames, feats.mask, seed=seed)
    control = constant_bridge(loaded.model, probe.mean_shift_mu, probe.mean_shift_logvar)
    cost = Scorer(control).score(text, frames, feats.mask).cost  # (Q, V)
    gt = feats.caption_video.numpy()
    aurc = selective_report(cost, gt).get("R@1", {}).get("aurc") if feats.num_videos > 1 else None
    share = probe.pair_dependent
    out: dict[str, Any] = {
        "pair_dependent_share": share,
        "decomposition": probe.shares,
        "probe": _probe_summary(probe, split, feats, seed),
        "mean_shift": {"mu_norm": float(np.linalg.norm(probe.mean_shift_mu))}
        | ({} if probe.mean_shift_logvar is None else {"logvar_mean": float(probe.mean_shift_logvar.mean())}),
        "constant_control": t2v_metrics(cost, gt) | {"aurc": aurc} | _agreement(_cost_of(cm), cost),
        "acts_as_constant": bool(max(share.values()) < CONSTANT_SHARE),
    }
    if out["acts_as_constant"]:
        progress(Event("warning", message=bridge_warning(out)))
    return out


def _probe_summary(probe: BridgeProbe, split: str, feats: SplitArrays, seed: int) -> dict[str, Any]:
    """The probe grid of the report: its texts, videos and pairs, out of the split's queries and videos."""
    return {
        "texts": int(len(probe.texts)),
        "videos": int(len(probe.videos)),
        "pairs": int(len(probe.texts) * len(probe.videos)),
        "split": split,
        "of": [int(feats.num_queries), int(feats.num_videos)],
        "max_side": PROBE_SIDE,
        "seed": seed,
    }


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
    return (
        f"the bridge acts as a constant shift (a temperature) on this data: its pair-dependent share is "
        f"{shares} (under {CONSTANT_SHARE:.0%})"
    )
