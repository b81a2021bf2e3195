"""Conformal sets and the risk guarantee checked on held-out queries (issue 47, docs/uncertainty.md).

For each run, its test split's queries (one gallery: every score is over the same videos) are split at random
into a calibration half and an evaluation half, ``--splits`` times (200). Per alpha in {0.05, 0.1, 0.2} and per
conformal score it prints:

* the mean coverage over splits with its standard error, and whether it lies in [1 - alpha, 1 - alpha + 1/(n+1)]
  within two standard errors (the split-conformal guarantee; n the calibration queries);
* the set size (mean, median, 90th percentile over every evaluated query of every split);
* conditional coverage: per tercile of the query's uncertainty (the text variance for a Gaussian run, else the
  margin), and per caption level where ``--world`` gives the procedural world's claims, plus the claim-aware
  coverage (a set holds *any* video the caption is true of);
* the risk guarantee: ``calibrate_costs`` on the calibration half (its own fitted/held-out halves), the
  Learn-then-Test threshold at (alpha, ``--delta``), then on the evaluation half the share of queries answered and
  the share of splits whose answered error rate exceeds alpha (the guarantee bounds the population rate by alpha
  with probability 1 - delta; a rate measured on a few dozen answered queries scatters around it).

``--latency``: ``Searcher.search`` with and without ``coverage=0.9`` on the run's store, interleaved, in one
process: the ratio of the medians, mean ± std over ``--repeats``.

    python benchmarks/coverage.py --run demo_out/runs/dab [--run demo_out/runs/xpool] [--world demo_out/world]
        [--eval-store demo_out/store-eval.h5] [--splits 200] [--alphas 0.05 0.1 0.2] [--delta 0.05] [--latency] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from dab_pipeline.calibration import UncertaintyRequest, calibrate_costs, first_hit_outcomes, query_features
from dab_pipeline.metrics.conformal import CONFORMAL_SCORES, conformal_quantile, conformal_scores, cost_softmax
from dab_pipeline.metrics.risk import learn_then_test
from dab_pipeline.runs.costfile import read_costs
from dab_pipeline.runs.load import load_run
from dab_pipeline.runs.run_folder import RunFolder


def _inputs(run_dir: Path, store: Optional[Path] = None):
    """The run, its test costs (Q, V), each query's match, its text variance (a Gaussian run) and the temperature:
    from the run's cost file, or with ``store`` (an eval store: every caption of the val and test videos,
    ``claims.eval_store``) its test split scored here."""
    run = load_run(run_dir)
    if store is not None:
        from dab_pipeline.calibration import text_variance
        from dab_pipeline.scoring import score_all
        from dab_pipeline.store import open_store

        with open_store(store) as st:
            sp = st.load_split(run.config.test_split)
        cost = np.asarray(score_all(run.model, sp.text, sp.frames, sp.frame_mask).cost, np.float64)
        tv = text_variance(run.model, sp.text)
        return run, cost, np.asarray(sp.caption_video, np.int64), tv, float(run.model.temperature().detach())
    cm = read_costs(RunFolder(run_dir).find_costs())
    cost = np.asarray(cm.to_cost() if hasattr(cm, "to_cost") else cm.cost, np.float64)  # (Q, V)
    tv = (cm.extras or {}).get("text_var") if run.model.cfg.gaussian else None
    tv = None if tv is None else np.asarray(tv, np.float64)
    return run, cost, np.asarray(cm.gt, np.int64), tv, float(run.model.temperature().detach())


def _world_truth(world: Optional[Path], run, store: Optional[Path] = None) -> Any:
    if world is None:
        return None
    sys.path.insert(0, str(Path(__file__).parent))
    from claims import truth  # benchmarks/claims.py: the world's claims against a store's split

    return truth(world, store or Path(run.config.features), run.config.test_split)


def coverage_table(cost, gt, tv, temperature, alphas, splits, truth=None) -> dict[str, Any]:
    """Per score and alpha: coverage over random halves, set sizes, conditional and claim-aware coverage."""
    q = len(cost)
    p = cost_softmax(cost, temperature)  # (Q, V)
    uncertainty = tv if tv is not None else -query_features(cost, temperature).column("margin")  # larger: harder
    tercile = np.digitize(uncertainty, np.quantile(uncertainty, [1 / 3, 2 / 3]))  # (Q,) 0, 1, 2
    out: dict[str, Any] = {}
    for score in CONFORMAL_SCORES:
        if score == "normalized" and tv is None:
            continue
        s = conformal_scores(p, score, difficulty=tv)  # (Q, V)
        own = s[np.arange(q), gt]  # (Q,)
        for alpha in alphas:
            cov, size, hit_all, by_t, by_level, claim = [], [], [], [[] for _ in range(3)], {}, []
            for seed in range(splits):
                perm = np.random.default_rng(seed).permutation(q)
                a, b = perm[: q // 2], perm[q // 2 :]
                inside = s[b] <= conformal_quantile(own[a], alpha)  # (|b|, V)
                hit = inside[np.arange(len(b)), gt[b]]
                cov.append(hit.mean())
                size += inside.sum(1).tolist()
                hit_all.append(hit)
                for t in range(3):
                    by_t[t] += hit[tercile[b] == t].tolist()
                if truth is not None:
                    claim.append((inside & truth.relevant[b]).any(1).mean())
                    for lv in np.unique(truth.levels):
                        by_level.setdefault(str(lv), []).extend(hit[truth.levels[b] == lv].tolist())
            n = q // 2
            m, se = float(np.mean(cov)), float(np.std(cov) / np.sqrt(len(cov)))
            out[f"{score} {alpha:g}"] = {
                "coverage": m,
                "se": se,
                "holds": bool(1 - alpha - 2 * se <= m <= 1 - alpha + 1 / (n + 1) + 2 * se),
                "size": [float(np.mean(size)), float(np.median(size)), float(np.quantile(size, 0.9))],
                "by_uncertainty_tercile": [float(np.mean(x)) for x in by_t],
                "by_level": {k: float(np.mean(v)) for k, v in by_level.items()},
                "claim_aware": float(np.mean(claim)) if claim else None,
            }
    return out


def risk_table(cost, gt, tv, temperature, alphas, delta, splits) -> dict[str, Any]:
    """Per alpha: the share answered and the share of splits whose answered error rate on the evaluation half
    exceeds alpha, with the threshold chosen on the calibration half."""
    q = len(cost)
    first, _ = first_hit_outcomes(cost, gt)
    out = {}
    for alpha in alphas:
        answered, exceeded, errors = [], 0, []
        for seed in range(splits):
            perm = np.random.default_rng(seed).permutation(q)
            a, b = perm[: q // 2], perm[q // 2 :]
            cal = calibrate_costs(cost[a], gt[a], temperature, None if tv is None else tv[a], seed=seed)
            risk = learn_then_test(np.array(cal.risk["confidence"]), np.array(cal.risk["correct"], bool), alpha, delta)
            if risk.threshold is None:
                answered.append(0.0)
                continue
            feats = query_features(cost[b], temperature, cal.k, None if tv is None else tv[b])
            ans = cal.maps["first"].predict(feats) >= risk.threshold
            answered.append(float(ans.mean()))
            if ans.any():
                err = float((~first[b][ans]).mean())
                errors.append(err)
                exceeded += err > alpha
        out[f"{alpha:g}"] = {
            "answered": float(np.mean(answered)),
            "splits_answering": int(sum(x > 0 for x in answered)),
            "exceeded_share": exceeded / splits,
            "mean_answered_error": float(np.mean(errors)) if errors else None,
        }
    return out


def latency(run_dir: Path, repeats: int, queries: int = 16) -> dict[str, float]:
    """Searcher.search with and without coverage=0.9, interleaved: ratio of medians (with / without)."""
    from dab_pipeline.search import Searcher
    from dab_pipeline.store import open_store

    run = load_run(run_dir)
    with open_store(run.config.features) as st:
        texts = [str(t) for t in st.caption_text[:queries]]
    ratios = []
    with Searcher(run_dir, run.config.features, device="cpu") as s:
        s.search(texts[:2], 10)  # warm
        for _ in range(repeats):
            plain, asked = [], []
            for t in texts:
                t0 = time.perf_counter()
                s.search([t], 10)
                plain.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                s.search([t], 10, uncertainty=UncertaintyRequest(coverage=0.9))
                asked.append(time.perf_counter() - t0)
            ratios.append(np.median(asked) / np.median(plain))
    return {
        "ratio_mean": float(np.mean(ratios)),
        "ratio_std": float(np.std(ratios)),
        "ms_plain": 1000 * float(np.median(plain)),
    }


def index_coverage(run_dir: Path, index: Path, shortlists: list[int], coverage: float = 0.9) -> dict[str, Any]:
    """What a first stage's misses do to a set: the run's test captions searched in the index's split (the
    gallery the run must be calibrated on, ``dab calibrate --gallery SPLIT``) with every video scored and with
    each shortlist of K; per K the share of queries whose set holds their match, the mean set size, and the
    first stage's recall (the match in the shortlist at all)."""
    from dab_pipeline.search import Searcher
    from dab_pipeline.store import open_store

    run = load_run(run_dir)
    with open_store(run.config.features) as st:
        sp = st.load_split(run.config.test_split)
    want = [str(sp.video_ids[v]) for v in sp.caption_video]
    texts = [str(c) for c in sp.caption_ids]
    req = UncertaintyRequest(coverage=coverage)
    out: dict[str, Any] = {}
    split = json.loads((index / "index.json").read_text())["split"]
    with Searcher(run_dir, run.config.features, split=split, device="cpu", encoder=False) as plain:
        rows = _with_variance(plain, plain.rank(texts, sp.text, 1), sp.text)
        sets = [plain.reassess(r, req).coverage_set for r in rows]
        out["all"] = _set_stats(sets, want, [set(map(str, r.video_ids)) for r in rows])
    with Searcher(run_dir, run.config.features, split=split, index=index, device="cpu", encoder=False) as s:
        for k in shortlists:
            rows = _with_variance(s, s.rank(texts, sp.text, 1, shortlist=k), sp.text)
            sets = [s.reassess(r, req).coverage_set for r in rows]
            out[str(k)] = _set_stats(sets, want, [set(map(str, r.video_ids)) for r in rows])
    return out


