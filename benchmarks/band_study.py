"""Guarantees per band of uncertainty, the video as the unit (issue 58; the rule: docs/quality.md, "Guarantees per
band of uncertainty ...", committed before any of these runs was measured).

For each world, variant and seed: train with the world recipe (``benchmarks/quality.py``, through `dab sweep`;
finished runs are reused), take best.pt and score every caption of the world's test videos (the claims
benchmark's eval store). Then 200 random halves of the test *videos*: one half calibrates (split again by video:
the first part fixes band edges and fits the probability maps, the second gives the per-band quantiles and the
Learn-then-Test threshold), the other half evaluates. Per method (``marginal``, ``bands`` of the run's own signal,
``bands-margin`` for Gaussian runs, ``conditional`` on the first 20 halves) and alpha: the video-weighted coverage of
every group and the mean set size. Then the rule's three questions (:func:`verdict`), the third on a synthetic
population of clustered queries of known risk (:func:`synthetic_risk`).

    python benchmarks/band_study.py [--worlds benchmark uncertain benchmark:ambiguity=0] [--seeds 1 2 3]
        [--variants xpool prob dab] [--splits 200] [--conditional-splits 20] [--data-dir bench_data] [--out DIR]
    python benchmarks/band_study.py --synthetic-only [--draws 1000]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import claims as C  # noqa: E402
import coverage as CV  # noqa: E402
import coverage_study as CS  # noqa: E402
import quality as Q  # noqa: E402

from dab_pipeline.calibration import QueryFeatures, first_hit_outcomes, query_features  # noqa: E402
from dab_pipeline.calibration.build import split_videos  # noqa: E402
from dab_pipeline.calibration.fit import fit_map  # noqa: E402
from dab_pipeline.metrics.conditional import ConditionalQuantiles  # noqa: E402
from dab_pipeline.metrics.conformal import (  # noqa: E402
    band_edges,
    band_of,
    band_quantiles,
    conformal_scores,
    cost_softmax,
    video_weights,
    weighted_quantile,
)
from dab_pipeline.metrics.risk import learn_then_test, risk_test_order  # noqa: E402
from dab_pipeline.testing import clustered_outcomes, clustered_risk  # noqa: E402

WORLDS = ("benchmark", "uncertain", "benchmark:ambiguity=0")
VARIANTS = ("xpool", "prob", "dab")
ALPHAS = (0.1, 0.2)
SLACK = 0.02  # a group reaches the target at coverage >= 1 - alpha - SLACK
SIZE_RATIO = 1.5  # ... at a mean set size <= SIZE_RATIO x marginal's
MIN_LEVEL = 300  # caption levels judged: those with at least this many test queries
DELTA = 0.05


def _weighted(hit: np.ndarray, w: np.ndarray) -> Optional[float]:
    return float(np.average(hit, weights=w)) if len(hit) else None


class RunData:
    """One run's scored test queries: conformal scores, signals and what the groups read."""

    def __init__(self, cost, gt, tv, temperature, levels, lengths) -> None:
        self.cost, self.gt, self.tv, self.temperature = cost, gt, tv, temperature
        self.s = conformal_scores(cost_softmax(cost, temperature), "aps")  # (Q, V)
        self.own = self.s[np.arange(len(gt)), gt]  # (Q,)
        self.first = np.argmin(cost, axis=1)  # (Q,) the first hit: always in a set (issue 58, item 3)
        self.w = video_weights(gt)  # (Q,)
        self.margin = query_features(cost, temperature).column("margin")
        self.signals = {"margin": -self.margin}  # larger: less certain
        if tv is not None:
            self.signals["variance"] = np.log(tv)
        self.own_signal = "variance" if tv is not None else "margin"
        self.levels, self.lengths = levels, lengths.astype(np.float64)
        self.feats = query_features(cost, temperature, 5, tv)  # what the probability maps read
        self.right, _ = first_hit_outcomes(cost, gt)  # (Q,) whether the first hit is the match

    def sets(self, rows: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit (R,), size (R,)) of the queries ``rows`` at their quantiles ``q`` (R,), the first hit always in."""
        inside = self.s[rows] <= q[:, None]  # (R, V)
        inside[np.arange(len(rows)), self.first[rows]] = True
        return inside[np.arange(len(rows)), self.gt[rows]], inside.sum(axis=1)


def measure_split(d: RunData, split: int, alpha: float, conditional: bool) -> dict[str, Any]:
    """One random half by video: per method, the group coverages (video-weighted) and the mean set size."""
    videos = np.unique(d.gt)
    perm = np.random.default_rng(split).permutation(videos)
    cal_v = perm[: len(videos) // 2]
    cal, ev = np.isin(d.gt, cal_v), ~np.isin(d.gt, cal_v)
    cal_rows = np.flatnonzero(cal)
    fit_i, held_i = split_videos(d.gt[cal_rows], split)
    fit_rows, held_rows = cal_rows[fit_i], cal_rows[held_i]
    ev_rows = np.flatnonzero(ev)
    # every signal's terciles from the fitted part, the groups judged on the evaluating half
    band = {k: band_of(v, band_edges(v[fit_rows], 3)) for k, v in d.signals.items()}  # name -> (Q,)
    length = band_of(d.lengths, band_edges(d.lengths[fit_rows], 2))
    marginal_q = weighted_quantile(d.own[cal_rows], alpha, d.w[cal_rows])
    qs: dict[str, np.ndarray] = {"marginal": np.full(len(ev_rows), marginal_q)}
    for name in ["variance", "margin"] if "variance" in band else ["margin"]:
        per = band_quantiles(d.own[held_rows], band[name][held_rows], 3, alpha, d.w[held_rows])
        q = per[band[name][ev_rows]]
        method = "bands" if name == d.own_signal else "bands-margin"
        qs[method] = np.where(np.isfinite(q), q, marginal_q)
    if conditional:
        b = band[d.own_signal]
        phi = np.stack([np.ones(len(b)), b == 1, b == 2, length == 1], axis=1).astype(np.float64)
        cq = ConditionalQuantiles(d.own[held_rows], phi[held_rows], alpha, d.w[held_rows])
        q = cq.cutoffs(phi[ev_rows])
        qs["conditional"] = np.where(np.isfinite(q), q, marginal_q)
    groups = {f"{k} {i + 1}": band[k][ev_rows] == i for k in band for i in range(3)}
    groups |= {f"level {lv}": d.levels[ev_rows] == lv for lv in np.unique(d.levels)}
    w = d.w[ev_rows]
    out: dict[str, Any] = {}
    for method, q in qs.items():
        hit, size = d.sets(ev_rows, q)
        out[method] = {
            "coverage": _weighted(hit, w),
            "size": float(size.mean()),
            "groups": {g: _weighted(hit[m], w[m]) for g, m in groups.items()},
        }
    return out


def risk_split(d: RunData, split: int) -> dict[str, Any]:
    """dab calibrate's risk procedure (the maps fitted on the first part of a calibrating half by video, the
    thresholds ordered there and tested on the second part), measured on the evaluating half, at each alpha."""
    videos = np.unique(d.gt)
    perm = np.random.default_rng(split).permutation(videos)
    cal = np.isin(d.gt, perm[: len(videos) // 2])
    cal_rows, ev_rows = np.flatnonzero(cal), np.flatnonzero(~cal)
    fit_i, held_i = split_videos(d.gt[cal_rows], split)
    fit_rows, held_rows = cal_rows[fit_i], cal_rows[held_i]
    sub = lambda idx: QueryFeatures(d.feats.names, d.feats.values[idx])  # noqa: E731
    first_map = fit_map(sub(fit_rows), d.right[fit_rows], "logistic")
    p_fit, p_held, p_ev = (first_map.predict(sub(r)) for r in (fit_rows, held_rows, ev_rows))
    out = {}
    for alpha in ALPHAS:
        order = risk_test_order(p_fit, d.right[fit_rows], d.gt[fit_rows], alpha, DELTA)
        got = learn_then_test(p_held, d.right[held_rows], alpha, DELTA, video=d.gt[held_rows], order=order)
        if got.threshold is None:
            out[f"{alpha:g}"] = {"answered": 0.0, "error": None}
            continue
        ans = p_ev >= got.threshold
        w = d.w[ev_rows]
        err = _weighted(~d.right[ev_rows][ans], w[ans]) if ans.any() else None
        out[f"{alpha:g}"] = {"answered": _weighted(ans, w), "error": err}
    return out


def _scored(run_dir: Path, eval_store: Path) -> tuple:
    """(cost, gt, text_var, temperature) of the run on the eval store's test split, cached in the run folder."""
    cache = run_dir / "band_study-scored.npz"
    if cache.is_file() and cache.stat().st_mtime >= (run_dir / "metrics.json").stat().st_mtime:
        z = np.load(cache)
        return z["cost"], z["gt"], (z["tv"] if z["tv"].size else None), float(z["temperature"])
    _, cost, gt, tv, temperature = CV._inputs(run_dir, eval_store)
    np.savez(cache, cost=cost, gt=gt, tv=np.zeros(0) if tv is None else tv, temperature=temperature)
    return cost, gt, tv, temperature


