"""bf16 autocast training against float32, side by side on the procedural world.

Trains each variant twice per seed through the stage functions, with ``amp=none`` (float32)
and ``amp=bf16`` (bf16 autocast: the products in bf16, the costs and the loss in float32), on
the same world store that ``benchmarks/quality.py`` builds, and prints test R@1 / MnR and the
training time, mean +- std over seeds. Then, for each variant's first seed, it scores the
float32-trained model's test split twice, with and without autocast, and prints the cost
difference, in cost units and in logits of the loss (cost / tau for prob and dab).

bf16 autocast needs native bf16 to pay (dab_pipeline.runtime.capabilities); on a CPU without it the
bf16 rows run in float32 (amp falls back, with a warning) and the comparison says nothing.

    python benchmarks/amp.py [--world quick] [--seeds 1 2 3] [--variants dab-T8 xpool] [--data-dir bench_data]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import quality as Q  # noqa: E402  (the world, its stores and the runs, shared with the quality benchmark)

from dab_pipeline.runs.load import load_run  # noqa: E402
from dab_pipeline.runtime.capabilities import capabilities  # noqa: E402
from dab_pipeline.store import open_store  # noqa: E402


def cost_error(run_dir: Path, store: Path) -> dict[str, float]:
    """The test split's cost matrix of one model, float32 against bf16 autocast."""
    run = load_run(run_dir, "cpu")
    with open_store(store) as st:
        feats = st.load_split("test")
    text = torch.as_tensor(np.asarray(feats.text, np.float32))
    frames = torch.as_tensor(np.asarray(feats.frames, np.float32))
    mask = torch.as_tensor(np.asarray(feats.frame_mask))
    model = run.model.eval()
    with torch.no_grad():
        ref = model(text, frames, mask).cost  # (Q, V) float32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(text, frames, mask).cost
    diff = (low.float() - ref).abs()
    with torch.no_grad():
        scale = float(model.tau()) if model.cfg.gaussian else 1.0 / float(model.log_logit_scale.exp())
    same = float((low.argmin(1) == ref.argmin(1)).float().mean())
    return {
        "max_abs": float(diff.max()),
        "max_rel": float((diff / ref.abs().clamp_min(1e-6)).max()),
        "max_logits": float(diff.max()) / scale,
        "mean_abs_cost": float(ref.abs().mean()),
        "same_top1": same,
    }


def mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", default="quick", help="world preset (default quick)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--variants", nargs="+", default=["xpool", "dab-T8"], choices=sorted(Q.VARIANTS))
    ap.add_argument("--epochs", type=int, default=Q.QUICK_EPOCHS)
    ap.add_argument("--data-dir", type=Path, default=Path("bench_data"))
    args = ap.parse_args(argv)
    caps = capabilities("cpu")
    print(f"capabilities: {caps.summary()}")
    stores = Q.build(
        *Q.world_of(args.world, []),
        args.data_dir,
        need_k2=any(Q.VARIANTS[v][0] == "k2" for v in args.variants),
        workers=2,
    )
    runs_dir = args.data_dir / f"runs-{args.world}-amp"
    out: dict[str, Any] = {"capabilities": caps.as_dict(), "rows": {}, "cost_error": {}}
    print("\n| variant | amp | t2v R@1 | t2v MnR | seconds |\n| --- | --- | ---: | ---: | ---: |")
    for variant in args.variants:
        for amp in ("none", "bf16"):
            rows = [
                Q.row_values(Q.one_run(variant, s, stores, runs_dir / amp, args.epochs, [f"amp={amp}"]))
                for s in args.seeds
            ]
            r1, mnr, sec = ([r[k] for r in rows] for k in ("t2v R@1", "t2v MnR", "seconds"))
            out["rows"][f"{variant}/{amp}"] = {"R@1": r1, "MnR": mnr, "seconds": sec}
            print(f"| {variant} | {amp} | {mean_std(r1)} | {mean_std(mnr)} | {mean_std(sec)} |", flush=True)
        out["cost_error"][variant] = cost_error(runs_dir / "none" / f"{variant}-seed{args.seeds[0]}", stores["frozen"])
    print("\nthe float32-trained model's test costs under bf16 autocast (costs and loss in float32):")
    for variant, e in out["cost_error"].items():
        print(
            f"  {variant}: max |diff| {e['max_abs']:.3g} ({e['max_logits']:.3g} logits; mean |cost| "
            f"{e['mean_abs_cost']:.3g}), max relative {e['max_rel']:.2e}, same top-1 {100 * e['same_top1']:.1f}%"
        )
    return out


if __name__ == "__main__":
    main()
