"""The matrix-product rate this device reaches, the denominator of every share the device check reports.

A plain ``n x n x n`` product in each dtype (bf16, TF32 where the device has it, float32): the mean
TFLOP/s of ``--repeats`` timed products after three warm-ups, on random data. An H200's dense bf16
peak is about 990 TFLOP/s by its specification; what a plain product reaches here is the honest
ceiling for dab's own kernels (docs/performance.md).

    python benchmarks/device_peak.py [--device cuda] [--n 8192] [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Optional

import torch


def rate(n: int, dtype: torch.dtype, device: torch.device, repeats: int, tf32: bool = False) -> float:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(3):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2.0 * n**3 * repeats / (time.perf_counter() - t) / 1e12


def main(argv: Optional[list[str]] = None) -> dict:
    from dab_pipeline.runtime.capabilities import capabilities
    from dab_pipeline.runtime.devices import resolve_device

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    caps = capabilities(device)
    out = {"device": caps.summary(), "n": args.n}
    rows = [("float32", torch.float32, False)]
    if caps.tf32:
        rows.append(("tfloat32", torch.float32, True))
    if caps.bf16:
        rows.append(("bfloat16", torch.bfloat16, False))
    for name, dtype, tf32 in rows:
        out[name] = rate(args.n, dtype, device, args.repeats, tf32)
        print(f"{args.n}^3 {name} product: {out[name]:.2f} TFLOP/s", flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