def measure_run(run_dir: Path, eval_store: Path, truth, lengths, args) -> dict[str, Any]:
    """One run's figures (cached in the run folder: a pure function of the run and these arguments)."""
    cache = run_dir / f"band_study-{args.splits}-{args.conditional_splits}.json"
    if cache.is_file() and cache.stat().st_mtime >= (run_dir / "metrics.json").stat().st_mtime:
        return json.loads(cache.read_text())
    d = RunData(*_scored(run_dir, eval_store), truth.levels, lengths)
    got: dict[str, Any] = {"queries": len(d.gt), "videos": int(len(np.unique(d.gt)))}
    all_risks = [risk_split(d, s) for s in range(args.splits)]
    for alpha in ALPHAS:
        per = [measure_split(d, s, alpha, s < args.conditional_splits) for s in range(args.splits)]
        methods = {m for p in per for m in p}
        got[f"{alpha:g}"] = {m: _mean_over([p[m] for p in per if m in p]) for m in sorted(methods)}
        risks = [r[f"{alpha:g}"] for r in all_risks]
        errs = [r["error"] for r in risks if r["error"] is not None]
        got[f"risk {alpha:g}"] = {
            "answered": float(np.mean([r["answered"] for r in risks])),
            "splits_answering": len(errs),
            "error": float(np.mean(errs)) if errs else None,
            "splits_above": float(np.mean([e > alpha for e in errs])) if errs else None,
        }
    cache.write_text(json.dumps(got))
    return got


