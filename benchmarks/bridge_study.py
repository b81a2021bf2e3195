"""The bridge's training study (docs/model.md, "Does any training make the bridge work?"), on validation only.

For each setting and seed: train on the world's training split with the world recipe plus
the setting's overrides, select the **last** epoch (no selection on the split that is
scored) and score the **validation** split (``test_split=val``: the test split is never
scored). Per run: val R@1 against the source video, the bridge's pair-dependent share and
its text / video / pair parts, the constant-bridge control's R@1 (docs/metrics.md), the
mean sigma^2 of text, bridged text and video, and the claim-aware val mAP / nDCG@10 / P@1
over every caption of every val video (benchmarks/claims.py). Then mean +- std over seeds
and, for claim-aware mAP, each setting's difference to ``dab``, ``dab-const`` and ``prob``
with a paired bootstrap 95 % interval over the val queries (seeds pooled).

    python benchmarks/bridge_study.py [--world uncertain] [--seeds 1 2 3] [--settings dab dab-const prob long ...]
        [--steps 8] [--data-dir bench_data] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import claims as C  # noqa: E402
import quality as Q  # noqa: E402

from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate  # noqa: E402
from dab_pipeline.stages.sweep import SweepConfig, SweepPlan, SweepRow, run_sweep  # noqa: E402

DAB = ["model.variant=dab"]
# setting -> overrides on top of the world recipe (and model.steps from --steps for the bridge settings)
SETTINGS: dict[str, list[str]] = {
    "dab": DAB,
    "dab-const": DAB + ["model.drift=constant"],
    "prob": ["model.variant=prob"],
    "long": DAB + ["epochs=50"],  # 5x the recipe's steps
    "dab-const-long": DAB + ["model.drift=constant", "epochs=50"],  # the same length for the references
    "prob-long": ["model.variant=prob", "epochs=50"],
    "residual-long": DAB + ["model.drift_inputs=residual", "epochs=50"],
    "bridge-lr-x10": DAB + ["bridge_lr=0.01"],  # the bridge at 10x the new modules' lr (1e-3)
    "bridge-lr-x0.1": DAB + ["bridge_lr=0.0001"],
    "init-1e-3": DAB + ["model.drift_init=0.001"],  # a small random drift output instead of zeros
    "init-1e-2": DAB + ["model.drift_init=0.01"],
    "chi-sum": DAB + ["model.chi_norm=sum"],  # steps summing to 1 instead of min-max onto [0.2, 0.6]
    "residual": DAB + ["model.drift_inputs=residual"],  # mu_v - mu_t as one more input of the drift
}
REFERENCES = ("dab", "dab-const", "prob", "dab-const-long", "prob-long")
COLUMNS = [
    "train loss",
    "val R@1",
    "const R@1",
    "same top-1",
    "claim mAP",
    "claim nDCG@10",
    "claim P@1",
    "pair-dep mu",
    "pair-dep logvar",
    "pair part mu",
    "var text",
    "var bridge",
    "var video",
    "seconds",
]  # seconds: training


def setting_values(name: str, steps: int) -> dict[str, Any]:
    """TrainConfig values of a setting: the world recipe, the setting, T' for the bridge settings, val scored."""
    sets = SETTINGS[name] + ([f"model.steps={steps}"] if "model.variant=dab" in SETTINGS[name] else [])
    return {**Q.RECIPE, **dict(s.split("=", 1) for s in sets), "test_split": "val", "select_metric": "last"}


def train_settings(
    names: list[str], seeds: list[int], stores: dict[str, Path], runs_dir: Path, steps: int, extra: list[str]
) -> None:
    """Every setting and seed through `dab sweep`'s driver (runs_dir is a cache: done runs are reused)."""
    plan = SweepPlan(
        name="bridge-study", rows=tuple(SweepRow(n, setting_values(n, steps)) for n in names), seeds=tuple(seeds)
    )
    res = run_sweep(
        SweepConfig(
            features=stores["frozen"],
            out=runs_dir,
            plan=plan,
            overrides=tuple(extra),
            layout="{row}-seed{seed}",
            cache=True,
        ),
        progress=lambda e: Q.log(e.message) if e.kind in ("info", "warning") else None,
    )
    if res.failed:
        raise SystemExit("runs failed: " + "; ".join(f"{k}: {v}" for k, v in res.failed.items()))


