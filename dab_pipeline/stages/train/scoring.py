"""Scoring a split with the fast engine (validation, the test cost file)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ...core.events import ProgressCallback, null_progress
from ...runs.config import TrainConfig
from ...runs.inputs import SplitArrays, TrainHeads, score_inputs
from ...runtime.distributed import LocalContext, shard_range
from ...scoring import Scorer, ScoreResult


def score_split(
    model,
    heads: Optional[TrainHeads],
    feats: SplitArrays,
    cfg: TrainConfig,
    device: torch.device,
    progress: ProgressCallback = null_progress,
    with_diagnostics: bool = False,
    dist=None,
):
    """Cost matrix of every (caption, video) pair of a split (bounded memory).

    ``dist`` (a several-process run): each rank scores a contiguous chunk of the
    queries against every video; the rows are gathered so every rank returns
    the whole matrix (and takes the same model-selection decision). One process
    scores every query (its chunk is the whole split).
    """
    ctx = dist if dist is not None else LocalContext(device)
    n_q, world = feats.num_queries, ctx.world_size
    bounds = [shard_range(n_q, r, world) for r in range(world)]
    lo, hi = bounds[ctx.rank]
    counts = [b - a for a, b in bounds]
    model.eval()
    local = None
    with torch.no_grad():
        text_t, frames_t = score_inputs(heads, feats, device, lo, hi)
        if hi > lo:
            # one Scorer a call: the weights change between validations, so kept engines would be rebuilt anyway
            scorer = Scorer(
                model, device=device, dtype=cfg.score_dtype, text_chunk=cfg.text_chunk, video_chunk=cfg.video_chunk
            )
            local = scorer.score(
                text_t,
                frames_t,
                feats.mask,
                progress=progress,
                gt=feats.caption_video[lo:hi] if with_diagnostics else None,
            )
    cost = np.asarray(local.cost, np.float32) if local is not None else np.zeros((0, feats.num_videos), np.float32)
    res = ScoreResult(cost=ctx.gather_rows(cost, counts))  # (Q, V)
    if with_diagnostics and model.cfg.gaussian:
        for name in ("text_var", "bridged_var", "video_var"):
            part = getattr(local, name, None) if local is not None else None
            part = np.zeros(0, np.float32) if part is None else np.asarray(part, np.float32)
            setattr(res, name, ctx.gather_rows(part, counts))  # (Q,)
    return res
