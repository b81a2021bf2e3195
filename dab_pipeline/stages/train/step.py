"""The training step as one module (DDP averages DAB's and the heads' gradients) and its loss across ranks."""

from __future__ import annotations

from typing import Optional

import torch

from ...model.losses import contrastive_loss, loss_of
from ...runs.inputs import TrainHeads
from ...runtime.distributed import all_gather_with_grad


class TrainStep(torch.nn.Module):
    """DAB (and the CLIP heads) as one module, so DistributedDataParallel averages the gradients of both.

    forward: this rank's slice of the global batch -> its rows of the global cost
    matrix: its b texts against the B = world * b videos of every rank (DAB pools
    every video per text, so a cost is per pair). The frames are gathered with
    gradients: the rows of rank r depend on rank k's videos, and rank k's heads
    must receive that gradient.
    """

    def __init__(self, model: torch.nn.Module, heads: Optional[TrainHeads], ctx=None) -> None:
        super().__init__()
        self.model = model
        self.heads = heads
        self.gather = _gather_of(ctx)

    def forward(
        self, text_in: torch.Tensor, lengths: Optional[torch.Tensor], video_in: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        if self.heads is not None:
            text = self.heads.encode_text(text_in, lengths)  # (b, D)
            frames = self.heads.encode_frames(video_in)  # (b, F, D)
        else:
            text, frames = text_in, video_in  # (b, D), (b, F, D)
        frames_all = self.gather(frames)  # (B, F, D), rank order = global batch order
        mask_all = self.gather(mask)  # (B, F)
        ts = self.model.encode_text(text)
        vs = self.model.encode_video(frames_all, mask_all)
        return self.model.pair_costs(ts, vs)  # (b, B)


def distributed_batch_loss(
    step: torch.nn.Module,
    model,
    text_in: torch.Tensor,
    lengths: Optional[torch.Tensor],
    video_in: torch.Tensor,
    mask: torch.Tensor,
    loss_fn=None,
    ctx=None,
) -> torch.Tensor:
    """The loss of one global batch from this rank's slice; gradients match one process with the whole batch.

    ``step`` is the DistributedDataParallel-wrapped :class:`TrainStep`. Each
    rank computes its b rows (texts) of the (B, B) cost against all B videos;
    the rows are all-gathered with gradients, so every rank holds the whole
    matrix and evaluates the *whole* loss L (both directions: the video->text
    terms need the columns, which span every rank's rows). Why the gradients
    are exact: rank r's rows C_r enter the loss of all N ranks, so the gather's
    backward sums N identical partials, N * dL/dC_r; back through C_r that is N
    times rank r's share of dL/dtheta, and DDP's average (1/N) sum_r of it is
    sum_r dL/dC_r dC_r/dtheta = dL/dtheta. The same holds for the heads through
    the gathered frames. The temperature / logit scale enter L directly on every
    rank: each rank gets the full dL/dtau and the average keeps it. Every pair
    is computed once (by its text's rank), so per-pair dropout noise is shared by
    both loss directions as in one process, and the per-rank work is b * B pairs
    rather than the 2 * b * B of computing rows and columns separately.

    ``ctx``: the run's context (None: the default process group); with a
    one-process :class:`~dab_pipeline.runtime.distributed.LocalContext` the gathers are
    the identity and this is the plain loss of the whole batch.
    """
    loss = loss_fn if loss_fn is not None else loss_of(model.cfg.spec)
    rows = step(text_in, lengths, video_in, mask)  # (b, B)
    cost = _gather_of(ctx)(rows)  # (B, B): row i = text i of the global batch, diagonal = matched pairs
    return contrastive_loss(loss, cost, model.temperature())


def _gather_of(ctx):
    """The context's gather with gradients; without one, the default process group's."""
    if ctx is not None:
        return ctx.gather_with_grad
    return all_gather_with_grad
