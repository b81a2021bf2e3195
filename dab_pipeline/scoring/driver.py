"""score_all: tiling, shortlists, top-k and diagnostics around the engine."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.errors import ConfigError
from ..core.events import Event, ProgressCallback, null_progress
from ..model import DABModel, ModelConfig
from ..runtime.devices import resolve_device
from .blocks import Texts
from .budget import available_ram, default_memory_budget, pair_bytes, video_bytes
from .engines import Engine, build_engine
from .result import SCORE_DTYPES, ScoreResult, prepare_inputs
from .tiles import CANDIDATES, TUNE_MIN_PAIRS, tuned_pairs, tuning_enabled


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
        c = c_all[r0: r0 + rows_per_block]
        if k == 0:
            continue
        if k < n_v:
            part = np.argpartition(c, k - 1, axis=1)[:, :k]  # (b, k) unordered
        else:
            part = np.broadcast_to(np.arange(n_v), c.shape)
        vals = np.take_along_axis(c, part, axis=1)
        order = np.lexsort((part, vals), axis=-1)  # by value, then index
        idx[r0: r0 + len(c)] = np.take_along_axis(part, order, axis=1)
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


def _to_device(x: Tensor, device: torch.device) -> Tensor:
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def inner_tiles(n_text: int, n_video: int, p_max: int, video_cap: Optional[int] = None) -> tuple[int, int]:
    """A near-square (texts, videos) tile of at most ``p_max`` pairs (and ``video_cap`` videos)
    that cuts an n_text x n_video block into equal tiles."""
    cap = min(n_video, video_cap) if video_cap is not None else n_video
    if n_text * cap <= p_max:
        tq, tv = n_text, cap
    else:
        tq = min(n_text, max(1, math.isqrt(p_max)))
        tv = min(cap, max(1, p_max // tq))
        tq = min(n_text, max(1, p_max // tv))
    # equal tiles instead of full ones and a thin remainder: the products run at full rate
    # only from a few hundred rows, and a remainder block of a few dozen pairs does not
    return -(-n_text // -(-n_text // tq)), -(-n_video // -(-n_video // tv))


def _shortlist(text: Tensor, frames: Tensor, mask: Tensor, k: int, device: torch.device, p_max: int) -> np.ndarray:
    """First stage: each query's top-k videos by cosine of the text and the mean of the real frames -> (Q, k)."""
    m = mask.to(frames.dtype)[..., None]  # (V, F, 1)
    mean = (frames * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)  # (V, D)
    vid = F.normalize(mean, dim=-1).to(device)  # (V, D)
    txt = F.normalize(text, dim=-1)
    out = np.empty((text.shape[0], k), np.int64)
    rows = max(1, p_max // max(1, vid.shape[0]) * 8)
    for q0 in range(0, text.shape[0], rows):
        sim = txt[q0: q0 + rows].to(device) @ vid.T  # (b, V)
        out[q0: q0 + rows] = torch.topk(sim, k, dim=1).indices.cpu().numpy()
    return out


def score_all(
    model: DABModel,
    text: np.ndarray | Tensor,
    frames: np.ndarray | Tensor,
    mask: np.ndarray | Tensor,
    *,
    text_chunk: Optional[int] = None,
    video_chunk: Optional[int] = None,
    device: str | torch.device = "cpu",
    progress: ProgressCallback | None = None,
    gt: np.ndarray | Tensor | None = None,
    topk: Optional[int] = None,
    memory_budget: Optional[int] = None,
    dtype: str = "float32",
    shortlist: Optional[int] = None,
    engines: Optional[dict] = None,
) -> ScoreResult:
    """Score every text against every video with the fast engine (same function as the reference).

    text (Q, D), frames (V, F, D), mask (V, F) bool; gt (Q,) optional index of each
    query's ground-truth video (per-query variance diagnostics, Table 6).

    * ``text_chunk`` / ``video_chunk``: outer tiles (one progress step each); None
      derives them from the budget.  Within a tile, sub-blocks never exceed
      ``memory_budget`` bytes of per-pair work (default
      :func:`default_memory_budget` of ``device``).
    * ``dtype``: "float32" (matches the reference to ~1e-6) or "bfloat16" (the
      bridge's matrix products in bf16 with float32 accumulation, states and cost
      in float32).
    * ``topk``: also return each query's k best videos (indices and costs, best first).
    * ``shortlist``: score only each query's top-K videos by cosine of the text and
      the frame mean; every other cost is ``+inf``.  None (default) is exact.
    * ``engines``: a dict the caller keeps between calls on the same, unchanging model
      (a search server): the built engines are cached in it (building one costs
      ~20-30 ms at D = 512, more than scoring a 100-video shortlist).

    The model is moved to ``device`` ("auto": CUDA when available) and run in eval
    mode; its training flag is restored.  Emits "start" / "advance" / "end" events
    for task "score".
    """
    _check_options(dtype, topk, shortlist, memory_budget)
    progress = progress or null_progress
    text_t, frames_t, mask_t, gt_t = prepare_inputs(model, text, frames, mask, gt, text_chunk, video_chunk)
    dev, cfg, was_training = resolve_device(device), model.cfg, model.training
    n_q, n_v, n_f = text_t.shape[0], frames_t.shape[0], frames_t.shape[1]
    plan = _plan(cfg, n_q, n_v, n_f, dev, dtype, memory_budget, text_chunk, video_chunk)
    model.eval().to(dev)
    best = tune_blocks(model, n_q, n_v, n_f, dev, dtype, memory_budget) if shortlist is None else None
    if best is not None:
        plan = _plan(cfg, n_q, n_v, n_f, dev, dtype, memory_budget, text_chunk, video_chunk, pairs_cap=best)
    info = plan.info()
    try:
        with torch.no_grad():
            mm_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
            hint = min(plan.p_max, max(1, n_q * n_v))
            key = (id(model), str(dev), mm_dtype, hint)
            eng = engines.get(key) if engines is not None else None
            if eng is None:
                eng = build_engine(model, dev, mm_dtype, batch_hint=hint)
                if engines is not None:
                    engines[key] = eng
            info.update(_products(eng, dev, dtype))
            ts = eng.texts(text_t.to(dev))
            cost = _costs(eng, ts, text_t, frames_t, mask_t, dev, plan, shortlist, progress, info)
            result = ScoreResult(cost=cost, shortlist=info.get("shortlist"), info=info)
            if gt_t is not None and cfg.probabilistic:
                _diagnostics(eng, ts, frames_t, mask_t, gt_t, dev, plan.budget, cfg, n_f, dtype, result)
        if topk is not None:
            result.topk_indices, result.topk_costs = topk_smallest(cost, topk)
        return result
    finally:
        model.train(was_training)


def tune_blocks(model: DABModel, n_q: int, n_v: int, num_frames: int, device: str | torch.device = "cpu",
                dtype: str = "float32", memory_budget: Optional[int] = None) -> Optional[int]:
    """The sub-block size (pairs) :func:`score_all` uses for an exact ``n_q`` x ``n_v`` grid, measured now when
    this CPU and model shape have no cached measurement (scoring/tiles.py); None where it does not tune (GPU,
    a variant without a bridge, an explicit memory budget, grids under ``TUNE_MIN_PAIRS``, DAB_TILE_TUNING=0).
    Benchmarks call it before timing."""
    dev, cfg = resolve_device(device), model.cfg
    if not (dev.type == "cpu" and cfg.runs_drift and memory_budget is None and n_q * n_v >= TUNE_MIN_PAIRS
            and tuning_enabled()):
        return None
    per_pair = pair_bytes(cfg, num_frames, dtype)
    ram = available_ram() or default_memory_budget(dev) * 4
    limit = max(_plan(cfg, n_q, n_v, num_frames, dev, dtype, None, None, None).p_max, int(0.25 * ram) // per_pair)
    caps = [c for c in CANDIDATES if c <= min(limit, n_q * n_v)]
    if not caps:
        return None

    def shape(cap: int) -> tuple[int, int]:
        """The first sub-block the driver cuts under this cap (the others are equal or smaller)."""
        plan = _plan(cfg, n_q, n_v, num_frames, dev, dtype, None, None, None, pairs_cap=cap)
        return inner_tiles(min(plan.tc, n_q), min(plan.vc, n_v), plan.p_max)

    was_training = model.training
    model.eval()
    try:
        return tuned_pairs(model, dev, torch.bfloat16 if dtype == "bfloat16" else torch.float32, num_frames, caps,
                           shape, (n_q, n_v))
    finally:
        model.train(was_training)


def _costs(eng: Engine, ts: Texts, text_t: Tensor, frames_t: Tensor, mask_t: Tensor, dev: torch.device,
           plan: "_Plan", shortlist: Optional[int], progress: ProgressCallback, info: dict) -> np.ndarray:
    """The (Q, V) cost matrix: every pair, or each query's shortlist (+inf elsewhere)."""
    n_q, n_v, n_f = text_t.shape[0], frames_t.shape[0], frames_t.shape[1]
    if shortlist is None:
        cost = np.empty((n_q, n_v), dtype=np.float32)
        _score_grid(eng, ts, frames_t, mask_t, cost, dev, plan.tc, plan.vc, plan.p_max, progress, info)
        return cost
    cost = np.full((n_q, n_v), np.inf, dtype=np.float32)
    k_sl = info["shortlist"] = min(shortlist, n_v)
    cand = (_shortlist(text_t, frames_t, mask_t, k_sl, dev, plan.p_max) if n_q and n_v
            else np.empty((n_q, 0), np.int64))
    _score_shortlist(eng, ts, frames_t, mask_t, cand, cost, dev, plan.vc, plan.budget, eng.cfg, n_f, plan.dtype,
                     progress, info)
    return cost


def _check_options(dtype: str, topk: Optional[int], shortlist: Optional[int], memory_budget: Optional[int]) -> None:
    if dtype not in SCORE_DTYPES:
        raise ConfigError(f"dtype={dtype!r} is invalid; valid: {' | '.join(SCORE_DTYPES)}")
    if topk is not None and topk < 1:
        raise ConfigError(f"topk must be a positive integer, got {topk}")
    if shortlist is not None and shortlist < 1:
        raise ConfigError(f"shortlist must be a positive integer, got {shortlist}")
    if memory_budget is not None and memory_budget < 1:
        raise ConfigError(f"memory_budget must be a positive number of bytes, got {memory_budget}")


@dataclass(frozen=True)
class _Plan:
    """How one score_all call tiles its grid: outer tiles (tc x vc) and at most p_max pairs per sub-block."""

    budget: int
    per_pair: int
    p_max: int
    tc: int
    vc: int
    dtype: str
    device: str

    def info(self) -> dict:
        return {"engine": "fast", "dtype": self.dtype, "device": self.device, "memory_budget": self.budget,
                "pair_bytes": self.per_pair, "text_chunk": self.tc, "video_chunk": self.vc, "sub_blocks": 0,
                "block_pairs": self.p_max}


def _plan(cfg: ModelConfig, n_q: int, n_v: int, n_f: int, dev: torch.device, dtype: str,
          memory_budget: Optional[int], text_chunk: Optional[int], video_chunk: Optional[int],
          pairs_cap: Optional[int] = None) -> _Plan:
    budget = int(memory_budget) if memory_budget is not None else default_memory_budget(dev)
    per_pair = pair_bytes(cfg, n_f, dtype)
    if pairs_cap is not None:  # a measured sub-block size (tune_blocks): the budget follows it
        budget = max(budget, pairs_cap * per_pair)
    p_max = max(1, budget // per_pair)
    if pairs_cap is not None:
        p_max = max(1, min(p_max, pairs_cap))
    # one video chunk's bases take at most half the budget
    v_cap = max(1, min(n_v, (budget // 2) // video_bytes(cfg, n_f)))
    if text_chunk is None and video_chunk is None:
        tc, vc = inner_tiles(max(n_q, 1), max(n_v, 1), p_max, video_cap=max(v_cap, 1))
    else:
        vc = video_chunk if video_chunk is not None else v_cap
        tc = text_chunk if text_chunk is not None else max(1, min(max(n_q, 1), p_max // max(1, min(vc, n_v))))
    return _Plan(budget, per_pair, p_max, tc, vc, dtype, str(dev))


def _products(eng: Engine, dev: torch.device, dtype: str) -> dict:
    """What runs the products: the AMX bridge (its products with SiLU and the update in their epilogues), oneDNN
    with the fused (or eager) kernels, or ATen in the matmul dtype."""
    if eng.onednn is not None and eng.kernels is not None:
        kern = eng.kernels
        products = "amx" if eng.steps is not None and eng.steps.amx is not None else "onednn"
        return {"products": products, "kernels": kern.name if kern.fused else f"eager ({kern.reason})"}
    # ATen's products in mm_dtype (on a CPU without native bf16, bf16 ones are emulated: slow)
    return {"products": f"aten {dtype}" if dev.type == "cpu" else f"{dev.type} {dtype}"}


def even_cuts(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) pieces of range(n), as few as pieces of at most ``size`` allow, their lengths within one
    of each other: 256 by 37 gives 36 / 37 each, not six 37s and a 34 (a grid's last row and column of
    sub-blocks would be the smallest, and oneDNN's bf16 products ran at half rate below ~1,200 rows)."""
    k = -(-n // max(1, size))
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def _score_grid(eng: Engine, ts: Texts, frames: Tensor, mask: Tensor, cost: np.ndarray, dev: torch.device,
                tc: int, vc: int, p_max: int, progress: ProgressCallback, info: dict) -> None:
    n_q, n_v = cost.shape
    text_cuts, video_cuts = even_cuts(n_q, tc), even_cuts(n_v, vc)
    progress(Event("start", task="score", total=len(text_cuts) * len(video_cuts)))
    sink = _Sink(cost, dev)
    text_chunk = max(q1 - q0 for q0, q1 in text_cuts)
    for v0, v1 in video_cuts:
        vs = eng.videos(_to_device(frames[v0:v1], dev), _to_device(mask[v0:v1], dev))
        tq, tv = inner_tiles(text_chunk, v1 - v0, p_max)
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


def _score_shortlist(eng: Engine, ts: Texts, frames: Tensor, mask: Tensor, cand: np.ndarray, cost: np.ndarray,
                     dev: torch.device, vc: int, budget: int, cfg: ModelConfig, n_f: int, dtype: str,
                     progress: ProgressCallback, info: dict) -> None:
    """Score the (query, candidate) pairs, video chunk by video chunk.

    A chunk's pairs are sorted by video and packed into rows of at most M texts
    per video (M ~ the mean candidates per video), so each video's bases serve a
    whole row and are gathered once a row, not once a pair; the padding of short
    rows is dropped before the bridge.
    """
    n_q, n_v = cost.shape
    q_idx = np.repeat(np.arange(n_q), cand.shape[1])  # (Q*K,)
    v_idx = cand.reshape(-1)
    order = np.argsort(v_idx, kind="stable")
    q_idx, v_idx = q_idx[order], v_idx[order]
    bounds = np.searchsorted(v_idx, np.arange(0, n_v + vc, vc))
    per_pair = pair_bytes(cfg, n_f, dtype)
    per_row_video = video_bytes(cfg, n_f, transient=False)
    n_vc = -(-n_v // vc)
    progress(Event("start", task="score", total=n_vc))
    sink = _Sink(cost, dev)
    for c, v0 in enumerate(range(0, n_v, vc)):
        lo, hi = int(bounds[c]), int(bounds[c + 1])
        if hi > lo:
            v1 = min(v0 + vc, n_v)
            vs = eng.videos(_to_device(frames[v0:v1], dev), _to_device(mask[v0:v1], dev))
            qs, vl = q_idx[lo:hi], v_idx[lo:hi] - v0  # sorted by vl
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
            rows_per_block = max(1, budget // (width * per_pair + per_row_video))
            for r0 in range(0, len(row_video), rows_per_block):
                r1 = min(r0 + rows_per_block, len(row_video))
                sel = (row >= r0) & (row < r1)  # this block's pairs (contiguous: rows follow the sort)
                keep = torch.from_numpy(slot[sel] - r0 * width).to(dev)
                block, _, _ = eng.pairs(ts.take(torch.from_numpy(grid_q[r0:r1]).to(dev)),
                                        vs.take(torch.from_numpy(row_video[r0:r1]).to(dev)), keep=keep)  # (P,)
                sink.put(block, qs[sel], vl[sel] + v0)
                info["sub_blocks"] += 1
            sink.flush()
        progress(Event("advance", task="score", n=1))
    progress(Event("end", task="score"))


def _diagnostics(eng: Engine, ts: Texts, frames: Tensor, mask: Tensor, gt: Tensor, dev: torch.device,
                 budget: int, cfg: ModelConfig, n_f: int, dtype: str, result: ScoreResult) -> None:
    """Mean sigma^2 of text, bridged text and video for the Q ground-truth pairs only (aligned, never the grid)."""
    assert ts.logvar is not None
    n_q = len(gt)
    result.text_var = ts.logvar.exp().mean(dim=-1).float().cpu().numpy()
    step = max(1, budget // (pair_bytes(cfg, n_f, dtype) + video_bytes(cfg, n_f)))
    bridged, video = [], []
    for q0 in range(0, n_q, step):
        g = gt[q0: q0 + step]
        vs = eng.videos(_to_device(frames[g], dev), _to_device(mask[g], dev))  # this chunk's ground-truth videos
        _, bv, vv = eng.pairs(ts.take((slice(q0, q0 + step), None)), vs, want_var=True)  # text p with video p
        assert bv is not None and vv is not None
        bridged.append(bv[:, 0].float().cpu().numpy())
        video.append(vv[:, 0].float().cpu().numpy())
    empty = np.empty(0, np.float32)
    result.bridged_var = np.concatenate(bridged) if bridged else empty
    result.video_var = np.concatenate(video) if video else empty
