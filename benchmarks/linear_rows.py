"""The bridge's product at each row count: GFLOP/s of a packed bf16 (P, 1024) x (1024, 1024) linear.

The scoring engine on CPU runs its bf16 products as oneDNN linears on weights packed once
(``torch.ops.mkldnn._linear_pointwise``, scoring/blocks.py), P = the pairs of a sub-block.
Their rate depends on P in steps that differ between CPUs and thread counts, which is why
scoring/tiles.py times sub-block shapes instead of assuming one; this script prints the
rate per P, for 1 thread and for the session's threads, each P measured in rounds
interleaved with the others (best of ``--rounds``, so a burst of load on a shared machine
hits every P alike).  The weights are packed for the P being timed, as the engine packs
them for its block.

    python benchmarks/linear_rows.py [--rows 256 512 ...] [--threads 1 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

DEFAULT_ROWS = (256, 512, 640, 768, 1024, 1152, 1200, 1258, 1296, 1369, 1536, 2048, 4096)


def packed_linear(rows: int) -> tuple:
    w = torch.ops.mkldnn._reorder_linear_weight(torch.randn(1024, 1024).bfloat16(), rows)
    return torch.randn(rows, 1024).bfloat16(), w, torch.randn(1024).bfloat16()


def seconds(fn: Callable[[], object], n: int = 8) -> float:
    """Mean seconds of ``n`` calls after one warm-up call (benchmarks/amx_gemm.py uses it too)."""
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def linear_call(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=list(DEFAULT_ROWS))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, torch.get_num_threads()])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        raise SystemExit("oneDNN bf16 linears are not available on this CPU / torch build")
    print(
        f"torch {torch.__version__}; GFLOP/s of a packed bf16 (P, 1024) x (1024, 1024) linear, "
        f"best of {args.rounds} interleaved rounds"
    )
    for threads in dict.fromkeys(args.threads):
        torch.set_num_threads(threads)
        cases = {p: packed_linear(p) for p in args.rows}
        best = {p: float("inf") for p in args.rows}
        for _ in range(args.rounds):
            for p, case in cases.items():
                best[p] = min(best[p], seconds(linear_call(*case)))
        print(
            f"{threads} thread{'s' if threads > 1 else ''}: "
            + "  ".join(f"{p}: {2 * p * 1024 * 1024 / best[p] / 1e9:,.0f}" for p in args.rows)
        )


if __name__ == "__main__":
    main()
