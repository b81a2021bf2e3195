"""A split's training inputs, the fine-tuned CLIP heads, run status files and the scoring of a split."""

from __future__ import annotations

from typing import Optional
import numpy as np
import torch
from ...events import ProgressCallback, null_progress

from .config import TrainConfig


class SplitArrays:
    """One split's inputs in RAM, on the training device, frozen or with CLIP states."""

    def __init__(self, split, device: torch.device, with_states: bool) -> None:
        self.split = split
        self.video_ids = split.video_ids
        self.caption_ids = split.caption_ids
        self.caption_video = torch.as_tensor(np.asarray(split.caption_video), dtype=torch.long)  # (Q,)
        self.text = torch.as_tensor(np.asarray(split.text), dtype=torch.float32)  # (Q, D)
        self.frames = torch.as_tensor(np.asarray(split.frames), dtype=torch.float32)  # (V, F, D)
        self.mask = torch.as_tensor(np.asarray(split.frame_mask), dtype=torch.bool)  # (V, F)
        self.with_states = with_states
        if with_states:
            # Kept in the store dtype (float16 token grids are large); cast per batch.
            self.vision_states = torch.as_tensor(np.asarray(split.vision_states))  # (V, F, [L,] W)
        self.views = self.view_states = None  # augmented training views (train split of a --train-views store)
        if getattr(split, "views", None) is not None:
            self.views = torch.as_tensor(np.asarray(split.views), dtype=torch.float32)  # (V, N, F, D)
            if with_states:
                self.view_states = torch.as_tensor(np.asarray(split.view_states))  # (V, N, F, [L,] W)
        self.device = device

    @property
    def num_views(self) -> int:
        return 0 if self.views is None else int(self.views.shape[1])

    @property
    def num_queries(self) -> int:
        return int(self.text.shape[0])

    @property
    def num_videos(self) -> int:
        return int(self.frames.shape[0])


class TrainHeads(torch.nn.Module):
    """The fine-tuned tails of both CLIP towers (partial fine-tuning), or nothing."""

    def __init__(self, manifest: dict, k: int, device: torch.device) -> None:
        super().__init__()
        from ...clip_models import TextHead, VisionHead, check_store_weights, load_clip

        bundle = load_clip(manifest["model"], manifest.get("pretrained"), device="cpu", dtype="float32")
        check_store_weights(bundle, manifest, "fine-tuning from the store's token states needs the same weights")
        self.vision = VisionHead.from_bundle(bundle, k)
        self.text = TextHead.from_bundle(bundle, k)

    def encode_text(self, states, lengths) -> torch.Tensor:
        return self.text(states, lengths)

    def encode_frames(self, states: torch.Tensor) -> torch.Tensor:
        B, F = states.shape[:2]
        out = self.vision(states.flatten(0, 1))  # (B*F, D)
        return out.reshape(B, F, -1)  # (B, F, D)


def text_state_batch(feats: SplitArrays, qidx: torch.Tensor, device: torch.device):
    """CLIP text states of some captions: (B, W) pooled for K=0, or padded (B, T, W) + lengths for K>0."""
    split = feats.split
    rows = qidx.numpy()
    if split.text_offsets is not None:
        states, lengths = split.text_state_batch(rows)  # (B, T, W), (B,)
        return (torch.as_tensor(states, dtype=torch.float32, device=device),
                torch.as_tensor(lengths, dtype=torch.long, device=device))
    states = np.asarray(split.text_states[rows], dtype=np.float32)  # (B, W)
    return torch.as_tensor(states, device=device), None


