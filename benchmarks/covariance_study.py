"""Beyond the diagonal: does a low-rank or mixture covariance help? (issue 36, docs/model.md), on validation only.

For each world, setting and seed: train with the world recipe plus the setting's overrides through
`dab sweep` (so sweeps of these runs are exercised), select the **last** epoch and score the
**validation** split (``test_split=val``; the test split is never scored).  Per run: val R@1, the
claim-aware val mAP overall and per caption level (the generic level is where a richer covariance
should show), nDCG@10, the variance calibration (Spearman of the text's sigma^2, and of log det Sigma_t
where the claims benchmark gives it, with log #relevant), the claim-aware AURC, the parameters and the
training seconds.  Then mean +- std over seeds and each setting's claim-aware mAP difference to
``prob`` (diag) and ``dab`` (diag) with a paired bootstrap 95 % interval over the val queries (seeds
pooled).

The rule for a new default was written in docs/model.md ("The rule, written before the runs") before
any of these runs; :func:`verdict` applies it to the results and prints what it says.

    python benchmarks/covariance_study.py [--worlds benchmark uncertain benchmark:ambiguity=0]
        [--seeds 1 2 3] [--settings prob prob-lowrank2 ...] [--data-dir bench_data] [--out DIR]
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

from dab_pipeline.runs.load import load_run  # noqa: E402
from dab_pipeline.stages.sweep import SweepConfig, SweepPlan, SweepRow, run_sweep  # noqa: E402

COVARIANCES = {"": "diag", "-lowrank2": "lowrank:2", "-lowrank8": "lowrank:8", "-mixture2": "mixture:2"}
COVARIANCES["-mixture4"] = "mixture:4"
# setting -> overrides on top of the world recipe; prob-fixvar is the floor (no learned uncertainty at all)
SETTINGS: dict[str, list[str]] = {"prob-fixvar": ["model.variant=prob", "model.variance=fixed"]}
for _variant in ("prob", "dab"):
    for _suffix, _cov in COVARIANCES.items():
        SETTINGS[_variant + _suffix] = [f"model.variant={_variant}", f"model.covariance={_cov}"]
REFERENCES = ("prob", "dab")
WORLDS = ("benchmark", "uncertain", "benchmark:ambiguity=0")  # the last: the control, nothing to model
COLUMNS = [
    "val R@1",
    "claim mAP",
    "mAP video",
    "mAP shot",
    "mAP object",
    "mAP generic",
    "nDCG@10",
    "var calibration",
    "logdet calibration",
    "AURC",
    "U span",
    "params",
    "seconds",
]


def setting_values(name: str, steps: int) -> dict[str, Any]:
    """TrainConfig values of a setting: the world recipe, the setting, T' for dab, val scored, last epoch."""
    sets = SETTINGS[name] + ([f"model.steps={steps}"] if "model.variant=dab" in SETTINGS[name] else [])
    return {**Q.RECIPE, **dict(s.split("=", 1) for s in sets), "test_split": "val", "select_metric": "last"}


def train_settings(names: list[str], seeds: list[int], store: Path, runs_dir: Path, steps: int) -> None:
    """Every setting and seed through `dab sweep`'s driver (runs_dir is a cache: finished runs are reused)."""
    plan = SweepPlan(
        name="covariance-study", rows=tuple(SweepRow(n, setting_values(n, steps)) for n in names), seeds=tuple(seeds)
    )
    res = run_sweep(
        SweepConfig(features=store, out=runs_dir, plan=plan, layout="{row}-seed{seed}", cache=True),
        progress=lambda e: Q.log(e.message) if e.kind in ("info", "warning") else None,
    )
    if res.failed:
        raise SystemExit("runs failed: " + "; ".join(f"{k}: {v}" for k, v in res.failed.items()))


