"""Conformal sets and the risk guarantee checked on held-out queries (issues 47 and 58, docs/uncertainty.md).

For each run, its test split's queries (one gallery: every score is over the same videos) are split at random
*by video* into a calibrating half and an evaluating half, ``--splits`` times (200): captions of one video are
not independent, so the video is the unit of every split, quantile and test. The calibrating half is split again
by video as ``dab calibrate`` splits it (the first part fixes the band edges, the second gives the per-band
quantiles). Per alpha in {0.05, 0.1, 0.2}, per conformal score and per method (``marginal``: one quantile over the
calibrating half; ``bands``: a quantile per tercile of the run's uncertainty, Mondrian) it prints:

* the mean coverage over splits (each caption weighted by one over its video's captions) with its standard error,
  and, for ``marginal``, whether it lies in [1 - alpha, 1 - alpha + 1/(n+1)] within two standard errors (n the
  calibrating videos);
* the set size (mean, median, 90th percentile over every evaluated query of every split; the first hit is always
  in a set);
* coverage per tercile of the query's uncertainty (the log text variance for a Gaussian run, else minus the margin;
  the terciles fixed on the first part), per caption level where ``--world`` gives the procedural world's claims,
  and claim-aware (a set holds *any* video the caption is true of);
* the risk guarantee: ``calibrate_costs`` on the calibrating half, the per-video Learn-then-Test threshold at
  (alpha, ``--delta``), then on the evaluating half the share of queries answered and the share of splits whose
  answered error rate exceeds alpha (the guarantee bounds the population rate by alpha with probability 1 - delta;
  a rate measured on a few dozen answered queries scatters around it).

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

from dab_pipeline.calibration import (
    UncertaintyRequest,
    calibrate_costs,
    first_hit_outcomes,
    query_features,
    risk_threshold,
)
from dab_pipeline.calibration.build import split_videos
from dab_pipeline.metrics.conformal import (
    CONFORMAL_SCORES,
    band_edges,
    band_of,
    band_quantiles,
    conformal_scores,
    cost_softmax,
    video_weights,
    weighted_quantile,
)
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


def video_halves(gt: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(edge rows, quantile rows, evaluation rows) of one random half by video: the calibrating half's videos split
    again as ``dab calibrate`` splits them (its first part fixes band edges, its second gives per-band quantiles)."""
    videos = np.unique(gt)
    perm = np.random.default_rng(seed).permutation(videos)
    cal = np.isin(gt, perm[: len(videos) // 2])
    cal_rows = np.flatnonzero(cal)
    fit, held = split_videos(gt[cal_rows], seed)
    return cal_rows[fit], cal_rows[held], np.flatnonzero(~cal)


def coverage_table(cost, gt, tv, temperature, alphas, splits, truth=None) -> dict[str, Any]:
    """Per score, alpha and method (``marginal``: one quantile over the calibrating half; ``bands``: a quantile per
    tercile of the run's uncertainty, Mondrian): coverage over random halves *by video* (each caption weighted by one
    over its video's captions), set sizes (the first hit always in), coverage per uncertainty tercile, per caption
    level and claim-aware."""
    q = len(cost)
    p = cost_softmax(cost, temperature)  # (Q, V)
    uncertainty = (
        np.log(tv) if tv is not None else -query_features(cost, temperature).column("margin")
    )  # larger: harder
    w = video_weights(gt)
    first = np.argmin(cost, axis=1)
    out: dict[str, Any] = {}
    for score in CONFORMAL_SCORES:
        if score == "normalized" and tv is None:
            continue
        s = conformal_scores(p, score, difficulty=tv)  # (Q, V)
        own = s[np.arange(q), gt]  # (Q,)
        for alpha in alphas:
            for method in ("marginal", "bands"):
                acc = {"cov": [], "size": [], "by_t": [[] for _ in range(3)], "by_level": {}, "claim": [], "n": []}
                for seed in range(splits):
                    edge, held, ev = video_halves(gt, seed)
                    band = band_of(uncertainty, band_edges(uncertainty[edge], 3))  # (Q,) terciles from the edge part
                    cal = np.concatenate([edge, held])
                    if method == "marginal":
                        qhat = np.full(len(ev), weighted_quantile(own[cal], alpha, w[cal]))
                        acc["n"].append(len(np.unique(gt[cal])))
                    else:
                        qhat = band_quantiles(own[held], band[held], 3, alpha, w[held])[band[ev]]
                    inside = s[ev] <= qhat[:, None]  # (|ev|, V)
                    inside[np.arange(len(ev)), first[ev]] = True
                    hit = inside[np.arange(len(ev)), gt[ev]]
                    acc["cov"].append(np.average(hit, weights=w[ev]))
                    acc["size"] += inside.sum(1).tolist()
                    for t in range(3):
                        m = band[ev] == t
                        if m.any():
                            acc["by_t"][t].append(np.average(hit[m], weights=w[ev][m]))
                    if truth is not None:
                        acc["claim"].append((inside & truth.relevant[ev]).any(1).mean())
                        for lv in np.unique(truth.levels):
                            m = truth.levels[ev] == lv
                            acc["by_level"].setdefault(str(lv), []).append(np.average(hit[m], weights=w[ev][m]))
                m, se = float(np.mean(acc["cov"])), float(np.std(acc["cov"]) / np.sqrt(splits))
                n = float(np.mean(acc["n"])) if acc["n"] else None
                size = acc["size"]
                out[f"{score} {alpha:g} {method}"] = {
                    "coverage": m,
                    "se": se,
                    # the marginal guarantee's bounds, n the calibrating videos (per band: each band's own)
                    "holds": None if n is None else bool(1 - alpha - 2 * se <= m <= 1 - alpha + 1 / (n + 1) + 2 * se),
                    "size": [float(np.mean(size)), float(np.median(size)), float(np.quantile(size, 0.9))],
                    "by_uncertainty_tercile": [float(np.mean(x)) for x in acc["by_t"]],
                    "by_level": {k: float(np.mean(v)) for k, v in acc["by_level"].items()},
                    "claim_aware": float(np.mean(acc["claim"])) if acc["claim"] else None,
                }
    return out


def risk_table(cost, gt, tv, temperature, alphas, delta, splits) -> dict[str, Any]:
    """Per alpha: ``dab calibrate``'s risk procedure (the video as the unit) on a calibrating half by video, then on
    the evaluating half the share answered and whether the answered error rate exceeds alpha."""
    first, _ = first_hit_outcomes(cost, gt)
    w = video_weights(gt)
    out = {}
    for alpha in alphas:
        answered, exceeded, errors = [], 0, []
        for seed in range(splits):
            edge, held, ev = video_halves(gt, seed)
            a = np.sort(np.concatenate([edge, held]))
            cal = calibrate_costs(cost[a], gt[a], temperature, None if tv is None else tv[a], seed=seed)
            risk = risk_threshold(cal, alpha, delta)
            if risk.threshold is None:
                answered.append(0.0)
                continue
            feats = query_features(cost[ev], temperature, cal.first_k, None if tv is None else tv[ev])
            ans = cal.maps["first"].predict(feats) >= risk.threshold
            answered.append(float(np.average(ans, weights=w[ev])))
            if ans.any():
                err = float(np.average(~first[ev][ans], weights=w[ev][ans]))
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


def _print(name: str, cov: dict, risk: dict, n: int, videos: int) -> None:
    print(f"\n## {name}: {n} test queries of {videos} videos, halves by video")
    print(
        "| score | alpha | method | coverage ± se | in bounds | size mean / median / p90 | "
        "by uncertainty tercile (low..high) | claim-aware | by level |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for key, r in cov.items():
        score, alpha, method = key.split()
        lv = ", ".join(f"{k}: {v:.2f}" for k, v in r["by_level"].items()) or "-"
        claim = f"{r['claim_aware']:.3f}" if r["claim_aware"] is not None else "-"
        t = " / ".join(f"{x:.2f}" for x in r["by_uncertainty_tercile"])
        sz = " / ".join(f"{x:.1f}" for x in r["size"])
        holds = "-" if r["holds"] is None else ("yes" if r["holds"] else "NO")
        print(
            f"| {score} | {alpha} | {method} | {r['coverage']:.3f} ± {r['se']:.3f} | {holds} | {sz} | {t} | "
            f"{claim} | {lv} |"
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
        _print(str(run_dir), cov, risk, len(cost), len(np.unique(gt)))
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