class TrainStep(torch.nn.Module):
    """DAB (and the CLIP heads) as one module, so DistributedDataParallel averages the gradients of both.

    forward: this rank's slice of the global batch -> its rows of the global cost
    matrix: its b texts against the B = world * b videos of every rank (DAB pools
    every video per text, so a cost is per pair). The frames are gathered with
    gradients: the rows of rank r depend on rank k's videos, and rank k's heads
    must receive that gradient.
    """

    def __init__(self, model: torch.nn.Module, heads: Optional[TrainHeads]) -> None:
        super().__init__()
        self.model = model
        self.heads = heads

    def forward(self, text_in: torch.Tensor, lengths: Optional[torch.Tensor], video_in: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        from ...distributed import all_gather_with_grad

        if self.heads is not None:
            text = self.heads.encode_text(text_in, lengths)  # (b, D)
            frames = self.heads.encode_frames(video_in)  # (b, F, D)
        else:
            text, frames = text_in, video_in  # (b, D), (b, F, D)
        frames_all = all_gather_with_grad(frames)  # (B, F, D), rank order = global batch order
        mask_all = all_gather_with_grad(mask)  # (B, F)
        ts = self.model.encode_text(text)
        vs = self.model.encode_video(frames_all, mask_all)
        return self.model.pair_costs(ts, vs)  # (b, B)


def distributed_batch_loss(step: torch.nn.Module, model, text_in: torch.Tensor, lengths: Optional[torch.Tensor],
                           video_in: torch.Tensor, mask: torch.Tensor, loss_fn=None) -> torch.Tensor:
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
    """
    from ...distributed import all_gather_with_grad
    from ...model import ModelOutput

    if loss_fn is None:
        from ...model.losses import model_loss as loss_fn
    rows = step(text_in, lengths, video_in, mask)  # (b, B)
    cost = all_gather_with_grad(rows)  # (B, B): row i = text i of the global batch, diagonal = matched pairs
    # model_loss reads only the cost (and the model's temperature); the other outputs are per-pair extras.
    return loss_fn(model, ModelOutput(cost=cost))


def _batch_inputs(feats: SplitArrays, q: torch.Tensor, heads: Optional[TrainHeads], device: torch.device,
                  views: Optional[torch.Tensor] = None):
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


def _score_inputs(heads: Optional[TrainHeads], feats: SplitArrays, device: torch.device, lo: int, hi: int):
    """Texts ``lo:hi`` (Q', D) and all frames (V, F, D) of a split, through the heads when fine-tuning."""
    if heads is None:
        return feats.text[lo:hi], feats.frames
    heads.eval()
    text = []
    for s in range(lo, hi, 256):
        q = torch.arange(s, min(s + 256, hi))
        st, ln = text_state_batch(feats, q, device)
        text.append(heads.encode_text(st, ln).float().cpu())
    text_t = torch.cat(text) if text else torch.zeros((0, feats.text.shape[1]))  # (Q', D)
    frames = []
    for s in range(0, feats.num_videos, 32):
        frames.append(heads.encode_frames(feats.vision_states[s : s + 32].to(device, torch.float32)).float().cpu())
    return text_t, torch.cat(frames)  # (V, F, D)


def score_split(model, heads: Optional[TrainHeads], feats: SplitArrays, cfg: TrainConfig, device: torch.device,
                progress: ProgressCallback = null_progress, with_diagnostics: bool = False, dist=None):
    """Cost matrix of every (caption, video) pair of a split (bounded memory).

    ``dist`` (a several-process run): each rank scores a contiguous chunk of the
    queries against every video; the rows are gathered so every rank returns
    the whole matrix (and takes the same model-selection decision). One process
    scores every query (its chunk is the whole split).
    """
    from ...distributed import LocalContext, shard_range
    from ...scoring import ScoreResult, score_all

    ctx = dist if dist is not None else LocalContext(device)
    n_q, world = feats.num_queries, ctx.world_size
    bounds = [shard_range(n_q, r, world) for r in range(world)]
    lo, hi = bounds[ctx.rank]
    counts = [b - a for a, b in bounds]
    model.eval()
    local = None
    with torch.no_grad():
        text_t, frames_t = _score_inputs(heads, feats, device, lo, hi)
        if hi > lo:
            local = score_all(model, text_t, frames_t, feats.mask, text_chunk=cfg.text_chunk,
                              video_chunk=cfg.video_chunk, device=device, dtype=cfg.score_dtype,
                              gt=feats.caption_video[lo:hi] if with_diagnostics else None, progress=progress)
    cost = np.asarray(local.cost, np.float32) if local is not None else np.zeros((0, feats.num_videos), np.float32)
    res = ScoreResult(cost=ctx.gather_rows(cost, counts))  # (Q, V)
    if with_diagnostics and model.cfg.probabilistic:
        for name in ("text_var", "bridged_var", "video_var"):
            part = getattr(local, name, None) if local is not None else None
            part = np.zeros(0, np.float32) if part is None else np.asarray(part, np.float32)
            setattr(res, name, ctx.gather_rows(part, counts))  # (Q,)
    return res
