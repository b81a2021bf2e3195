"""A scorer's passes through an engine: every pair of a grid, the candidate pairs of a shortlist, the
ground-truth pairs (diagnostics), and each row's top k."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ..core.events import Event, ProgressCallback
from .blocks import Texts, Videos
from .budget import pair_bytes, video_bytes
from .engines import Engine
from .planning import Plan, even_cuts, inner_tiles
from .result import ScoreResult

__all__ = ["topk_smallest", "score_grid", "score_candidates", "diagnostics", "to_device"]


def topk_smallest(cost: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``k`` smallest entries, ascending -> (indices (Q, k) int64, values (Q, k) float32).

    Equal costs are ordered by video index; NaN sorts last.  Works in row blocks
    with ``argpartition`` so a wide gallery costs O(V) a row, not O(V log V).
    """
    c_all = np.asarray(cost)
    n_q, n_v = c_all.shape
    k = max(0, min(int(k), n_v))
    idx = np.empty((n_q, k), np.int64)
    rows_per_block = max(1, (1 << 22) // max(n_v, 1))
    for r0 in range(0, n_q, rows_per_block):
        c = c_all[r0 : r0 + rows_per_block]
        if k == 0:
            continue
        if k < n_v:
            part = np.argpartition(c, k - 1, axis=1)[:, :k]  # (b, k) unordered
        else:
            part = np.broadcast_to(np.arange(n_v), c.shape)
        vals = np.take_along_axis(c, part, axis=1)
        order = np.lexsort((part, vals), axis=-1)  # by value, then index
        idx[r0 : r0 + len(c)] = np.take_along_axis(part, order, axis=1)
    return idx, np.take_along_axis(c_all, idx, axis=1).astype(np.float32)


class _Sink:
    """Moves finished blocks into the host cost matrix.

    On CUDA the device-to-host copies go to pinned buffers without blocking, so
    the next block's kernels are queued while they run; :meth:`flush` waits for
    them once per video chunk.
    """

    def __init__(self, out: np.ndarray, device: torch.device) -> None:
        self.out, self.device, self.cuda = out, device, device.type == "cuda"
        self.pending: list[tuple[Tensor, object, object]] = []

    def put(self, block: Tensor, rows: object, cols: object) -> None:
        if not self.cuda:
            self.out[rows, cols] = block.float().numpy()
            return
        host = torch.empty(block.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(block, non_blocking=True)
        self.pending.append((host, rows, cols))

    def flush(self) -> None:
        if self.pending:
            torch.cuda.synchronize(self.device)
            for host, rows, cols in self.pending:
                self.out[rows, cols] = host.numpy()
            self.pending.clear()


def to_device(x: Tensor, device: torch.device) -> Tensor:
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def score_grid(
    eng: Engine,
    ts: Texts,
    frames: Tensor,
    mask: Tensor,
    cost: np.ndarray,
    dev: torch.device,
    plan: Plan,
    progress: ProgressCallback,
    info: dict,
) -> None:
    """Fill ``cost`` (Q, V) with every pair: outer tiles of plan.tc x plan.vc, sub-blocks of at most p_max pairs."""
    n_q, n_v = cost.shape
    text_cuts, video_cuts = even_cuts(n_q, plan.tc), even_cuts(n_v, plan.vc)
    progress(Event("start", task="score", total=len(text_cuts) * len(video_cuts)))
    sink = _Sink(cost, dev)
    text_chunk = max(q1 - q0 for q0, q1 in text_cuts)
    for v0, v1 in video_cuts:
        vs = eng.videos(to_device(frames[v0:v1], dev), to_device(mask[v0:v1], dev))
        tq, tv = inner_tiles(text_chunk, v1 - v0, plan.p_max)
        for q0, q1 in text_cuts:
            for a, b in even_cuts(q1 - q0, tq):
                tsb = ts.take((None, slice(q0 + a, q0 + b)))  # (1, tq, ...): the same texts for every video
                for j, k in even_cuts(v1 - v0, tv):
                    block, _, _ = eng.pairs(tsb, vs.take(slice(j, k)))  # (tv, tq)
                    sink.put(block.T, slice(q0 + a, q0 + b), slice(v0 + j, v0 + k))
                    info["sub_blocks"] += 1
            progress(Event("advance", task="score", n=1))
        sink.flush()
    progress(Event("end", task="score"))


def score_candidates(
    eng: Engine,
    ts: Texts,
    frames: Tensor,
    mask: Tensor,
    cand: np.ndarray,
    cost: np.ndarray,
    dev: torch.device,
    plan: Plan,
    progress: ProgressCallback,
    info: dict,
) -> None:
    """Score the (query, candidate) pairs of ``cand`` (Q, K) into ``cost``, video chunk by video chunk.

    A chunk's pairs are sorted by video and packed into rows of at most M texts
    per video (M ~ the mean candidates per video), so each video's bases serve a
    whole row and are gathered once a row, not once a pair; the padding of short
    rows is dropped before the bridge.
    """
    n_q, n_v = cost.shape
    vc = plan.vc
    q_idx = np.repeat(np.arange(n_q), cand.shape[1])  # (Q*K,)
    v_idx = cand.reshape(-1)
    order = np.argsort(v_idx, kind="stable")
    q_idx, v_idx = q_idx[order], v_idx[order]
    bounds = np.searchsorted(v_idx, np.arange(0, n_v + vc, vc))
    n_vc = -(-n_v // vc)
    progress(Event("start", task="score", total=n_vc))
    sink = _Sink(cost, dev)
    for c, v0 in enumerate(range(0, n_v, vc)):
        lo, hi = int(bounds[c]), int(bounds[c + 1])
        if hi > lo:
            v1 = min(v0 + vc, n_v)
            vs = eng.videos(to_device(frames[v0:v1], dev), to_device(mask[v0:v1], dev))
            _score_chunk_rows(
                eng, ts, vs, q_idx[lo:hi], v_idx[lo:hi] - v0, v0, v1, frames.shape[1], sink, dev, plan, info
            )
            sink.flush()
        progress(Event("advance", task="score", n=1))
    progress(Event("end", task="score"))


def _score_chunk_rows(
    eng: Engine,
    ts: Texts,
    vs: Videos,
    qs: np.ndarray,
    vl: np.ndarray,
    v0: int,
    v1: int,
    n_f: int,
    sink: _Sink,
    dev: torch.device,
    plan: Plan,
    info: dict,
) -> None:
    """One video chunk's candidate pairs (queries ``qs``, chunk-local videos ``vl``, sorted by video) in rows."""
    per_pair = plan.per_pair  # pair_bytes(cfg, n_f, dtype)
    per_row_video = video_bytes(eng.cfg, n_f, transient=False)
    counts = np.bincount(vl, minlength=v1 - v0)  # (vc,)
    width = max(1, int(math.ceil(counts[counts > 0].mean())))  # M
    n_rows = -(-counts // width)  # rows per video
    row_start = np.concatenate([[0], np.cumsum(n_rows)])[:-1]
    first_pair = np.concatenate([[0], np.cumsum(counts)])[:-1]
    pos = np.arange(len(vl)) - first_pair[vl]  # rank of each pair within its video
    row = row_start[vl] + pos // width  # (P,)
    slot = row * width + pos % width  # (P,) flat slot in the (rows, M) grid
    row_video = np.repeat(np.arange(v1 - v0), n_rows)  # (rows,)
    grid_q = np.zeros(int(n_rows.sum()) * width, np.int64)
    grid_q[slot] = qs  # padding slots point at text 0 and are dropped
    grid_q = grid_q.reshape(-1, width)
    rows_per_block = max(1, plan.budget // (width * per_pair + per_row_video))
    for r0 in range(0, len(row_video), rows_per_block):
        r1 = min(r0 + rows_per_block, len(row_video))
        sel = (row >= r0) & (row < r1)  # this block's pairs (contiguous: rows follow the sort)
        keep = torch.from_numpy(slot[sel] - r0 * width).to(dev)
        block, _, _ = eng.pairs(
            ts.take(torch.from_numpy(grid_q[r0:r1]).to(dev)),
            vs.take(torch.from_numpy(row_video[r0:r1]).to(dev)),
            keep=keep,
        )  # (P,)
        sink.put(block, qs[sel], vl[sel] + v0)
        info["sub_blocks"] += 1


def diagnostics(
    eng: Engine, ts: Texts, frames: Tensor, mask: Tensor, gt: Tensor, dev: torch.device, plan: Plan, result: ScoreResult
) -> None:
    """Mean sigma^2 of text, bridged text and video for the Q ground-truth pairs only (aligned, never the grid)."""
    assert ts.text_var is not None
    n_q, n_f = len(gt), frames.shape[1]
    result.text_var = ts.text_var.float().cpu().numpy()  # the text's own, before dab-const's shift
    step = max(1, plan.budget // (pair_bytes(eng.cfg, n_f, plan.dtype) + video_bytes(eng.cfg, n_f)))
    bridged, video = [], []
    for q0 in range(0, n_q, step):
        g = gt[q0 : q0 + step]
        vs = eng.videos(to_device(frames[g], dev), to_device(mask[g], dev))  # this chunk's ground-truth videos
        _, bv, vv = eng.pairs(ts.take((slice(q0, q0 + step), None)), vs, want_var=True)  # text p with video p
        assert bv is not None and vv is not None
        bridged.append(bv[:, 0].float().cpu().numpy())
        video.append(vv[:, 0].float().cpu().numpy())
    empty = np.empty(0, np.float32)
    result.bridged_var = np.concatenate(bridged) if bridged else empty
    result.video_var = np.concatenate(video) if video else empty
