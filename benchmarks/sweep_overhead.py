"""What `dab sweep` costs over running the same runs by hand (docs/sweeps.md).

On one random store, the same runs (rows x seeds) three ways, side by side in one process,
repeated ``--repeats`` times in alternating order:

* by hand, in-process: ``run_train`` then ``run_evaluate`` for each run (the library calls a
  script would make);
* the sweep, in-process: ``run_sweep`` on the same plan (planning, the folder checks, the
  same runs, then the table: per-query hits, the bootstrap, sweep.md / json / png);
* by hand from the shell: ``dab train`` and ``dab evaluate`` per run, a process each, against
  one ``dab sweep`` process (what a user saves by not starting Python per run).

Prints seconds (mean ± std over repeats) and the sweep's ratio to each by-hand way.

    python benchmarks/sweep_overhead.py [--videos 200] [--rows 2] [--seeds 2] [--epochs 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate
from dab_pipeline.stages.sweep import SweepConfig, grid_plan, resolve_plan, run_sweep
from dab_pipeline.stages.train import run_train
from dab_pipeline.testing import random_store

SMALL = ("model.drift_hidden=64", "model.time_embed_dim=16", "model.steps=4", "batch_size=16", "lr=1e-3")
VARIANTS = ["xpool", "prob", "bridge", "dab"]


def by_hand(store: Path, out: Path, grid: list[str], seeds: tuple[int, ...], sets: tuple[str, ...]) -> float:
    t0 = time.perf_counter()
    for run in resolve_plan(grid_plan(grid, seeds=seeds), store, out, sets).runs:
        run_train(run.config)
        run_evaluate(EvaluateConfig(run=run.config.out, plots=False, examples=0))
    return time.perf_counter() - t0


def swept(store: Path, out: Path, grid: list[str], seeds: tuple[int, ...], sets: tuple[str, ...]) -> float:
    t0 = time.perf_counter()
    res = run_sweep(SweepConfig(features=store, out=out, plan=grid_plan(grid, seeds=seeds), overrides=sets))
    assert res.ok and not res.reused, res.failed
    return time.perf_counter() - t0


def shell_by_hand(store: Path, out: Path, grid: list[str], seeds: tuple[int, ...], sets: tuple[str, ...]) -> float:
    dab = [sys.executable, "-m", "dab_pipeline.cli"]
    t0 = time.perf_counter()
    for run in resolve_plan(grid_plan(grid, seeds=seeds), store, out, sets).runs:
        variant = run.config.model.variant
        subprocess.run(
            [
                *dab,
                "train",
                "--features",
                str(store),
                "--out",
                str(run.config.out),
                "--variant",
                variant,
                "--seed",
                str(run.seed),
                *[a for s in sets for a in ("--set", s)],
                "--quiet",
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [*dab, "evaluate", "--run", str(run.config.out), "--no-plots", "--examples", "0"],
            check=True,
            capture_output=True,
        )
    return time.perf_counter() - t0


def shell_sweep(store: Path, out: Path, grid: list[str], seeds: tuple[int, ...], sets: tuple[str, ...]) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "dab_pipeline.cli",
            "sweep",
            "--features",
            str(store),
            "--out",
            str(out),
            *[a for g in grid for a in ("--grid", g)],
            "--seeds",
            *map(str, seeds),
            *[a for s in sets for a in ("--set", s)],
            "--quiet",
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=200)
    ap.add_argument("--rows", type=int, default=2, help="variants (xpool, prob, bridge, dab: the first N)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dab-sweep-bench-"))
    try:
        n_val = n_test = max(1, args.videos // 6)
        splits = ("train",) * (args.videos - n_val - n_test) + ("val",) * n_val + ("test",) * n_test
        store = random_store(work / "s.h5", n_videos=args.videos, dim=32, frames=6, splits=splits)
        grid = [f"model.variant={','.join(VARIANTS[: args.rows])}"]
        seeds = tuple(range(1, args.seeds + 1))
        sets = (*SMALL, f"epochs={args.epochs}")
        ways = {
            "by hand (library)": by_hand,
            "sweep (library)": swept,
            "by hand (dab train + dab evaluate)": shell_by_hand,
            "dab sweep": shell_sweep,
        }
        times: dict[str, list[float]] = {k: [] for k in ways}
        for rep in range(args.repeats):
            order = list(ways) if rep % 2 == 0 else list(reversed(ways))
            for name in order:
                out = work / f"{name.split()[0]}-{len(times[name])}-{rep}"
                times[name].append(ways[name](store, out, grid, seeds, sets))
                shutil.rmtree(out)
        runs = args.rows * args.seeds
        print(
            f"{runs} runs ({args.rows} rows x {args.seeds} seeds, {args.epochs} epochs, {args.videos} videos), "
            f"{args.repeats} repeats"
        )
        for name, ts in times.items():
            sd = statistics.stdev(ts) if len(ts) > 1 else 0.0
            print(f"  {name:40s} {statistics.mean(ts):7.2f} ± {sd:5.2f} s")
        for sweep_way, hand_way in (
            ("sweep (library)", "by hand (library)"),
            ("dab sweep", "by hand (dab train + dab evaluate)"),
        ):
            ratios = [a / b for a, b in zip(times[sweep_way], times[hand_way])]
            sd = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
            extra = [(a - b) / runs for a, b in zip(times[sweep_way], times[hand_way])]
            print(
                f"  {sweep_way} / {hand_way}: {statistics.mean(ratios):.3f} ± {sd:.3f} "
                f"({statistics.mean(extra):+.2f} s per run)"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
