"""A batch of queries scored against their own shortlists in one pass: :func:`score_shortlists`.

Each query of a batch has its own shortlist (its first stage's K videos); the batch reads the union of them
once and scores exactly the (query, video) pairs of the shortlists, never a query against another's videos.
Through the model's own path (as :func:`~dab_pipeline.scoring.score_query` scores one query): every text and
every video of the union is encoded once, then the pairs run aligned (text p with video p,
``DABModel.pair_terms(grid=False)``), so the per-pair work is the same as one query alone would do and the
per-text and per-video work is shared. Not the fast engine: its per-video bases pay only where many texts
share a video, and shortlists of a large store barely overlap (docs/search.md).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from ..model import DABModel

__all__ = ["score_shortlists", "VIDEO_CHUNK", "PAIR_CHUNK"]

VIDEO_CHUNK = 1024  # videos encoded at once (as score_query's chunks)
PAIR_CHUNK = 1024  # aligned pairs a block: their keys and values are gathered per pair


@torch.no_grad()
def score_shortlists(
    model: DABModel,
    text: Tensor,
    frames: Tensor,
    mask: Tensor,
    shortlists: Sequence[np.ndarray],
    *,
    dtype: str = "float32",
    video_chunk: int = VIDEO_CHUNK,
    pair_chunk: int = PAIR_CHUNK,
) -> list[np.ndarray]:
    """Query i's costs over its shortlist ``shortlists[i]`` (indices into ``frames``) -> [(K_i,) float32].

    text (M, D), frames (U, F, D), mask (U, F): the union of the shortlists. ``dtype`` "bfloat16": the model
    under autocast, as :func:`~dab_pipeline.scoring.score_query`. The model must be in eval mode.
    """
    if not len(shortlists):
        return []
    sizes = [len(s) for s in shortlists]
    q_idx = np.repeat(np.arange(len(shortlists)), sizes)  # (P,) the pair's query
    v_idx = np.concatenate([np.asarray(s, np.int64) for s in shortlists])  # (P,) the pair's video in frames
    order = np.argsort(v_idx, kind="stable")  # pairs by video: a chunk of videos is one run of pairs
    cost = np.empty(len(v_idx), np.float32)  # (P,) in the shortlists' order
    dev = next(model.parameters()).device
    fr, mk = torch.as_tensor(frames), torch.as_tensor(mask).bool()  # (U, F, D) as stored, (U, F)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        ts = model.encode_text(torch.as_tensor(text).float().reshape(len(shortlists), -1).to(dev))  # M texts once
        bounds = np.searchsorted(v_idx[order], np.arange(0, len(fr) + video_chunk, video_chunk))
        for c, v0 in enumerate(range(0, len(fr), video_chunk)):
            lo, hi = int(bounds[c]), int(bounds[c + 1])
            if hi == lo:
                continue
            # float32 a chunk at a time: a batch's union of float16 shortlists is not copied whole
            vs = model.encode_video(fr[v0 : v0 + video_chunk].float().to(dev), mk[v0 : v0 + video_chunk].to(dev))
            for p0 in range(lo, hi, pair_chunk):
                sel = order[p0 : min(p0 + pair_chunk, hi)]  # (p,) pairs of this chunk's videos
                q = torch.from_numpy(q_idx[sel]).to(dev)
                v = torch.from_numpy(v_idx[sel] - v0).to(dev)
                cost[sel] = model.pair_terms(ts.select(q), vs.select(v), grid=False).cost.float().cpu().numpy()
    return np.split(cost, np.cumsum(sizes)[:-1])
