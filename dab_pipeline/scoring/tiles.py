"""Sub-block sizes from measured rates on the running CPU (cached per CPU like the kernel builds).

The engine scores a grid in sub-blocks of P pairs; each bridge step is three products of
P rows ((P, n*D) x (n*D, H), (P, H) x (H, H), (P, H) x (H, n*D)) and fused elementwise
passes over P rows. oneDNN's bf16 kernels (AMX tiles on Sapphire Rapids) run at very
different rates for different P: a packed (P, 1024) x (1024, 1024) linear, measured on this
machine kind, ran at 2,303 GFLOP/s for P = 512, 1,344 for 1,024, 2,655-2,888 for 1,369 and
2,712-2,730 for 4,096 (docs/performance.md). The memory budget alone
(~1,400 pairs at D = 512) can land on a slow one, and the best P differs between CPUs.

So before a large grid on CPU (at least ``TUNE_MIN_PAIRS`` pairs, bf16 or float32, no explicit memory
budget), :func:`tuned_pairs` times the engine's own sub-block (``Engine.pairs``: the products, the
kernels, the pooling) for each candidate cap on P, at exactly the (texts x videos) shape the driver
cuts the grid into under that cap, up to what a quarter of the free RAM holds, and keeps the
fastest per pair. The rates are cached in ``<dab cache>/tiles.json`` under a key of
the CPU's flags, torch's version, the thread count, the model's shapes and the grid's (in bf16
also the kernels' build), so a machine measures a shape once. ``DAB_TILE_TUNING=0`` turns it off (the budget's P is used).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from ..model import DABModel
from .engines import build_engine
from .engines.bridge_runner import amx_bridge_applies
from .kernels.cpu import build_key, cpu_signature, kernel_cache_dir

__all__ = ["CANDIDATES", "TUNE_MIN_PAIRS", "tuning_enabled", "tuned_pairs", "tiles_cache_path", "tile_key"]

CANDIDATES = (256, 384, 512, 768, 1024, 1280, 1536, 2048, 2560, 3072, 4096, 6144, 8192)
TUNE_MIN_PAIRS = 50_000  # the timing (~2-4 s, once per machine and shape) costs less than such a grid
_memo: dict[str, dict[str, float]] = {}  # key -> the rates measured in this process


def tuning_enabled() -> bool:
    return os.environ.get("DAB_TILE_TUNING", "auto").strip().lower() not in ("0", "off", "false", "no")


def tiles_cache_path() -> Path:
    return kernel_cache_dir().parent / "tiles.json"


def tile_key(model: DABModel, num_frames: int, dtype: torch.dtype) -> str:
    cfg = model.cfg
    # which products run (AMX tiles with fused epilogues, or oneDNN and passes) and, in bf16, which build of the
    # kernels (their source and flags) change the rates: a new build measures again
    products = "amx" if dtype == torch.bfloat16 and amx_bridge_applies(cfg.embed_dim, cfg.drift_hidden) else "default"
    if dtype == torch.bfloat16:
        products += ":" + build_key()
    parts = [
        cpu_signature(),
        torch.__version__,
        str(torch.get_num_threads()),
        str(dtype),
        cfg.variant,
        str(cfg.embed_dim),
        str(cfg.drift_hidden),
        str(cfg.drift_layers),
        str(cfg.steps),
        str(cfg.num_heads),
        str(num_frames),
        str(cfg.cost),
        products,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


def _time_block(
    model: DABModel, device: torch.device, dtype: torch.dtype, num_frames: int, tq: int, tv: int, repeats: int = 3
) -> float:
    """Seconds a pair of one engine sub-block of tq texts x tv videos (best of ``repeats`` after a warm-up)."""
    eng = build_engine(model, device, dtype, batch_hint=tq * tv)
    gen = torch.Generator().manual_seed(0)
    d = model.cfg.embed_dim
    ts = eng.texts(torch.randn(tq, d, generator=gen))
    vs = eng.videos(torch.randn(tv, num_frames, d, generator=gen), torch.ones(tv, num_frames, dtype=torch.bool))
    block = ts.take((None, slice(0, tq)))
    eng.pairs(block, vs)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        eng.pairs(block, vs)
        best = min(best, time.perf_counter() - t0)
    return best / (tq * tv)


def tuned_pairs(
    model: DABModel,
    device: torch.device,
    dtype: torch.dtype,
    num_frames: int,
    caps: list[int],
    shape: Callable[[int], tuple[int, int]],
    grid: tuple[int, int],
    measure: Optional[Callable[[int, int], float]] = None,
) -> int:
    """Of the candidate caps on the sub-block's pairs, the one whose sub-block (``shape(cap)`` -> (texts,
    videos), exactly as the driver will cut the ``grid``) scored fastest per pair here. Each shape's rate is
    measured once per key (CPU, torch, threads, model, grid) and cached, so a later call with other caps
    (another amount of free RAM) measures only shapes it has not seen. ``measure(tq, tv) -> seconds a pair``
    replaces the timing (tests)."""
    key = f"{tile_key(model, num_frames, dtype)}:{grid[0]}x{grid[1]}"
    shapes: dict[tuple[int, int], int] = {}  # the sub-block each cap gives; several caps may give one shape
    for cap in caps:
        shapes.setdefault(shape(cap), cap)
    rates = _memo.get(key, {})  # "TQxTV" -> pairs/s, known in this process
    missing = [sh for sh in shapes if f"{sh[0]}x{sh[1]}" not in rates]
    path = tiles_cache_path()
    cached: dict = {}
    if missing:  # the file, then the clock, for the shapes this process has not seen
        try:
            cached = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):
            cached = {}
        entry = cached.get(key) if isinstance(cached.get(key), dict) else {}
        rates = {**{k: float(v) for k, v in entry.get("pairs_per_s", {}).items()}, **rates}
        missing = [sh for sh in shapes if f"{sh[0]}x{sh[1]}" not in rates]
    if missing:
        with torch.no_grad():
            for sh in missing:
                sec = measure(*sh) if measure else _time_block(model, device, dtype, num_frames, *sh)
                rates[f"{sh[0]}x{sh[1]}"] = 1.0 / sec
        cached[key] = {"pairs_per_s": {k: round(v, 1) for k, v in rates.items()}}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(cached, indent=1))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache: measured again in the next process
    _memo[key] = rates
    best = max(shapes, key=lambda sh: rates[f"{sh[0]}x{sh[1]}"])
    return shapes[best]
