"""The inputs of one training batch (a split's arrays and the heads are :mod:`dab_pipeline.runs.inputs`)."""

from __future__ import annotations

from typing import Optional

import torch

from ...runs.inputs import SplitArrays, TrainHeads, text_state_batch


def batch_inputs(
    feats: SplitArrays,
    q: torch.Tensor,
    heads: Optional[TrainHeads],
    device: torch.device,
    views: Optional[torch.Tensor] = None,
):
    """Inputs of captions ``q`` (b,) and their videos: (text or text states, lengths, frames or states, mask).

    ``views`` (V,) int64: the augmented view each video trains on this epoch (None: the eval view).
    """
    v = feats.caption_video[q]  # (b,)
    mask = feats.mask[v].to(device)  # (b, F)
    if heads is not None:
        st, ln = text_state_batch(feats, q, device)
        vis = feats.vision_states[v] if views is None else feats.view_states[v, views[v]]  # (b, F, [L,] W)
        return st, ln, vis.to(device, torch.float32), mask
    frames = feats.frames[v] if views is None else feats.views[v, views[v]]  # (b, F, D)
    return feats.text[q].to(device), None, frames.to(device), mask