def run_row(out: Path, eval_store: Path, truth: "C.Truth") -> tuple[dict[str, Optional[float]], dict[str, Any]]:
    """One finished run: its row values and its per-query claim-aware results."""
    res = json.loads((out / "metrics.json").read_text())
    queries = C.run_queries(out, eval_store, "val", truth, out)
    log_lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    model = load_run(out, checkpoint="last.pt").model
    row: dict[str, Optional[float]] = {
        "val R@1": res["t2v"]["R@1"],
        "claim mAP": 100 * queries["AP"].mean(),
        "nDCG@10": 100 * queries["nDCG@10"].mean(),
        "AURC": C.M.aurc(queries["margin"], queries["P@1"]),
        "params": float(sum(p.numel() for p in model.parameters())),
        "seconds": sum(float(r.get("epoch_seconds") or 0.0) for r in log_lines),
    }
    for level in ("video", "shot", "object", "generic"):
        sel = truth.levels == level
        row[f"mAP {level}"] = 100 * queries["AP"][sel].mean() if sel.any() else None
    if "u_span" in queries:  # lowrank runs: the generic captions' spread in span(U), with its chance level R/D
        row["U span"] = float(np.mean(queries["u_span"]))
        row["U span chance"] = float(np.mean(queries["u_span_chance"]))
    for col, key in (("var calibration", "text_var"), ("logdet calibration", "text_logdet")):
        row[col] = C.M.spearman(queries[key], np.log(truth.n_relevant)) if key in queries else None
    return row, queries


def cell(values: list[Optional[float]], col: str) -> str:
    # nan (a constant variance's rank correlation, prob-fixvar) is no value; statistics.stdev fails on it
    vals = [float(v) for v in values if v is not None and np.isfinite(v)]
    if not vals:
        return "-"
    if col == "params":
        return f"{vals[0] / 1e3:.0f}k"
    if col == "U span":  # the chance level follows in the row's own "U span chance"
        return f"{statistics.mean(vals):.3f}"
    digits = 3 if col in ("AURC", "var calibration", "logdet calibration") else (0 if col == "seconds" else 1)
    m = statistics.mean(vals)
    return f"{m:.{digits}f}" if len(vals) == 1 else f"{m:.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def interval(b: Optional[dict[str, Any]]) -> str:
    if b is None:
        return "-"
    return f"{b['diff']:+.1f} [{b['low']:+.1f}, {b['high']:+.1f}]{' *' if b['excludes_zero'] else ''}"


