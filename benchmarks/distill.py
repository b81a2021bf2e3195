"""`dab distill` on the procedural world: the S-step student against its T' teacher and against training T'=1 from scratch.

For each seed: the teacher (dab, T'=32, the world recipe, 10 epochs), the scratch baselines (dab
with T'=1, T'=8, 10 epochs), the compute-matched control (T'=1 from scratch for the teacher's
epochs plus the distillation's: as many optimiser updates as teacher and student together, since
a distillation epoch counts updates like its teacher's, one caption per video on the world), and
the students of the teacher with S=1 and S=2 (``run_distill``, with the teacher's weight decay,
warm-up and cosine decay), all through the stage functions on the store
``benchmarks/quality.py`` builds. Prints test R@1 / MnR / AURC, the optimiser updates, the share
of queries whose top-1 video equals the teacher's, and the test split's scoring rate (pairs/s,
the fast engine, float32, best of 3), mean +- std over seeds.

    python benchmarks/distill.py [--world quick] [--seeds 1 2 3] [--epochs 5] [--data-dir bench_data]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import quality as Q  # noqa: E402  (the world, its stores and the training runs)

from dab_pipeline.runs.costfile import read_costs  # noqa: E402
from dab_pipeline.runs.load import load_run  # noqa: E402
from dab_pipeline.stages.distill import DistillConfig, run_distill  # noqa: E402
from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate  # noqa: E402
from dab_pipeline.store import open_store  # noqa: E402


def pairs_per_second(run_dir: Path, store: Path, repeats: int = 3) -> float:
    from dab_pipeline.scoring import score_all

    run = load_run(run_dir)
    with open_store(store) as st:
        test = st.load_split("test")
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        score_all(run.model, test.text, test.frames, test.frame_mask)
        best = min(best, time.perf_counter() - t)
    return len(test.caption_ids) * len(test.video_ids) / best


def train_updates(run_dir: Path) -> int:
    """Optimiser updates a run (or a student, without its teacher's) took: the "step" (updates) of its last logged
    epoch, or epochs x updates per epoch for a distillation (whose log has no "step")."""
    import json

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if "step" in records[-1]:
        return int(records[-1]["step"])
    cfg = json.loads((run_dir / "config.json").read_text())
    with open_store(cfg["features"]) as st:
        train = st.load_split(cfg["train_split"])
    per_epoch = (
        len(set(np.asarray(train.caption_video).tolist())) if cfg["epoch"] == "videos" else len(train.caption_ids)
    )
    return len(records) * (per_epoch // cfg["batch_size"])


def row(run_dir: Path, store: Path, teacher_top1: Optional[np.ndarray]) -> dict[str, float]:
    res = run_evaluate(EvaluateConfig(run=run_dir, plots=False, examples=0))
    top1 = read_costs(next(run_dir.glob("costs_test.*"))).cost.argmin(1)
    agree = float(np.mean(top1 == teacher_top1)) * 100 if teacher_top1 is not None else 100.0
    return {
        "R@1": res["t2v"]["R@1"],
        "MnR": res["t2v"]["MnR"],
        "AURC": res["selective"]["R@1"]["aurc"],
        "top-1 = teacher %": agree,
        "pairs/s": pairs_per_second(run_dir, store),
        "top1": top1,
    }


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", default="quick")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--epochs", type=int, default=5, help="distillation epochs")
    ap.add_argument("--data-dir", type=Path, default=Path("bench_data"))
    args = ap.parse_args(argv)
    stores = Q.build(*Q.world_of(args.world, []), args.data_dir, need_k2=False, workers=2)
    runs_dir = args.data_dir / f"runs-{args.world}"
    table: dict[str, list[dict]] = {}
    for seed in args.seeds:
        Q.one_run("dab", seed, stores, runs_dir, Q.QUICK_EPOCHS, [])
        teacher = runs_dir / f"dab-seed{seed}"
        t_row = row(teacher, stores["frozen"], None)
        table.setdefault("teacher T'=32", []).append(t_row)
        t_row["updates"] = train_updates(teacher)
        for name in ("dab-T8", "dab-T1"):
            Q.one_run(name, seed, stores, runs_dir, Q.QUICK_EPOCHS, [])
            run = runs_dir / f"{name}-seed{seed}"
            table.setdefault(f"scratch T'={name[5:]}", []).append(
                row(run, stores["frozen"], t_row["top1"]) | {"updates": train_updates(run)}
            )
        matched = runs_dir / "matched"  # T'=1 for the teacher's epochs + the distillation's
        Q.one_run("dab-T1", seed, stores, matched, Q.QUICK_EPOCHS + args.epochs, [])
        run = matched / f"dab-T1-seed{seed}"
        table.setdefault("scratch T'=1, updates of teacher + student", []).append(
            row(run, stores["frozen"], t_row["top1"]) | {"updates": train_updates(run)}
        )
        for s in (1, 2):
            out = args.data_dir / f"distill-{args.world}" / f"S{s}-seed{seed}"
            if not (out / "status.json").exists() or '"complete"' not in (out / "status.json").read_text():
                import shutil

                shutil.rmtree(out, ignore_errors=True)
                run_distill(DistillConfig(teacher=teacher, out=out, student_steps=s, epochs=args.epochs, seed=seed))
            table.setdefault(f"student S={s}", []).append(
                row(out, stores["frozen"], t_row["top1"]) | {"updates": t_row["updates"] + train_updates(out)}
            )
        print(f"seed {seed} done", flush=True)
    cols = ["R@1", "MnR", "AURC", "updates", "top-1 = teacher %", "pairs/s"]
    print("\n| model | " + " | ".join(cols) + " |\n| --- |" + " ---: |" * len(cols))
    for name, rows in table.items():
        cells = []
        for c in cols:
            vals = [r[c] for r in rows]
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            cells.append(
                f"{statistics.mean(vals):.3g} ± {sd:.2g}"
                if c in ("AURC",)
                else f"{statistics.mean(vals):,.1f} ± {sd:,.1f}"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    return {k: [{c: r[c] for c in cols} for r in v] for k, v in table.items()}


if __name__ == "__main__":
    main()
