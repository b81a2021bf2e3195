"""How a scorer cuts a (texts x videos) grid: outer tiles, sub-blocks under a memory budget, measured sizes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ..model import DABModel, ModelConfig
from ..runtime.devices import resolve_device
from .budget import available_ram, default_memory_budget, pair_bytes, video_bytes
from .tiles import CANDIDATES, TUNE_MIN_PAIRS, tuned_pairs, tuning_enabled

__all__ = ["Plan", "plan_grid", "inner_tiles", "even_cuts", "tune_blocks"]


@dataclass(frozen=True)
class Plan:
    """How one grid is tiled: outer tiles (tc x vc) and at most p_max pairs per sub-block."""

    budget: int
    per_pair: int
    p_max: int
    tc: int
    vc: int
    dtype: str
    device: str

    def info(self) -> dict:
        return {
            "engine": "fast",
            "dtype": self.dtype,
            "device": self.device,
            "memory_budget": self.budget,
            "pair_bytes": self.per_pair,
            "text_chunk": self.tc,
            "video_chunk": self.vc,
            "sub_blocks": 0,
            "block_pairs": self.p_max,
        }


def plan_grid(
    cfg: ModelConfig,
    n_q: int,
    n_v: int,
    n_f: int,
    dev: torch.device,
    dtype: str,
    memory_budget: Optional[int],
    text_chunk: Optional[int],
    video_chunk: Optional[int],
    pairs_cap: Optional[int] = None,
) -> Plan:
    """The tiles of an n_q x n_v grid of ``n_f``-frame videos; ``pairs_cap``: a measured sub-block size."""
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
    return Plan(budget, per_pair, p_max, tc, vc, dtype, str(dev))


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


def even_cuts(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) pieces of range(n), as few as pieces of at most ``size`` allow, their lengths within one
    of each other: 256 by 37 gives 36 / 37 each, not six 37s and a 34 (a grid's last row and column of
    sub-blocks would be the smallest, and oneDNN's bf16 products ran at half rate below ~1,200 rows)."""
    k = -(-n // max(1, size))
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def tune_blocks(
    model: DABModel,
    n_q: int,
    n_v: int,
    num_frames: int,
    device: str | torch.device = "cpu",
    dtype: str = "float32",
    memory_budget: Optional[int] = None,
) -> Optional[int]:
    """The sub-block size (pairs) a scorer uses for an exact ``n_q`` x ``n_v`` grid, measured now when this CPU
    and model shape have no cached measurement (scoring/tiles.py); None where it does not tune (GPU, a variant
    without a bridge, an explicit memory budget, grids under ``TUNE_MIN_PAIRS``, DAB_TILE_TUNING=0).
    Benchmarks call it (or ``Scorer.prepare``) before timing."""
    dev, cfg = resolve_device(device), model.cfg
    if not (
        dev.type == "cpu"
        and cfg.runs_drift
        and memory_budget is None
        and n_q * n_v >= TUNE_MIN_PAIRS
        and tuning_enabled()
    ):
        return None
    per_pair = pair_bytes(cfg, num_frames, dtype)
    ram = available_ram() or default_memory_budget(dev) * 4
    limit = max(plan_grid(cfg, n_q, n_v, num_frames, dev, dtype, None, None, None).p_max, int(0.25 * ram) // per_pair)
    caps = [c for c in CANDIDATES if c <= min(limit, n_q * n_v)]
    if not caps:
        return None

    def shape(cap: int) -> tuple[int, int]:
        """The first sub-block the scorer cuts under this cap (the others are equal or smaller)."""
        plan = plan_grid(cfg, n_q, n_v, num_frames, dev, dtype, None, None, None, pairs_cap=cap)
        return inner_tiles(min(plan.tc, n_q), min(plan.vc, n_v), plan.p_max)

    was_training = model.training
    model.eval()
    try:
        return tuned_pairs(
            model, dev, torch.bfloat16 if dtype == "bfloat16" else torch.float32, num_frames, caps, shape, (n_q, n_v)
        )
    finally:
        model.train(was_training)