def world_table(label: str, rows: dict[str, list[dict]], boots: dict[str, dict], seeds: list[int], n: int) -> str:
    """The markdown of one world: the rows, then each row's claim-aware mAP difference to each reference."""
    lines = [
        f"{label} world, validation split ({n} claim-aware queries), seeds {seeds}, last epoch",
        "",
        "| setting | " + " | ".join(COLUMNS) + " | " + " | ".join(f"- {r} (mAP)" for r in boots) + " |",
        "| --- |" + " ---: |" * (len(COLUMNS) + len(boots)),
    ]
    for name, rs in rows.items():
        diffs = [interval(boot.get(name, {}).get("AP")) for boot in boots.values()]
        cells = [cell([r.get(c) for r in rs], c) for c in COLUMNS]
        if rs[0].get("U span chance") is not None:
            cells[COLUMNS.index("U span")] += f" (chance {rs[0]['U span chance']:.3f})"
        lines.append(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
    return "\n".join(lines)


def generic_bootstrap(per_query: dict[str, list[dict]], truth: "C.Truth") -> dict[str, dict]:
    """The same paired bootstrap on the generic captions alone (where a richer covariance should show)."""
    sel = truth.levels == "generic"
    if not sel.any():  # the ambiguity-0 control draws none
        return {}
    only = {k: [{"AP": r["AP"][sel]} for r in runs] for k, runs in per_query.items()}
    return {ref: C.bootstrap_rows(only, ref, metrics=("AP",)) for ref in REFERENCES if ref in only}


def study_world(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train, score and tabulate every setting on one world (``preset`` or ``preset:KEY=VALUE,...``)."""
    preset, _, sets = spec.partition(":")
    label, wcfg = Q.world_of(preset, [s for s in sets.split(",") if s])
    stores = Q.build(label, wcfg, args.data_dir, need_k2=False, workers=2, claims=True)
    truth = C.truth(stores["world"], stores["eval"], "val")
    runs_dir = args.data_dir / f"covariance-{label}-T{args.steps}"
    train_settings(args.settings, args.seeds, stores["frozen"], runs_dir, args.steps)
    rows: dict[str, list[dict]] = {}
    per_query: dict[str, list[dict]] = {}
    for name in args.settings:
        for seed in args.seeds:
            row, queries = run_row(runs_dir / f"{name}-seed{seed}", stores["eval"], truth)
            rows.setdefault(name, []).append(row)
            per_query.setdefault(name, []).append(queries)
            Q.log(f"{label} {name} seed {seed}: claim mAP {row['claim mAP']:.1f} ({row['seconds']:.0f} s)")
    boots = {ref: C.bootstrap_rows(per_query, ref, metrics=("AP",)) for ref in REFERENCES if ref in per_query}
    text = world_table(label, rows, boots, args.seeds, len(truth.levels))
    generic = generic_bootstrap(per_query, truth)
    if not generic:
        return {"label": label, "rows": rows, "bootstrap": boots, "generic_bootstrap": {}, "markdown": text}
    text += "\n\nGeneric captions only, mAP difference to each reference (paired bootstrap 95 %):\n\n"
    text += "| setting | " + " | ".join(f"- {r}" for r in generic) + " |\n| --- |" + " ---: |" * len(generic) + "\n"
    text += "\n".join(
        f"| {name} | " + " | ".join(interval(g.get(name, {}).get("AP")) for g in generic.values()) + " |"
        for name in rows
    )
    return {"label": label, "rows": rows, "bootstrap": boots, "generic_bootstrap": generic, "markdown": text}


def _wins(world: dict[str, Any], name: str, ref: str) -> Optional[dict[str, Any]]:
    return world["bootstrap"].get(ref, {}).get(name, {}).get("AP")


def verdict(worlds: list[dict[str, Any]]) -> list[str]:
    """The rule of docs/model.md applied to these results (the replication on new seeds is a separate run)."""
    real = [w for w in worlds if "ambiguity0" not in w["label"]]
    control = next((w for w in worlds if "ambiguity0" in w["label"]), None)
    out = []
    for name in SETTINGS:
        ref = "dab" if name.startswith("dab") else "prob"
        if name in REFERENCES or name == "prob-fixvar" or not all(name in w["rows"] for w in real):
            continue
        diffs = [_wins(w, name, ref) for w in real]
        if len(real) < 2 or any(d is None or d["low"] <= 0 for d in diffs):
            out.append(f"{name}: no (not above {ref} outside the interval on both worlds)")
            continue
        c = None if control is None else _wins(control, name, ref)
        if c is None or c["diff"] >= min(d["diff"] for d in diffs):
            out.append(f"{name}: no (as large a gain at ambiguity 0, or no control run: not the ambiguity)")
            continue
        out.append(f"{name}: candidate; replicate on seeds 4 5 6 before any default changes")
    diffs = [_wins(w, "prob", "dab") for w in real]  # prob - dab, both diag
    if len(real) >= 2 and all(d is not None and d["low"] > 0 for d in diffs):
        out.append("default variant: prob beats dab on both worlds outside the interval; replicate, then change")
    elif len(real) >= 2 and all(d is not None for d in diffs):
        out.append("default variant: dab stays (prob is not above it outside the interval on both worlds)")
    return out or ["nothing to decide: too few settings or worlds"]


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", nargs="+", default=list(WORLDS), help="preset[:KEY=VALUE,...]")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), help=f"of: {' '.join(SETTINGS)}")
    ap.add_argument("--steps", type=int, default=8, help="T' of the dab settings (8, as in the bridge study)")
    ap.add_argument("--data-dir", type=Path, default=Path("bench_data"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    bad = [s for s in args.settings if s not in SETTINGS]
    if bad:
        ap.error(f"unknown settings {bad}; valid: {', '.join(SETTINGS)}")
    t_start = time.time()
    worlds = [study_world(spec, args) for spec in args.worlds]
    rule = verdict(worlds)
    text = "\n\n".join(w["markdown"] for w in worlds) + "\n\nThe rule (docs/model.md):\n\n" + "\n".join(rule)
    print(text)
    print(f"\nwall time {(time.time() - t_start) / 60:.1f} min")
    result = {
        "worlds": [{k: v for k, v in w.items() if k != "markdown"} for w in worlds],
        "verdict": rule,
        "seeds": args.seeds,
        "steps": args.steps,
        "recipe": Q.RECIPE,
        "settings": {n: SETTINGS[n] for n in args.settings},
        "machine": Q.machine(),
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "covariance-study.md").write_text(text + "\n")
        (args.out / "covariance-study.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
