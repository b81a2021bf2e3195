"""Conformal sets: which score, and does the Gaussian uncertainty make sets smaller? (issue 47, docs/quality.md)

The rule was written in docs/quality.md ("Conformal sets: which score ...") before any of these runs;
:func:`verdict` applies it to the results and prints what it says.

For each world, variant and seed: train with the world recipe (``benchmarks/quality.py``'s worlds and
variants, through `dab sweep`; finished runs are reused), take best.pt (validation R@1) and score every caption
of the world's test videos (the claims benchmark's eval store: one gallery, several queries a video). Then, as
``benchmarks/coverage.py`` does, split the queries ``--splits`` times at random into a calibration half and an
evaluation half and build each score's 1 - alpha sets. Per run and score: the marginal coverage and whether it
holds (within two standard errors of [1 - alpha, 1 - alpha + 1/(n+1)]), each query's mean set size over the splits
that evaluated it, and the coverage per uncertainty tercile (the run's text variance, or minus the margin for a
cost-only run) and per caption level. Per (world, variant, score): the mean set size and the conditional
coverage, the lowest of the seven group coverages (each averaged over seeds).

    python benchmarks/coverage_study.py [--worlds benchmark uncertain benchmark:ambiguity=0] [--seeds 1 2 3]
        [--variants xpool prob dab dab-const] [--alpha 0.1] [--splits 200] [--data-dir bench_data] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import claims as C  # noqa: E402
import coverage as CV  # noqa: E402
import quality as Q  # noqa: E402

from dab_pipeline.calibration import query_features  # noqa: E402
from dab_pipeline.metrics import paired_bootstrap  # noqa: E402
from dab_pipeline.metrics.conformal import CONFORMAL_SCORES, conformal_quantile, conformal_scores, cost_softmax  # noqa: E402

WORLDS = ("benchmark", "uncertain", "benchmark:ambiguity=0")
VARIANTS = ("xpool", "prob", "dab", "dab-const")
COST_ONLY = ("lac", "aps", "raps")  # the scores that read nothing but the costs
MIN_CONDITIONAL = 0.85  # the rule's bar for the lowest group coverage


def world_spec(spec: str) -> tuple[str, list[str]]:
    """``preset[:KEY=VALUE,...]`` -> (preset, overrides)."""
    preset, _, rest = spec.partition(":")
    return preset, [s for s in rest.split(",") if s]


def run_sets(cost, gt, tv, temperature, levels, alpha: float, splits: int) -> dict[str, dict[str, Any]]:
    """Per score: marginal coverage over random halves, per-query mean set size and hit rate, group coverages."""
    q = len(cost)
    p = cost_softmax(cost, temperature)  # (Q, V)
    uncertainty = tv if tv is not None else -query_features(cost, temperature).column("margin")  # larger: harder
    tercile = np.digitize(uncertainty, np.quantile(uncertainty, [1 / 3, 2 / 3]))  # (Q,) 0, 1, 2
    halves = [np.random.default_rng(seed).permutation(q) for seed in range(splits)]
    out: dict[str, dict[str, Any]] = {}
    for score in CONFORMAL_SCORES:
        if score == "normalized" and tv is None:
            continue
        s = conformal_scores(p, score, difficulty=tv)  # (Q, V)
        own = s[np.arange(q), gt]  # (Q,)
        size, hits, seen, cov = np.zeros(q), np.zeros(q), np.zeros(q), []
        for perm in halves:
            a, b = perm[: q // 2], perm[q // 2 :]
            inside = s[b] <= conformal_quantile(own[a], alpha)  # (|b|, V)
            hit = inside[np.arange(len(b)), gt[b]]  # (|b|,)
            size[b] += inside.sum(1)
            hits[b] += hit
            seen[b] += 1
            cov.append(hit.mean())
        n = q // 2
        m, se = float(np.mean(cov)), float(np.std(cov) / np.sqrt(len(cov)))
        groups = {f"tercile {t}": tercile == t for t in range(3)}
        groups |= {f"level {lv}": levels == lv for lv in np.unique(levels)}
        out[score] = {
            "coverage": m,
            "se": se,
            "holds": bool(1 - alpha - 2 * se <= m <= 1 - alpha + 1 / (n + 1) + 2 * se),
            "size_per_query": (size / np.maximum(seen, 1)).tolist(),
            "groups": {k: float(hits[g].sum() / max(seen[g].sum(), 1)) for k, g in groups.items()},
        }
    return out


def measure_run(run_dir: Path, eval_store: Path, truth: C.Truth, alpha: float, splits: int) -> dict[str, Any]:
    """One run's sets (cached in the run folder: the measure is a pure function of the run and these args)."""
    cache = run_dir / f"coverage_study-{alpha:g}-{splits}.json"
    if cache.is_file() and cache.stat().st_mtime >= (run_dir / "metrics.json").stat().st_mtime:
        return json.loads(cache.read_text())
    run, cost, gt, tv, temperature = CV._inputs(run_dir, eval_store)
    got = {
        "queries": len(cost),
        "temperature": temperature,
        "scores": run_sets(cost, gt, tv, temperature, truth.levels, alpha, splits),
    }
    cache.write_text(json.dumps(got))
    return got


