"""The covariance report of `dab evaluate` (issue 36): what a low-rank or mixture text Gaussian does on the cost
file's split. A diagonal run has none (its metrics.json is unchanged)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ... import metrics as M
from ...core.events import ProgressCallback, null_progress
from ...model import DABModel, TextState
from ...runs.config import TrainConfig
from ...runs.run_folder import RunFolder
from .inputs import model_inputs

# aligned (text, video) pairs per forward pass when finding the best-matching components of the top-k pairs
PAIR_BLOCK = 1024


def covariance_report(
    run: Path, cm, store_path: Optional[Path], k: int = 10, progress: ProgressCallback = null_progress
) -> Optional[dict[str, Any]]:
    """The text covariance's diagnostics on the cost file's split (None for a diagonal or cosine run).

    Every run: ``kind``, ``split``, ``texts``, ``dim`` (D).  ``lowrank:R`` (the texts through the run's model,
    ``Sigma_t = diag(sigma^2) + U U^T``): ``rank`` R, ``variance_share`` (:func:`~dab_pipeline.metrics.
    lowrank_variance_share`) and ``logdet`` ``{"mean", "std", "lowrank_part"}``: log det Sigma_t over the texts
    (:func:`~dab_pipeline.metrics.text_logdet`) and the mean of its low-rank part, log det(I + U^T S^-1 U).
    ``mixture:K``: :func:`~dab_pipeline.metrics.mixture_weights` of the texts' weights and
    :func:`~dab_pipeline.metrics.mixture_topk_components` on each query's top ``k`` videos of the cost file
    (the best-matching component of those pairs through the run's model).
    """
    run_cfg = RunFolder(run).load_config(TrainConfig)
    spec = run_cfg.model.covariance_spec
    if not run_cfg.model.gaussian or spec.kind == "diag":
        return None
    found = model_inputs(run, cm, store_path, run_cfg.test_split, progress, "the covariance diagnostics")
    if found is None:
        return None
    loaded, feats, split, text, frames = found  # (Q, D), (V, F, D)
    with torch.no_grad():
        ts = loaded.model.encode_text(text)
        out: dict[str, Any] = {"kind": spec.kind, "split": split, "texts": len(ts), "dim": int(text.shape[1])}
        if spec.kind == "lowrank":
            return out | lowrank_summary(ts)
        cost = np.asarray(cm.to_cost() if hasattr(cm, "to_cost") else cm.cost, np.float64)  # (Q, V)
        k = min(k, cost.shape[1])
        component = topk_components(loaded.model, ts, frames, feats.mask, M.topk_videos(cost, k))
        return out | M.mixture_weights(ts.mix_logits.numpy()) | M.mixture_topk_components(component, cost, k)


def lowrank_summary(ts: TextState) -> dict[str, Any]:
    """``rank``, ``variance_share`` and ``logdet`` of low-rank text states (``ts.factor`` (Q, D, R))."""
    assert ts.logvar is not None and ts.factor is not None, "a low-rank model's text state carries its factor"
    lv, u = ts.logvar.double().numpy(), ts.factor.double().numpy()  # (Q, D), (Q, D, R)
    full = M.text_logdet(lv, u)  # (Q,)
    return {
        "rank": int(u.shape[-1]),
        "variance_share": M.lowrank_variance_share(lv, u),
        "logdet": {
            "mean": float(full.mean()),
            "std": float(full.std()),
            "lowrank_part": float((full - lv.sum(1)).mean()),
        },
    }


def topk_components(model: DABModel, ts: TextState, frames: torch.Tensor, mask: torch.Tensor, top: np.ndarray):
    """(Q, V) int64: the best-matching text component of each query's ``top`` (Q, k) videos, -1 elsewhere."""
    q_count, k = top.shape
    out = np.full((q_count, frames.shape[0]), -1, np.int64)  # (Q, V)
    vs = model.encode_video(frames, mask)
    step = max(1, PAIR_BLOCK // k)
    for lo in range(0, q_count, step):
        rows = slice(lo, min(lo + step, q_count))  # b queries
        texts = torch.arange(rows.start, rows.stop).repeat_interleave(k)  # (b k,)
        videos = torch.as_tensor(top[rows].ravel())  # (b k,)
        terms = model.pair_terms(ts.select(texts), vs.select(videos), grid=False)
        assert terms.component is not None, "a mixture model's pair terms name the best component"
        # out[rows] is a view: the components land in out
        np.put_along_axis(out[rows], top[rows], terms.component.view(-1, k).numpy(), axis=1)
    return out
