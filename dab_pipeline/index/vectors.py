"""The first stage's one query-independent vector per video, and the matching query vector.

A FAISS index holds one vector per video; a query is embedded the same way and the
index returns the K videos of largest inner product, which DAB then re-ranks with
its full cost. Each kind below is a pair of maps (videos -> (B, D), texts -> (M, D)),
both L2-normalised, so inner product is cosine similarity:

* ``segments`` (the default): several vectors a video, the meanP of each of
  ``SEGMENTS`` consecutive runs of its real frames; a video's score is its best
  segment's, so a query that matches part of a video finds it (DAB's pooling
  attends to the frames the text is about, a single mean blurs them);
* ``meanp``: the mean of the L2-normalised frame features, CLIP4Clip's meanP; the
  query is the normalised text feature. Needs no run: an index of this kind serves
  any run on the store.
* ``mean``: the mean of the raw frame features (what ``dab search --shortlist``
  uses without an index).
* ``pooled``: the run's own text-conditioned pooling with one average query (the
  mean of the store's caption features), then its Gaussian mean for probabilistic
  runs; the query is the run's text mean. Tied to the run that built it.

Which one is the default is decided by measurement (docs/search.md,
benchmarks/search_recall.py): the share of full-scoring top-10 videos that a
shortlist of 100 keeps on the world's 500 test videos is 95-96 % with segments, 88 %
with meanp or mean, 87 % with pooled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.registry import Registry
from ..model import DABModel

__all__ = ["VectorKind", "VECTOR_KINDS", "DEFAULT_VECTOR", "video_vectors", "query_vectors", "video_terms"]

DEFAULT_VECTOR = "segments"
SEGMENTS = 4


@dataclass(frozen=True)
class VectorKind:
    """A pair of maps into the index's space; ``needs_run``: the vectors depend on a run's weights."""

    videos: Callable[[Tensor, Tensor, Optional[DABModel], Optional[Tensor]], Tensor]  # (B,F,D),(B,F) -> (B,S,D)
    queries: Callable[[Tensor, Optional[DABModel]], Tensor]  # (M, D) -> (M, D)
    needs_run: bool
    about: str
    per_video: int = 1  # S vectors a video


VECTOR_KINDS: Registry[VectorKind] = Registry("index vector")


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(x.dtype)[..., None]  # (B, F, 1)
    return (x * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)  # (B, D)


def _meanp(frames: Tensor, mask: Tensor, model: Optional[DABModel], avg: Optional[Tensor]) -> Tensor:
    return F.normalize(_masked_mean(F.normalize(frames, dim=-1), mask), dim=-1)[:, None]  # (B, 1, D)


def _mean(frames: Tensor, mask: Tensor, model: Optional[DABModel], avg: Optional[Tensor]) -> Tensor:
    return F.normalize(_masked_mean(frames, mask), dim=-1)[:, None]  # (B, 1, D)


def segment_ids(mask: Tensor, n_seg: int) -> Tensor:
    """(B, F) bool -> (B, F) segment of each real frame (-1 for padding): its real frames in ``n_seg``
    consecutive runs of near-equal length."""
    rank = mask.long().cumsum(dim=1) - 1  # (B, F) rank among the real frames
    count = mask.long().sum(dim=1, keepdim=True).clamp_min(1)  # (B, 1)
    return torch.where(mask, rank * n_seg // count, torch.full_like(rank, -1))


def _segments(frames: Tensor, mask: Tensor, model: Optional[DABModel], avg: Optional[Tensor]) -> Tensor:
    unit = F.normalize(frames, dim=-1)  # (B, F, D)
    seg = segment_ids(mask, SEGMENTS)  # (B, F)
    onehot = (seg[..., None] == torch.arange(SEGMENTS)).to(unit.dtype)  # (B, F, S)
    sums = torch.einsum("bfs,bfd->bsd", onehot, unit)  # (B, S, D)
    empty = onehot.sum(dim=1) == 0  # (B, S): a video of fewer than S real frames
    whole = _masked_mean(unit, mask)[:, None].expand_as(sums)  # (B, S, D)
    return F.normalize(torch.where(empty[..., None], whole, sums), dim=-1)  # (B, S, D)


def _text(text: Tensor, model: Optional[DABModel]) -> Tensor:
    return F.normalize(text, dim=-1)


def _pooled(frames: Tensor, mask: Tensor, model: Optional[DABModel], avg: Optional[Tensor]) -> Tensor:
    assert model is not None and avg is not None, "the pooled vector needs the run's model and an average query"
    ts = model.encode_text(avg.reshape(1, -1))  # one query for every video
    vs = model.encode_video(frames, mask)
    v_c = model.pool.pool(ts.q.expand(len(frames), -1, -1), vs.k, vs.v, vs.mask, grid=False)  # (B, D)
    if model.prob is not None:
        v_c = model.prob(v_c)[0]  # the Gaussian's mean: what the KL's squared distance compares
    return F.normalize(v_c, dim=-1)[:, None]  # (B, 1, D)


def _pooled_query(text: Tensor, model: Optional[DABModel]) -> Tensor:
    assert model is not None
    ts = model.encode_text(text)
    return F.normalize(ts.mu if ts.mu is not None else ts.feat, dim=-1)


VECTOR_KINDS.register(
    "segments",
    VectorKind(
        _segments,
        _text,
        False,
        f"meanP of {SEGMENTS} consecutive runs of frames, the best one counts",
        per_video=SEGMENTS,
    ),
)
VECTOR_KINDS.register("meanp", VectorKind(_meanp, _text, False, "mean of the L2-normalised frames (CLIP4Clip meanP)"))
VECTOR_KINDS.register("mean", VectorKind(_mean, _text, False, "mean of the raw frames"))
VECTOR_KINDS.register(
    "pooled",
    VectorKind(_pooled, _pooled_query, True, "the run's pooling with the mean caption as query (its Gaussian mean)"),
)


@torch.no_grad()
def video_vectors(
    kind: str,
    frames: np.ndarray | Tensor,
    mask: np.ndarray | Tensor,
    model: Optional[DABModel] = None,
    avg_query: Optional[np.ndarray] = None,
) -> np.ndarray:
    """frames (B, F, D), mask (B, F) -> (B, S, D) float32 unit vectors of ``kind`` (S = its ``per_video``)."""
    vk = VECTOR_KINDS.get(kind)
    dev = next(model.parameters()).device if model is not None else torch.device("cpu")
    fr = torch.as_tensor(np.asarray(frames, np.float32), device=dev)
    mk = torch.as_tensor(np.asarray(mask, bool), device=dev)
    avg = None if avg_query is None else torch.as_tensor(np.asarray(avg_query, np.float32), device=dev)
    return vk.videos(fr, mk, model, avg).float().cpu().numpy()


@torch.no_grad()
def video_terms(model: DABModel, frames: np.ndarray | Tensor, mask: np.ndarray | Tensor) -> np.ndarray:
    """frames (B, F, D), mask (B, F) -> the run's token-branch terms W1 h_bar + b1 (B, D) float16: the part of a
    pair's log-variance that depends on the video alone (``Scorer.video_terms``; float32 sums, kept in float16)."""
    assert model.token_unc is not None, "video terms need a model with a token branch (prob, dab)"
    was_training = model.training
    model.eval()
    try:
        dev = next(model.parameters()).device
        fr = torch.as_tensor(np.asarray(frames, np.float32), device=dev)
        mk = torch.as_tensor(np.asarray(mask, bool), device=dev)
        return model.token_unc.video_term(fr, mk).float().cpu().numpy().astype(np.float16)
    finally:
        model.train(was_training)


@torch.no_grad()
def query_vectors(kind: str, text: np.ndarray | Tensor, model: Optional[DABModel] = None) -> np.ndarray:
    """text (M, D) -> (M, D) float32 unit vectors in the same space as :func:`video_vectors`."""
    vk = VECTOR_KINDS.get(kind)
    dev = next(model.parameters()).device if model is not None else torch.device("cpu")
    t = text.float() if isinstance(text, Tensor) else torch.as_tensor(np.asarray(text, np.float32))
    return vk.queries(t.to(dev), model).float().cpu().numpy()