def _with_variance(searcher, rows, text):
    """Results of ``Searcher.rank`` (which does not assess) given their text variance, as ``search`` gives it."""
    from dab_pipeline.calibration import text_variance

    tv = text_variance(searcher.run.model, text)
    for i, r in enumerate(rows):
        r.text_var = None if tv is None else float(tv[i])
    return rows


def _set_stats(sets, want, scored) -> dict[str, float]:
    held = [w in {h.video_id for h in s} for s, w in zip(sets, want)]
    recall = [w in sc for sc, w in zip(scored, want)]
    return {
        "coverage": float(np.mean(held)),
        "size": float(np.mean([len(s) for s in sets])),
        "recall": float(np.mean(recall)),
    }


def _print(name: str, cov: dict, risk: dict, n: int) -> None:
    print(f"\n## {name}: {n} test queries, halves of {n // 2}")
    print(
        "| score | alpha | coverage ± se | in bounds | size mean / median / p90 | by uncertainty tercile (low..high) | claim-aware | by level |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key, r in cov.items():
        score, alpha = key.split()
        lv = ", ".join(f"{k}: {v:.2f}" for k, v in r["by_level"].items()) or "-"
        claim = f"{r['claim_aware']:.3f}" if r["claim_aware"] is not None else "-"
        t = " / ".join(f"{x:.2f}" for x in r["by_uncertainty_tercile"])
        sz = " / ".join(f"{x:.1f}" for x in r["size"])
        print(
            f"| {score} | {alpha} | {r['coverage']:.3f} ± {r['se']:.3f} | {'yes' if r['holds'] else 'NO'} | {sz} | {t} | {claim} | {lv} |"
        )
    print(
        "\n| max risk | answered (mean) | splits answering | splits whose answered error > alpha | mean answered error |"
    )
    print("|---|---|---|---|---|")
    for alpha, r in risk.items():
        e = "-" if r["mean_answered_error"] is None else f"{r['mean_answered_error']:.3f}"
        print(f"| {alpha} | {r['answered']:.3f} | {r['splits_answering']} | {r['exceeded_share']:.3f} | {e} |")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, action="append", required=True, help="run folder with a test cost file")
    ap.add_argument("--world", type=Path, default=None, help="the procedural world's folder: claim-aware coverage")
    ap.add_argument(
        "--eval-store",
        type=Path,
        default=None,
        help="score the run on this store's test split instead of reading its cost file (claims.py's eval store: "
        "every caption of the world's val and test videos, several queries a video)",
    )
    ap.add_argument("--splits", type=int, default=200)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    ap.add_argument("--delta", type=float, default=0.05)
    ap.add_argument("--latency", action="store_true", help="also time search with and without a coverage request")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--index", type=Path, default=None, help="a dab index of the gallery calibrated on: coverage per K")
    ap.add_argument("--shortlists", type=int, nargs="+", default=[10, 25, 50, 100])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    report: dict[str, Any] = {}
    for run_dir in args.run:
        run, cost, gt, tv, temperature = _inputs(run_dir, args.eval_store)
        t0 = time.time()
        truth = _world_truth(args.world, run, args.eval_store)
        cov = coverage_table(cost, gt, tv, temperature, args.alphas, args.splits, truth)
        risk = risk_table(cost, gt, tv, temperature, args.alphas, args.delta, args.splits)
        _print(str(run_dir), cov, risk, len(cost))
        report[str(run_dir)] = {"coverage": cov, "risk": risk, "seconds": time.time() - t0}
        if args.latency:
            lat = latency(run_dir, args.repeats)
            report[str(run_dir)]["latency"] = lat
            print(
                f"\nlatency, coverage=0.9 vs none: {lat['ratio_mean']:.3f} ± {lat['ratio_std']:.3f} "
                f"(median {lat['ms_plain']:.1f} ms a query without)"
            )
        if args.index is not None:
            ic = index_coverage(run_dir, args.index, args.shortlists)
            report[str(run_dir)]["index"] = ic
            print(
                "\n| shortlist K | first stage's recall | coverage of the 0.9 set | mean set size |\n|---|---|---|---|"
            )
            for k, r in ic.items():
                print(f"| {k} | {r['recall']:.3f} | {r['coverage']:.3f} | {r['size']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