def summarise(per_seed: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per score, over seeds: mean set size (and its std over seeds), conditional coverage, marginal holds."""
    out = {}
    for score in per_seed[0]["scores"]:
        runs = [r["scores"][score] for r in per_seed]
        sizes = [float(np.mean(r["size_per_query"])) for r in runs]
        groups = {k: float(np.mean([r["groups"][k] for r in runs])) for k in runs[0]["groups"]}
        out[score] = {
            "size": float(np.mean(sizes)),
            "size_std": float(np.std(sizes)),
            "coverage": float(np.mean([r["coverage"] for r in runs])),
            "holds": all(r["holds"] for r in runs),
            "groups": groups,
            "conditional": min(groups.values()),
            "sizes": np.array([r["size_per_query"] for r in runs]),  # (S, Q)
        }
    return out


def best_cost_only(summary: dict[str, dict[str, Any]]) -> str:
    return min(COST_ONLY, key=lambda s: summary[s]["size"])


def comparisons(table: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rule's paired comparisons on one world: set size differences, seeds pooled."""
    pairs = []
    if "xpool" in table and "prob" in table:
        ref = best_cost_only(table["xpool"])
        for score in ("normalized", best_cost_only(table["prob"])):
            pairs.append(("prob", score, "xpool", ref))
    if "dab" in table and "dab-const" in table:
        pairs.append(("dab", "normalized", "dab-const", "normalized"))
        pairs.append(("dab", best_cost_only(table["dab"]), "dab-const", best_cost_only(table["dab-const"])))
    out = []
    for a, sa, b, sb in pairs:
        x, y = table[a][sa], table[b][sb]
        boot = paired_bootstrap(x["sizes"], y["sizes"])
        out.append(
            {
                "a": f"{a} {sa}",
                "b": f"{b} {sb}",
                "diff": boot["diff"],
                "low": boot["low"],
                "high": boot["high"],
                "conditional": [x["conditional"], y["conditional"]],
                "smaller": bool(boot["high"] < 0 and x["conditional"] >= y["conditional"]),
            }
        )
    return out


def study_world(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    preset, sets = world_spec(spec)
    label, cfg = Q.world_of(preset, sets)
    stores = Q.build(label, cfg, args.data_dir, need_k2=False, workers=args.workers, claims=True)
    runs_dir = args.data_dir / f"runs-{label}"
    t0 = time.time()
    Q.sweep_runs(list(args.variants), list(args.seeds), stores, runs_dir, args.epochs, [])
    truth = C.truth(stores["world"], stores["eval"], "test")
    Q.log(f"{label}: runs ready ({time.time() - t0:.0f} s); {len(truth.levels)} test queries")
    table = {}
    for variant in args.variants:
        per_seed = []
        for seed in args.seeds:
            t0 = time.time()
            per_seed.append(
                measure_run(runs_dir / f"{variant}-seed{seed}", stores["eval"], truth, args.alpha, args.splits)
            )
            Q.log(f"{label} {variant} seed {seed}: sets measured ({time.time() - t0:.0f} s)")
        table[variant] = summarise(per_seed)
    return {"world": label, "queries": len(truth.levels), "table": table, "comparisons": comparisons(table)}


def qualifies(world: dict[str, Any], score: str) -> Optional[bool]:
    """Marginal coverage holds on every run and conditional coverage >= 0.85 for every variant the score applies
    to (``normalized`` needs a variance: not xpool); None where it applies to none."""
    rows = [t[score] for t in world["table"].values() if score in t]
    if not rows:
        return None
    return all(r["holds"] and r["conditional"] >= MIN_CONDITIONAL for r in rows)


def verdict(worlds: list[dict[str, Any]]) -> list[str]:
    lines = []
    scores = [s for s in CONFORMAL_SCORES if any(qualifies(w, s) is not None for w in worlds)]
    ok = {s: [qualifies(w, s) for w in worlds] for s in scores}
    for s in scores:
        lines.append(
            f"{s}: qualifies on " + ", ".join(f"{w['world']} {'yes' if q else 'no'}" for w, q in zip(worlds, ok[s]))
        )
    every = [s for s in scores if all(ok[s])]

    def mean_of(s: str, key: str) -> float:
        return float(np.mean([t[s][key] for w in worlds for t in w["table"].values() if s in t]))

    if every:
        win = min(every, key=lambda s: mean_of(s, "size"))
        lines.append(
            f"qualifying on every world: {', '.join(every)}; the smallest mean set size: {win} ({mean_of(win, 'size'):.1f})"
        )
    else:
        win = max(scores, key=lambda s: mean_of(s, "conditional"))
        lines.append(
            f"none qualifies on every world; the highest conditional coverage: {win} ({mean_of(win, 'conditional'):.3f})"
        )
    lines.append(f"=> DEFAULT_CONFORMAL_SCORE = {win!r}")
    for who, name in (
        ("prob", "the Gaussian uncertainty (prob against xpool)"),
        ("dab", "the bridge (dab against dab-const)"),
    ):
        for kind in ("normalized", "cost-only"):
            hits = []
            for w in worlds:
                for c in w["comparisons"]:
                    if c["a"].startswith(who + " ") and (c["a"].endswith("normalized") == (kind == "normalized")):
                        hits.append(c["smaller"])
            yes = sum(hits) >= 2
            lines.append(f"{name}, {kind} sets smaller on {sum(hits)} of {len(hits)} worlds: {'yes' if yes else 'no'}")
    return lines


def markdown(world: dict[str, Any], alpha: float, seeds: list[int]) -> str:
    first = next(iter(world["table"].values()))
    gnames = list(next(iter(first.values()))["groups"])
    head = "| variant | score | coverage | holds | set size (± seeds) | conditional | " + " | ".join(gnames) + " |"
    rows = [f"#### {world['world']}: {world['queries']} test queries, coverage {1 - alpha:g}, seeds {seeds}", "", head]
    rows.append("|" + "---|" * (6 + len(gnames)))
    for variant, t in world["table"].items():
        for score, r in t.items():
            g = " | ".join(f"{r['groups'][k]:.3f}" for k in gnames)
            rows.append(
                f"| {variant} | {score} | {r['coverage']:.3f} | {'yes' if r['holds'] else 'NO'} | "
                f"{r['size']:.1f} ± {r['size_std']:.1f} | {r['conditional']:.3f} | {g} |"
            )
    rows += [
        "",
        "| comparison | set size difference [95 % interval] | conditional coverage | smaller |",
        "|---|---|---|---|",
    ]
    for c in world["comparisons"]:
        rows.append(
            f"| {c['a']} - {c['b']} | {c['diff']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] | "
            f"{c['conditional'][0]:.3f} vs {c['conditional'][1]:.3f} | {'yes' if c['smaller'] else 'no'} |"
        )
    return "\n".join(rows)


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", nargs="+", default=list(WORLDS), help="preset[:KEY=VALUE,...]")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--splits", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=Q.QUICK_EPOCHS)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, default=Path("bench_data"))
    ap.add_argument("--out", type=Path, default=None, help="write coverage_study.md / .json here")
    args = ap.parse_args(argv)
    t0 = time.time()
    worlds = [study_world(spec, args) for spec in args.worlds]
    text = "\n\n".join(markdown(w, args.alpha, args.seeds) for w in worlds)
    text += "\n\nThe rule (docs/quality.md):\n\n" + "\n".join(f"- {line}" for line in verdict(worlds))
    text += f"\n\n{time.time() - t0:.0f} s of wall time; {json.dumps(Q.machine())}"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "coverage_study.md").write_text(text + "\n")
        for w in worlds:
            for t in w["table"].values():
                for r in t.values():
                    r.pop("sizes")
        (args.out / "coverage_study.json").write_text(json.dumps(worlds, indent=1))
    return {"worlds": worlds, "text": text}


if __name__ == "__main__":
    main()
