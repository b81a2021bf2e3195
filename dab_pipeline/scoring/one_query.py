"""One query's shortlist, or a batch's pairs, through an engine's one-text path (``Scorer.score_query`` /
``score_queries``): the inputs checked, the videos in blocks, each block one ``Engine.one_query`` call."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch
from torch import Tensor

from ..model import DABModel
from .blocks import Texts
from .engines import Engine
from .planning import even_cuts
from .result import as_tensor

__all__ = ["one_query_inputs", "frames_and_mask", "as_float", "score_rows", "score_pairs"]


def one_query_inputs(model: DABModel, text, frames, mask, cast: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """:meth:`Scorer.score_query`'s inputs as tensors, text (1, D) and frames (K, F, D) float32 (``cast=False``: in
    their own dtype, a store's float16 converted block by block later), mask (K, F) bool, checked against the model
    as its own path checks them (ValueError)."""
    t = as_float(text).reshape(1, -1)
    if t.shape[1] != model.cfg.embed_dim:
        raise ValueError(f"text {tuple(t.shape)} must end in embed_dim={model.cfg.embed_dim}")
    return (t, *frames_and_mask(model, frames, mask, cast))


def frames_and_mask(model: DABModel, frames, mask, cast: bool = True) -> tuple[Tensor, Tensor]:
    """frames (K, F, D) as a float32 tensor (``cast=False``: in its own dtype) and mask (K, F) as bool, checked
    against the model (ValueError)."""
    fr = as_float(frames) if cast else as_tensor(frames)
    mk = torch.as_tensor(np.asarray(mask) if not isinstance(mask, Tensor) else mask).to(torch.bool)
    d = model.cfg.embed_dim
    if fr.dim() != 3 or fr.shape[2] != d:
        raise ValueError(f"frames {tuple(fr.shape)} must be (K, F, D) with D = embed_dim={d}")
    if mk.shape != fr.shape[:2]:
        raise ValueError(f"mask shape {tuple(mk.shape)} must be the frames' (K, F) = {tuple(fr.shape[:2])}")
    return fr, mk


def as_float(x: np.ndarray | Tensor) -> Tensor:
    """x as a float32 tensor (a read-only array, such as a memory map, copied first)."""
    return as_tensor(x).float()


def score_rows(
    eng: Engine,
    texts: Callable[[int, int], Texts],
    fr: Tensor,
    mk: Tensor,
    rows: np.ndarray,
    vt: Optional[Tensor],
    device: torch.device,
    chunk: int,
) -> np.ndarray:
    """The costs (P,) float32 of ``fr[rows]`` in blocks of up to ``chunk`` videos, block [a, b) against ``texts(a,
    b)`` (one text for every video, or a text a video); ``vt``: the videos' token-branch terms (rows of ``fr``) or
    None."""
    rows = np.asarray(rows, np.int64)
    whole = len(rows) == len(fr) and bool((rows == np.arange(len(fr))).all())  # one query's own frames: no gather
    out = np.empty(len(rows), np.float32)
    for a, b in even_cuts(len(rows), chunk):
        idx = slice(a, b) if whole else torch.from_numpy(rows[a:b])
        f_blk, m_blk = fr[idx].to(device).float(), mk[idx].to(device)  # (b - a, F, D) float32
        t_blk = None if vt is None else vt[idx].to(device).float()  # (b - a, D)
        cost = eng.one_query(texts(a, b), f_blk, m_blk, t_blk)  # (b - a,)
        assert cost is not None, "has_one_query said this engine has the path"
        out[a:b] = cost.float().cpu().numpy()
    return out


def score_pairs(
    eng: Engine,
    ts_all: Texts,
    fr: Tensor,
    mk: Tensor,
    lists: list[np.ndarray],
    vt: Optional[Tensor],
    device: torch.device,
    chunk: int,
) -> list[np.ndarray]:
    """Query i's costs over its shortlist ``lists[i]`` (rows of ``fr``), the queries' (query, video) pairs in blocks
    of up to ``chunk`` through the engine's one-text path with a text a video."""
    text_of = torch.repeat_interleave(torch.arange(len(lists)), torch.tensor([len(r) for r in lists]))  # (P,)
    out = score_rows(
        eng, lambda a, b: ts_all.take(text_of[a:b].to(device)), fr, mk, np.concatenate(lists), vt, device, chunk
    )
    return list(np.split(out, np.cumsum([len(r) for r in lists])[:-1]))
