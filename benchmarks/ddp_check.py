"""DistributedDataParallel on one device: a 1-process torchrun of `dab train` against the plain run.

Makes a small random store, then trains the same configuration twice through the CLI: once as a
plain process, once as the single rank of ``torchrun --nproc-per-node 1`` (the whole distributed
code path: process group (NCCL on CUDA, gloo on CPU), DDP-wrapped step, gathered batches, rank-0
writes), and compares the two test cost matrices. With one rank DDP averages nothing, so the runs
must agree to float rounding (the reduction order of DDP's bucketed gradients may differ).

    python benchmarks/ddp_check.py [--device cuda] [--epochs 2] [--out DIR]

Exit status 0 when the costs agree (max relative difference under 1e-3 and the same top-1 for
every query), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def main(argv: Optional[list[str]] = None) -> int:
    from dab_pipeline.runs.costfile import read_costs
    from dab_pipeline.testing import random_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        store = random_store(
            root / "store.h5",
            n_videos=60,
            caps_per_video=2,
            dim=32,
            splits=("train",) * 40 + ("val",) * 10 + ("test",) * 10,
        )
        common = [
            "train",
            "--features",
            str(store),
            "--variant",
            "dab",
            "--steps",
            "4",
            "--epochs",
            str(args.epochs),
            "--batch-size",
            "8",
            "--device",
            args.device,
            "--quiet",
            "--set",
            "model.drift_hidden=32",
            "--set",
            "model.time_embed_dim=8",
            "--set",
            "amp=none",
        ]
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        plain = subprocess.run(
            [sys.executable, "-m", "dab_pipeline.cli", *common, "--out", str(root / "plain")],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        ddp = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "1",
                "-m",
                "dab_pipeline.cli",
                *common,
                "--out",
                str(root / "ddp"),
                "--distributed",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        for name, res in (("plain", plain), ("torchrun", ddp)):
            if res.returncode != 0:
                print(f"{name} run failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
                return 1
        a = read_costs(root / "plain" / "costs_test.h5").cost
        b = read_costs(root / "ddp" / "costs_test.h5").cost
        rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-6)))
        same = float(np.mean(a.argmin(1) == b.argmin(1)))
        backend = json.loads((root / "ddp" / "precision.json").read_text())["device"]
        ok = rel < 1e-3 and same == 1.0
        print(
            f"1-process torchrun vs plain dab train on {backend.get('device')}: max relative cost difference "
            f"{rel:.2e}, same top-1 for {100 * same:.1f} % of {a.shape[0]} queries -> {'OK' if ok else 'DIFFER'}"
        )
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