def run_setting(
    name: str, seed: int, runs_dir: Path, stores: dict[str, Path], truth: "C.Truth"
) -> tuple[dict[str, Optional[float]], dict[str, np.ndarray]]:
    """One finished run of a setting: its row values and claim queries."""
    out = runs_dir / f"{name}-seed{seed}"
    res = json.loads((out / "metrics.json").read_text())
    if res.get("bridge", {}).get("decomposition") and "same_top1" not in res["bridge"].get("constant_control", {}):
        res = run_evaluate(EvaluateConfig(run=out, plots=False, examples=0))  # evaluated before the agreement existed
    queries = C.run_queries(out, stores["eval"], "val", truth, out)
    bridge = res.get("bridge") or {}
    share, parts = bridge.get("pair_dependent_share", {}), bridge.get("decomposition", {}).get("mu", {})
    var = (res.get("variance") or {}).get("mean", {})
    pct = lambda v: None if v is None else 100 * v
    ctrl = bridge.get("constant_control") or {}
    log_lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    row = {
        "train loss": log_lines[-1]["train_loss"],
        "val R@1": res["t2v"]["R@1"],
        "const R@1": ctrl.get("R@1"),
        "same top-1": ctrl.get("same_top1"),
        "claim mAP": 100 * queries["AP"].mean(),
        "claim nDCG@10": 100 * queries["nDCG@10"].mean(),
        "claim P@1": 100 * queries["P@1"].mean(),
        "pair-dep mu": pct(share.get("mu")),
        "pair-dep logvar": pct(share.get("logvar")),
        "pair part mu": pct(parts.get("interaction")),
        "var text": var.get("text"),
        "var bridge": var.get("bridge"),
        "var video": var.get("video"),
        "seconds": sum(float(r.get("epoch_seconds") or 0.0) for r in log_lines),
    }
    return row, queries


def cell(values: list[Optional[float]], col: str) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    digits = 3 if col.startswith(("var", "train")) else (0 if col == "seconds" else 1)
    m = statistics.mean(vals)
    return f"{m:.{digits}f}" if len(vals) == 1 else f"{m:.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", default="uncertain")
    ap.add_argument("--world-set", dest="world_sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), help=f"of: {' '.join(SETTINGS)}")
    ap.add_argument("--steps", type=int, default=8, help="T' of the bridge settings (8: 4x cheaper than 32)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--data-dir", type=Path, default=Path("bench_data"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    bad = [s for s in args.settings if s not in SETTINGS]
    if bad:
        ap.error(f"unknown settings {bad}; valid: {', '.join(SETTINGS)}")
    label, wcfg = Q.world_of(args.world, args.world_sets)
    stores = Q.build(label, wcfg, args.data_dir, need_k2=False, workers=2, claims=True)
    truth = C.truth(stores["world"], stores["eval"], "val")
    runs_dir = args.data_dir / f"study-{label}-T{args.steps}"
    rows: dict[str, list[dict]] = {}
    per_query: dict[str, list[dict[str, np.ndarray]]] = {}
    t_start = time.time()
    train_settings(args.settings, args.seeds, stores, runs_dir, args.steps, args.overrides)
    for name in args.settings:
        for seed in args.seeds:
            row, queries = run_setting(name, seed, runs_dir, stores, truth)
            rows.setdefault(name, []).append(row)
            per_query.setdefault(name, []).append(queries)
            share = "-" if row["pair-dep mu"] is None else f"{row['pair-dep mu']:.1f} %"
            Q.log(
                f"{label} {name} seed {seed}: val R@1 {row['val R@1']:.1f}, claim mAP {row['claim mAP']:.1f}, "
                f"pair-dep mu {share} ({row['seconds']:.0f} s)"
            )
    lines = [
        f"{label} world, validation split ({len(truth.levels)} claim-aware queries), seeds {args.seeds}, "
        f"T'={args.steps} for the bridge settings, last epoch",
        "",
        "| setting | " + " | ".join(COLUMNS) + " |",
        "| --- |" + " ---: |" * len(COLUMNS),
    ]
    for name, rs in rows.items():
        lines.append(f"| {name} | " + " | ".join(cell([r[c] for r in rs], c) for c in COLUMNS) + " |")
    boots = {ref: C.bootstrap_rows(per_query, ref, metrics=("AP",)) for ref in REFERENCES if ref in per_query}
    lines += [
        "",
        "Claim-aware val mAP, difference to each reference (paired bootstrap 95 % interval over queries, "
        "seeds pooled; * = excludes 0):",
        "",
        "| setting | " + " | ".join(f"- {r}" for r in boots) + " |",
        "| --- |" + " ---: |" * len(boots),
    ]
    for name in rows:
        cells = []
        for ref, boot in boots.items():
            b = boot.get(name, {}).get("AP")
            cells.append(
                "-"
                if b is None
                else f"{b['diff']:+.1f} [{b['low']:+.1f}, {b['high']:+.1f}]{' *' if b['excludes_zero'] else ''}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    print(f"\nwall time {(time.time() - t_start) / 60:.1f} min")
    result = {
        "world": label,
        "seeds": args.seeds,
        "steps": args.steps,
        "rows": rows,
        "bootstrap": boots,
        "recipe": Q.RECIPE,
        "settings": {n: SETTINGS[n] for n in args.settings},
        "machine": Q.machine(),
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"study-{label}.md").write_text(text + "\n")
        (args.out / f"study-{label}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
