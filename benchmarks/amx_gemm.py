"""The bridge's three layers on AMX tiles with fused epilogues against oneDNN's products plus the passes.

For one sub-block of P pairs (a (P, 1024) x (1024, 1024) product, D = 512, drift 1024), side by side in
interleaved rounds (best of ``--rounds``):

* the first layer: ``silu(s W^T + time + target)``: oneDNN's linear with the target as a binary post-op
  and the SiLU pass, against ``amx_linear_silu`` with the target in its epilogue;
* a hidden layer: oneDNN's linear and the SiLU pass, against ``amx_linear_silu``;
* the output layer and the state update: oneDNN's linear and ``bridge_update_``, against
  ``amx_linear_update_``;
* the products alone (oneDNN's linear without a pass), for the rate each layer's product runs at.

The inputs of each path are in its own layout (row-major for oneDNN, tile-blocked for AMX), made
before timing.  Needs AMX-BF16 and the compiled kernels (scoring/kernels/cpu.py); says so and exits
elsewhere.

    python benchmarks/amx_gemm.py [--rows 1344 1369 2048] [--rounds 5]
"""

from __future__ import annotations

import argparse

import torch
from linear_rows import seconds  # benchmarks/ is on sys.path when this script runs

from dab_pipeline.scoring.kernels.cpu import amx_ops, get_kernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1344, 1369, 2048])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ops, kern = amx_ops(), get_kernels()
    if ops is None:
        raise SystemExit(
            f"no AMX bridge here (AMX-BF16, the compiled kernels ({kern.reason}), DAB_AMX): nothing to compare"
        )
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(1024, 1024, generator=gen) / 32).bfloat16()
    bias = torch.randn(1024, generator=gen) / 10
    packed_amx, bias16 = ops.amx_pack_weight(w), bias.bfloat16()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; microseconds a layer, best of "
        f"{args.rounds} interleaved rounds"
    )
    for p in args.rows:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, p)
        x = torch.randn(p, 1024, generator=gen).bfloat16()
        target = torch.randn(p, 1024, generator=gen).bfloat16()
        xb = ops.amx_block_rows(x)
        pp = xb.shape[0] * 16
        st, st_rows = torch.randn(pp, 1024, generator=gen), torch.randn(p, 1024, generator=gen)
        s_blk, s_rows = torch.empty_like(xb), torch.empty(p, 1024, dtype=torch.bfloat16)

        def linear() -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x, packed, bias16, "none", [], "")

        cases = {
            "product alone (oneDNN)": linear,
            "first layer, oneDNN + pass": lambda: kern.silu_bf16_(
                torch.ops.mkldnn._linear_pointwise.binary(x, target, packed, bias16, "add")
            ),
            "first layer, AMX": lambda: ops.amx_linear_silu(xb, packed_amx, bias, target),
            "hidden layer, oneDNN + pass": lambda: kern.silu_bf16_(linear()),
            "hidden layer, AMX": lambda: ops.amx_linear_silu(xb, packed_amx, bias),
            "output + update, oneDNN + pass": lambda: kern.bridge_update_(
                st_rows, linear(), s_rows, 1e-3, -5.0, 5.0, 512, True
            ),
            "output + update, AMX": lambda: ops.amx_linear_update_(
                xb, packed_amx, bias, st, s_blk, 1e-3, -5.0, 5.0, 512, True
            ),
        }
        best = {name: float("inf") for name in cases}
        for _ in range(args.rounds):
            for name, fn in cases.items():
                best[name] = min(best[name], seconds(fn))
        flops = 2 * p * 1024 * 1024
        print(
            f"P = {p}: oneDNN's product alone {1e6 * best['product alone (oneDNN)']:,.0f} us "
            f"({flops / best['product alone (oneDNN)'] / 1e9:,.0f} GFLOP/s)"
        )
        for layer in ("first layer", "hidden layer", "output + update"):
            a, b = best[f"{layer}, oneDNN + pass"], best[f"{layer}, AMX"]
            print(f"  {layer:<16} oneDNN + pass {1e6 * a:7,.0f}   AMX fused {1e6 * b:7,.0f}   ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