def _mean_over(rows: list[dict[str, Any]]) -> dict[str, Any]:
    groups = rows[0]["groups"]
    return {
        "splits": len(rows),
        "coverage": float(np.mean([r["coverage"] for r in rows])),
        "size": float(np.mean([r["size"] for r in rows])),
        "groups": {
            g: (float(np.mean(v)) if (v := [r["groups"][g] for r in rows if r["groups"][g] is not None]) else None)
            for g in groups
        },
    }


def study_world(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    preset, sets = CS.world_spec(spec)
    label, cfg = Q.world_of(preset, sets)
    stores = Q.build(label, cfg, args.data_dir, need_k2=False, workers=args.workers, claims=True)
    runs_dir = args.data_dir / f"runs-{label}"
    Q.sweep_runs(list(args.variants), list(args.seeds), stores, runs_dir, args.epochs, [])
    truth = C.truth(stores["world"], stores["eval"], "test")
    from dab_pipeline.store import open_store

    with open_store(stores["eval"]) as st:
        sp = st.load_split("test")
        lengths = np.array([len(str(t).split()) for t in st.caption_text[sp.caption_index]])
    counts = {str(lv): int((truth.levels == lv).sum()) for lv in np.unique(truth.levels)}
    table: dict[str, list[dict[str, Any]]] = {}
    for variant in args.variants:
        for seed in args.seeds:
            t0 = time.time()
            r = measure_run(runs_dir / f"{variant}-seed{seed}", stores["eval"], truth, lengths, args)
            table.setdefault(variant, []).append(r)
            Q.log(f"{label} {variant} seed {seed}: measured ({time.time() - t0:.0f} s)")
    return {"world": label, "queries": len(truth.levels), "levels": counts, "table": table}


def judged_groups(world: dict[str, Any], signal: str) -> list[str]:
    """The groups question 1 judges: the run's own signal's bands and the levels of >= MIN_LEVEL queries."""
    levels = [f"level {lv}" for lv, n in world["levels"].items() if n >= MIN_LEVEL]
    return [f"{signal} {i}" for i in (1, 2, 3)] + levels


def seed_mean(runs: list[dict[str, Any]], alpha: float, method: str) -> Optional[dict[str, Any]]:
    rows = [r[f"{alpha:g}"][method] for r in runs if method in r[f"{alpha:g}"]]
    if not rows:
        return None
    return {
        "coverage": float(np.mean([r["coverage"] for r in rows])),
        "size": float(np.mean([r["size"] for r in rows])),
        "size_std": float(np.std([r["size"] for r in rows])),
        "groups": {
            g: (float(np.mean(v)) if (v := [r["groups"][g] for r in rows if r["groups"][g] is not None]) else None)
            for g in rows[0]["groups"]
        },
    }


def reaches(world, variant, alpha, method) -> tuple[Optional[bool], Optional[float], Optional[float]]:
    """(question 1's verdict, the lowest judged group's coverage, size / marginal's size)."""
    runs = world["table"][variant]
    m, base = seed_mean(runs, alpha, method), seed_mean(runs, alpha, "marginal")
    if m is None or base is None:
        return None, None, None
    signal = "variance" if "variance 1" in m["groups"] else "margin"
    low = min(m["groups"][g] for g in judged_groups(world, signal) if m["groups"].get(g) is not None)
    ratio = m["size"] / base["size"]
    return bool(low >= 1 - alpha - SLACK and ratio <= SIZE_RATIO), low, ratio


def compare_signals(world, variant, alpha) -> Optional[str]:
    """Question 2 on one world: variance bands against margin bands, on one family of groups."""
    runs = world["table"][variant]
    a, b = seed_mean(runs, alpha, "bands"), seed_mean(runs, alpha, "bands-margin")
    if a is None or b is None or "variance 1" not in a["groups"]:
        return None
    fam = [f"variance {i}" for i in (1, 2, 3)] + [f"margin {i}" for i in (1, 2, 3)]
    fam += [f"level {lv}" for lv, n in world["levels"].items() if n >= MIN_LEVEL]
    low_a = min(a["groups"][g] for g in fam if a["groups"].get(g) is not None)
    low_b = min(b["groups"][g] for g in fam if b["groups"].get(g) is not None)
    if low_a > low_b and a["size"] <= b["size"]:
        return "better"
    if low_a < low_b and a["size"] >= b["size"]:
        return "worse"
    return "mixed"


def synthetic_risk(draws: int, videos: int = 300, population: int = 2_000_000) -> dict[str, Any]:
    """Question 3: LTT with the video as the unit against the caption-binomial test, on a clustered population."""
    pop = clustered_outcomes(max(1, population // 6), seed=1)  # 1 to 12 captions a video: ~6.5 on average
    grid = np.linspace(1.0, 0.0, 201)[1:]
    risk = dict(zip(grid.tolist(), clustered_risk(pop, grid)))
    out: dict[str, Any] = {"captions": int(len(pop["video"])), "draws": draws, "videos": videos}
    for alpha in ALPHAS:
        rows = {"video (wsr)": ([], []), "caption (binomial)": ([], [])}
        for d in range(draws):
            s = clustered_outcomes(videos, seed=10_000 + d)
            fit, chk = split_videos(s["video"], d)
            order = risk_test_order(s["confidence"][fit], s["correct"][fit], s["video"][fit], alpha, DELTA)
            got = {
                "video (wsr)": learn_then_test(
                    s["confidence"][chk], s["correct"][chk], alpha, DELTA, video=s["video"][chk], order=order
                ),
                "caption (binomial)": learn_then_test(s["confidence"][chk], s["correct"][chk], alpha, DELTA),
            }
            for name, g in got.items():
                rows[name][0].append(g.threshold is not None and risk[g.threshold] > alpha)
                rows[name][1].append(g.answered_share)
        bound = DELTA + 2 * math.sqrt(DELTA * (1 - DELTA) / draws)
        out[f"{alpha:g}"] = {
            name: {
                "failure": float(np.mean(f)),
                "holds": bool(np.mean(f) <= bound),
                "answered": float(np.mean(a)),
            }
            for name, (f, a) in rows.items()
        } | {"bound": bound}
    return out


def markdown(worlds: list[dict[str, Any]], syn: Optional[dict[str, Any]]) -> str:
    out = []
    for w in worlds:
        for alpha in ALPHAS:
            gnames = None
            rows = []
            for variant, runs in w["table"].items():
                for method in ("marginal", "bands", "bands-margin", "conditional"):
                    m = seed_mean(runs, alpha, method)
                    if m is None:
                        continue
                    signal = "variance" if "variance 1" in m["groups"] else "margin"
                    gnames = gnames or [g for g in m["groups"] if not g.startswith("variance")]
                    ok, low, ratio = reaches(w, variant, alpha, method) if method != "marginal" else (None, None, None)
                    judged = min(m["groups"][g] for g in judged_groups(w, signal) if m["groups"].get(g) is not None)
                    cells = " | ".join("-" if m["groups"].get(g) is None else f"{m['groups'][g]:.3f}" for g in gnames)
                    var = " | ".join(
                        "-" if m["groups"].get(f"variance {i}") is None else f"{m['groups'][f'variance {i}']:.3f}"
                        for i in (1, 2, 3)
                    )
                    verdict = "-" if ok is None else ("yes" if ok else "no")
                    size = f"{m['size']:.1f} ± {m['size_std']:.1f}" + ("" if ratio is None else f" (x{ratio:.2f})")
                    rows.append(
                        f"| {variant} | {method} | {m['coverage']:.3f} | {size} | {judged:.3f} | {verdict} | "
                        f"{var} | {cells} |"
                    )
            head = (
                f"#### {w['world']}: {w['queries']} test queries, coverage {1 - alpha:g} (alpha {alpha:g})\n\n"
                "| variant | method | coverage | set size (x marginal) | lowest judged | reaches | variance 1 | "
                "variance 2 | variance 3 | " + " | ".join(gnames or []) + " |\n"
                "|" + "---|" * (9 + len(gnames or []))
            )
            out.append(head + "\n" + "\n".join(rows))
        risk_rows = [
            f"| {v} | {a:g} | {np.mean([r[f'risk {a:g}']['answered'] for r in runs]):.3f} | " + _err(runs, a) + " |"
            for v, runs in w["table"].items()
            for a in ALPHAS
        ]
        out.append(
            f"#### {w['world']}: answers under max risk (per-video Learn-then-Test, delta {DELTA})\n\n"
            "| variant | max risk | answered share | answered error on the evaluating half (splits above the max "
            "risk) |\n|---|---|---|---|\n" + "\n".join(risk_rows)
        )
    if syn:
        rows = [
            f"| {a:g} | {name} | {r['failure']:.3f} | {syn[f'{a:g}']['bound']:.3f} | "
            f"{'yes' if r['holds'] else 'NO'} | {r['answered']:.3f} |"
            for a in ALPHAS
            for name, r in syn[f"{a:g}"].items()
            if name != "bound"
        ]
        out.append(
            f"#### The risk bound on a clustered population ({syn['captions']:,} captions; {syn['draws']} draws of "
            f"{syn['videos']} videos)\n\n| max risk | test | share of draws above the max risk | bound | holds | "
            "answered share |\n|---|---|---|---|---|---|\n" + "\n".join(rows)
        )
    return "\n\n".join(out)


def _err(runs, a) -> str:
    e = [r[f"risk {a:g}"] for r in runs if r[f"risk {a:g}"]["error"] is not None]
    if not e:
        return "- (nothing answered)"
    above = np.mean([x["splits_above"] for x in e])
    return f"{np.mean([x['error'] for x in e]):.3f} ({above:.2f})"


def verdict(worlds: list[dict[str, Any]], syn: Optional[dict[str, Any]]) -> list[str]:
    lines = []
    for method in ("bands", "conditional"):
        cells = [(w["world"], v, a, reaches(w, v, a, method)[0]) for w in worlds for v in w["table"] for a in ALPHAS]
        cells = [c for c in cells if c[3] is not None]
        misses = [f"{w} {v} {a:g}" for w, v, a, ok in cells if not ok]
        yes = cells and not misses
        lines.append(
            f"question 1, {method}: reaches the target on {len(cells) - len(misses)} of {len(cells)} "
            f"(world, variant, alpha): {'yes' if yes else 'no'}" + (f" (misses: {', '.join(misses)})" if misses else "")
        )
    q2 = {
        (v, a): [compare_signals(w, v, a) for w in worlds]
        for v in ("prob", "dab")
        if any(v in w["table"] for w in worlds)
        for a in ALPHAS
    }
    ok = all(sum(x == "better" for x in r) >= 2 for r in q2.values()) and bool(q2)
    lines.append(
        "question 2, variance bands better than margin bands: "
        + "; ".join(f"{v} {a:g}: {', '.join(str(x) for x in r)}" for (v, a), r in q2.items())
        + f" => {'yes' if ok else 'no'}"
    )
    if syn:
        holds = all(syn[f"{a:g}"]["video (wsr)"]["holds"] for a in ALPHAS)
        lines.append(
            "question 3, the risk bound with the video as the unit: "
            + ("holds" if holds else "does NOT hold")
            + " at "
            + ", ".join(
                f"{a:g} ({syn[f'{a:g}']['video (wsr)']['failure']:.3f} of draws, answering "
                f"{syn[f'{a:g}']['video (wsr)']['answered']:.3f})"
                for a in ALPHAS
            )
            + "; the caption-binomial test: "
            + ", ".join(
                f"{a:g} ({syn[f'{a:g}']['caption (binomial)']['failure']:.3f}, "
                f"{'holds' if syn[f'{a:g}']['caption (binomial)']['holds'] else 'does not hold'})"
                for a in ALPHAS
            )
        )
    return lines


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", nargs="+", default=list(WORLDS), help="preset[:KEY=VALUE,...]")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--splits", type=int, default=200)
    ap.add_argument("--conditional-splits", type=int, default=20)
    ap.add_argument("--draws", type=int, default=1000, help="calibration draws of the synthetic risk check")
    ap.add_argument("--synthetic-only", action="store_true", help="only question 3's synthetic population")
    ap.add_argument("--epochs", type=int, default=Q.QUICK_EPOCHS)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, default=Path("bench_data"))
    ap.add_argument("--out", type=Path, default=None, help="write band_study.md / .json here")
    args = ap.parse_args(argv)
    t0 = time.time()
    syn = synthetic_risk(args.draws) if args.draws else None
    worlds = [] if args.synthetic_only else [study_world(spec, args) for spec in args.worlds]
    text = markdown(worlds, syn)
    text += "\n\nThe rule (docs/quality.md):\n\n" + "\n".join(f"- {line}" for line in verdict(worlds, syn))
    text += f"\n\n{time.time() - t0:.0f} s of wall time; {json.dumps(Q.machine())}"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "band_study.md").write_text(text + "\n")
        (args.out / "band_study.json").write_text(json.dumps({"worlds": worlds, "synthetic": syn}, indent=1))
    return {"worlds": worlds, "synthetic": syn, "text": text}


if __name__ == "__main__":
    main()
