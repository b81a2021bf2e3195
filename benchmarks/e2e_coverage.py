"""End-to-end coverage through an index (issue 60, item 5; docs/search.md, docs/uncertainty.md).

A set from ``dab calibrate --index`` must hold a match with the coverage asked *end to end*: a match the first stage
missed is outside every set. This script measures it on three galleries, each searched through ``dab index`` (the
default vector, factory ``auto``, the index's own nprobe) and, where affordable, exhaustively:

* ``demo``: the demo's store (``make demo``), every video (400); queries: every caption of the validation videos
  and the test videos' captions, the pool halved by video;
* ``eval``: the world's eval store of every caption (benchmarks/claims.py: the val and test videos with all their
  captions), every video;
* ``distractors``: the demo's 400 videos among ``--distractors`` (100,000) synthetic videos of the real layout
  (F = 12, D = 64, float16), each a splice of two random *training* videos' frames at a random cut plus noise
  (0.1 of the features' spread), so that they lie where real videos lie; calibrated on the validation captions as
  ``dab calibrate --gallery all --index --coverage`` does, measured on the test queries. Every query is re-ranked
  over the index's first ``--kmax`` (2,000) only: there is no exhaustive search here.

Per gallery and alpha (0.2, 0.1), the conformal score ``aps`` (the search's default), over ``--splits`` (200)
random halves by video (each caption weighted one over its video's captions):

* ``exhaustive``: every video scored, the quantile of the calibrating half;
* ``K = k``: each query's shortlist of the index's first k, re-ranked; a missed match's score is +inf. Coverage
  over the halves whose quantile is finite, and the share of halves whose quantile is infinite (the search refuses
  that coverage in one line);
* ``K chosen``: as ``dab calibrate --coverage``: the calibrating half split again by video (calibrate's own split),
  its first part picks the smallest K of the grid whose first stage misses at most alpha / 2
  (:func:`choose_shortlist`), its second part gives the quantile at that K. The K chosen (median, range), the
  re-ranks per query (K) and the re-ranks saved (1 - K / V).

Coverage "holds" where its mean over the halves is at least 1 - alpha - 2 s.e. Also printed: the first stage's
recall (the match in the shortlist) per K, the largest difference between a re-ranked cost and the exhaustive one
(the re-rank scores a pair as the exhaustive search does), and the latency of one query at a time (first stage,
store read and re-rank at the K chosen for 0.9, against every video scored), median over ``--latency-queries``.

    python benchmarks/e2e_coverage.py --demo demo_out [--distractors 100000] [--splits 200] [--json OUT]

The distractor store (about 160 MB at 100k) and the indexes are written in ``--work`` and removed at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np

from dab_pipeline.calibration.build import split_videos, true_video_scores
from dab_pipeline.metrics.conformal import conformal_scores, cost_softmax, video_weights, weighted_quantile
from dab_pipeline.runs.load import load_run
from dab_pipeline.scoring import Scorer
from dab_pipeline.search import Searcher
from dab_pipeline.stages.calibrate import choose_shortlist, shortlist_grid
from dab_pipeline.stages.index import IndexConfig, run_index
from dab_pipeline.store import create_store, open_store

ALPHAS = (0.2, 0.1)
SCORE = "aps"
K0 = 20
CHECKED = 32  # queries whose re-rank through the Searcher is compared with the exhaustive costs


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Gallery(NamedTuple):
    """What the halves need: each query's video (Q,), its match's position in the gallery (Q,), the index's
    shortlist as gallery positions (Q, Kmax) (-1 past what the index gave), the re-ranked costs aligned with it
    (Q, Kmax) and, where affordable, the exhaustive costs (Q, V)."""

    name: str
    video: np.ndarray
    gt: np.ndarray
    order: np.ndarray
    sl_cost: np.ndarray
    exhaustive: Optional[np.ndarray]
    videos: int
    temperature: float
    rerank_diff: Optional[float] = None


def through_index(s: Searcher, text: np.ndarray, kmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's first-stage order (Q, Kmax) as gallery positions and its re-ranked costs aligned with it, from
    the Searcher's own path (``rank``: the first stage, the store read, the re-rank)."""
    order = np.full((len(text), kmax), -1, np.int64)
    cost = np.full((len(text), kmax), np.inf, np.float64)
    for a in range(0, len(text), 64):
        t = text[a : a + 64]
        got = s.first_stage_order(t, kmax, None)  # (M, <=Kmax)
        order[a : a + len(t), : got.shape[1]] = got
        for i, r in enumerate(s.rank([""] * len(t), t, 1, kmax), start=a):
            at = {int(p): c for p, c in zip(r.positions, r.costs)}
            cost[i] = [at.get(int(p), np.inf) for p in order[i]]
    return order, cost


def gallery(
    name: str, run_dir: Path, store: Path, query_splits: tuple[str, ...], index: Path, kmax: int, exhaustive: bool
) -> Gallery:
    """The queries of ``query_splits`` searched in every video of ``store`` through ``index``. With ``exhaustive``
    every pair is scored at once (the Scorer, as ``dab calibrate`` without an index) and the shortlists' costs are
    read from it, checked against the Searcher's own re-rank on ``CHECKED`` queries (the re-rank scores a pair as
    the exhaustive search does); without, every query goes through the Searcher's re-rank."""
    run = load_run(run_dir, "cpu")
    with open_store(store) as st:
        vids = st.load_split("all")
        pos = {str(v): i for i, v in enumerate(vids.video_ids)}
        parts = [st.load_split(sp) for sp in query_splits]
    text = np.concatenate([np.asarray(p.text, np.float32) for p in parts])  # (Q, D)
    gt = np.concatenate([[pos[str(p.video_ids[v])] for v in p.caption_video] for p in parts]).astype(np.int64)
    kmax = min(kmax, len(pos))
    full, diff = None, None
    with Searcher(run_dir, store, split="all", index=index, device="cpu", encoder=False) as s:
        if not exhaustive:
            order, sl_cost = through_index(s, text, kmax)
        else:
            with Scorer(run.model, device="cpu") as scorer:
                full = np.asarray(scorer.score(text, vids.frames, vids.frame_mask).cost, np.float64)  # (Q, V)
            order = np.concatenate(
                [s.first_stage_order(text[a : a + 256], kmax, None) for a in range(0, len(text), 256)]
            )
            ok = order >= 0
            sl_cost = np.where(ok, np.take_along_axis(full, np.maximum(order, 0), axis=1), np.inf)  # (Q, Kmax)
            pick = np.random.default_rng(0).choice(len(text), min(CHECKED, len(text)), replace=False)
            _, checked = through_index(s, text[pick], kmax)
            diff = float(np.abs(checked[ok[pick]] - sl_cost[pick][ok[pick]]).max())
    temperature = float(run.model.temperature().detach())
    # a query's video is its match's position (one a video): the unit of the halves
    return Gallery(name, gt, gt, order, sl_cost, full, len(pos), temperature, diff)


def shortlist_scores(g: Gallery, k: Optional[int]) -> tuple[np.ndarray, ...]:
    """(the match's score (Q,), +inf where the first stage missed it; every scored video's score (Q, K); the costs
    (Q, K), +inf where not scored; the match's column (Q,), -1 where missed) at shortlist ``k`` (None: every video,
    exhaustively)."""
    if k is None:
        cost, col, found = g.exhaustive, g.gt, np.ones(len(g.gt), bool)
    else:
        cost = g.sl_cost[:, :k]  # (Q, K) the shortlist's re-ranked costs, in the first stage's order
        hit = g.order[:, :k] == g.gt[:, None]  # (Q, K)
        col, found = hit.argmax(1), hit.any(1)
    own = np.where(found, true_video_scores(cost, col, g.temperature, None)[SCORE], np.inf)
    return own, conformal_scores(cost_softmax(cost, g.temperature), SCORE), cost, np.where(found, col, -1)


def halves(video: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(calibrating rows, evaluating rows): the videos halved at random."""
    ids = np.unique(video)
    cal = np.isin(video, np.random.default_rng(10_000 + seed).permutation(ids)[: len(ids) // 2])
    return np.flatnonzero(cal), np.flatnonzero(~cal)


def measure(own, s, cost, match, cal, ev, w, alpha) -> Optional[tuple[float, float]]:
    """(coverage on ``ev``, mean set size) with the quantile of ``cal``; None where that quantile is infinite (the
    search refuses the coverage). A set holds the scored videos whose score is at most the quantile, and always the
    first hit (metrics.conformal.conformal_sets); it covers where it holds the match (a missed match never)."""
    q = weighted_quantile(own[cal], alpha, w[cal])
    if not np.isfinite(q):
        return None
    c = cost[ev]  # (E, K)
    inside = (s[ev] <= q) & np.isfinite(c)  # (E, K)
    inside[np.arange(len(ev)), np.argmin(c, axis=1)] = True  # a shortlist always holds a scored first hit
    m = match[ev]  # (E,) the match's column, -1 where the first stage missed it
    held = (m >= 0) & inside[np.arange(len(ev)), np.maximum(m, 0)]  # (E,) the returned set holds the match
    return float(np.average(held, weights=w[ev])), float(inside.sum(1).mean())


def coverage_rows(g: Gallery, grid: list[int], splits: int, cal_rows=None, ev_rows=None) -> dict[str, Any]:
    """Per alpha and method, coverage over the halves (or, with ``cal_rows``/``ev_rows``, over calibrating draws of
    ``cal_rows``' videos measured on ``ev_rows``)."""
    w = video_weights(g.video)
    scored = {k: shortlist_scores(g, k) for k in grid}
    if g.exhaustive is not None:
        scored[None] = shortlist_scores(g, None)
    out: dict[str, Any] = {}
    for alpha in ALPHAS:
        acc: dict[str, dict[str, list]] = {}
        for seed in range(splits):
            if cal_rows is None:
                cal, ev = halves(g.video, seed)
            else:  # a random half of the calibration videos, as dab calibrate halves them
                cal = cal_rows[halves(g.video[cal_rows], seed)[0]]
                ev = ev_rows
            for k, (own, s, cost, match) in scored.items():
                key = "exhaustive" if k is None else f"K = {k}"
                got = measure(own, s, cost, match, cal, ev, w, alpha)
                _add(acc, key, got, k)
            fit, held = split_videos(g.video[cal], seed)  # calibrate's own split of the calibrating videos
            chosen, _ = choose_shortlist(g.order[cal[fit]], g.gt[cal[fit]], g.video[cal[fit]], grid, alpha)
            own, s, cost, match = scored[chosen]
            _add(acc, "K chosen", measure(own, s, cost, match, cal[held], ev, w, alpha), chosen)
        out[f"{alpha:g}"] = {key: _summary(v, alpha, g.videos) for key, v in acc.items()}
    return out


def _add(acc: dict, key: str, got: Optional[tuple[float, float]], k: Optional[int]) -> None:
    a = acc.setdefault(key, {"cov": [], "size": [], "refused": 0, "k": []})
    a["k"].append(k)
    if got is None:
        a["refused"] += 1
    else:
        a["cov"].append(got[0])
        a["size"].append(got[1])


def _summary(a: dict, alpha: float, videos: int) -> dict[str, Any]:
    n = len(a["cov"])
    m = float(np.mean(a["cov"])) if n else None
    se = float(np.std(a["cov"]) / np.sqrt(n)) if n else None
    ks = [k for k in a["k"] if k is not None]
    return {
        "coverage": m,
        "se": se,
        # the guarantee is marginal over calibrations: with some refused, the rest's mean is not its measure
        "holds": None if m is None or a["refused"] else bool(m >= 1 - alpha - 2 * se),
        "refused_share": a["refused"] / len(a["k"]),
        "size": float(np.mean(a["size"])) if n else None,
        "k": [int(np.median(ks)), int(min(ks)), int(max(ks))] if ks else None,
        "saved": float(1 - np.median(ks) / videos) if ks else None,
    }


def distractor_store(demo: Path, out: Path, n: int, seed: int = 0, chunk: int = 8192) -> Path:
    """The demo's videos and its val and test captions, with ``n`` distractor videos of split ``distractor``: each
    the first c frames of one random training video and the rest of another (c uniform in F/4..3F/4), plus noise of 0.1
    of the features' spread, in float16."""
    rng = np.random.default_rng(seed)
    with open_store(demo) as st:
        every, train = st.load_split("all"), st.load_split("train")
        split_of = dict(zip(map(str, st.video_ids), map(str, st.video_split)))
        manifest = dict(st.manifest)
        caps = [st.load_split(sp) for sp in ("val", "test")]
    ids = [str(v) for v in every.video_ids]
    cap_text = np.concatenate([c.text for c in caps])  # (M, D)
    cap_video = np.concatenate([[ids.index(str(c.video_ids[v])) for v in c.caption_video] for c in caps])
    cap_split = sum(([sp] * len(c.caption_ids) for sp, c in zip(("val", "test"), caps)), [])
    f, d = every.frames.shape[1:]
    spread = float(train.frames[train.frame_mask].std())
    tmp = out.with_name("writing-" + out.name)
    st = create_store(
        tmp,
        manifest=manifest,
        video_ids=ids + [f"distractor{i:06d}" for i in range(n)],
        video_split=[split_of[v] for v in ids] + ["distractor"] * n,
        caption_ids=np.concatenate([c.caption_ids for c in caps]).astype(str),
        caption_video_index=cap_video,
        caption_text=["(a query of the demo)"] * len(cap_video),
        caption_split=cap_split,
        num_frames=f,
        dim=d,
        dtype="float16",
        overwrite=True,
    )
    with st:
        st.write_videos(np.arange(len(ids)), every.frames.astype(np.float16), every.frame_mask, every.frame_mask.sum(1))
        st.write_captions(np.arange(len(cap_video)), cap_text.astype(np.float16))
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            one, two = rng.integers(0, len(train.video_ids), (2, b - a))
            cut = rng.integers(max(1, f // 4), max(2, 3 * f // 4 + 1), b - a)  # 3..9 of 12 frames
            first = np.arange(f)[None] < cut[:, None]  # (B, F)
            fr = np.where(first[..., None], train.frames[one], train.frames[two])  # (B, F, D)
            fr = fr + 0.1 * spread * rng.standard_normal(fr.shape, dtype=np.float32)
            mask = np.where(first, train.frame_mask[one], train.frame_mask[two])  # (B, F)
            st.write_videos(np.arange(len(ids) + a, len(ids) + b), fr.astype(np.float16), mask, mask.sum(1))
    tmp.rename(out)
    return out


def latency(run_dir: Path, store: Path, index: Path, k: int, queries: np.ndarray, exhaustive: int) -> dict:
    """Median ms of one query at a time (the text already encoded): through the index at shortlist ``k`` (first
    stage, store read, re-rank) over ``queries``, and every video scored (the split in RAM) over the first
    ``exhaustive`` of them."""
    out = {}
    for name, idx, sl, n in (("index", index, k, len(queries)), ("exhaustive", None, None, exhaustive)):
        if n == 0:
            continue
        with Searcher(run_dir, store, split="all", index=idx, device="cpu", encoder=False) as s:
            s.rank([""], queries[:1], 10, sl)  # warm: loads the split, builds the engines
            ms = []
            for t in queries[:n]:
                t0 = time.perf_counter()
                s.rank([""], t[None], 10, sl)
                ms.append(1000 * (time.perf_counter() - t0))
        out[name] = float(np.median(ms))
    return out


def recall_at(g: Gallery, ks: list[int], rows: np.ndarray) -> dict[str, float]:
    """The first stage's recall of the match at each K, over ``rows`` (each weighted by one over its video's)."""
    w = video_weights(g.video[rows])
    return {str(k): float(np.average((g.order[rows, :k] == g.gt[rows, None]).any(1), weights=w)) for k in ks}


def index_of(store: Path, run_dir: Path, work: Path) -> tuple[Path, float]:
    out = work / f"{store.stem}.index"
    t0 = time.perf_counter()
    run_index(IndexConfig(features=store, out=out, run=run_dir, split="all", overwrite=True))
    return out, time.perf_counter() - t0


def _print(name: str, g: Gallery, rows: dict, recall: dict, extra: str) -> None:
    print(f"\n## {name}: {len(g.gt)} queries of {len(np.unique(g.video))} videos, gallery of {g.videos:,} videos")
    print(extra)
    print("first stage's recall of the match: " + ", ".join(f"K={k}: {r:.3f}" for k, r in recall.items()))
    print(
        "\n| alpha | method | coverage ± se | holds | refused | mean set size | K (median, min-max) | re-ranks saved |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for alpha, by in rows.items():
        for key, r in by.items():
            cov = "-" if r["coverage"] is None else f"{r['coverage']:.3f} ± {r['se']:.3f}"
            holds = "-" if r["holds"] is None else ("yes" if r["holds"] else "NO")
            size = "-" if r["size"] is None else f"{r['size']:.1f}"
            k = "-" if r["k"] is None else f"{r['k'][0]} ({r['k'][1]}-{r['k'][2]})"
            saved = "-" if r["saved"] is None else f"{r['saved']:.2f}"
            print(f"| {alpha} | {key} | {cov} | {holds} | {r['refused_share']:.2f} | {size} | {k} | {saved} |")


def pooled(name: str, run_dir: Path, store: Path, splits: tuple[str, ...], args, work: Path) -> dict[str, Any]:
    """A gallery whose queries are pooled and halved by video (the demo, the eval store)."""
    t0 = time.perf_counter()
    index, built = index_of(store, run_dir, work)
    g = gallery(name, run_dir, store, splits, index, args.kmax, exhaustive=True)
    grid = [k for k in shortlist_grid(K0, g.videos) if k <= g.order.shape[1]]
    rows = coverage_rows(g, grid, args.splits)
    chosen = rows["0.1"]["K chosen"]["k"][0]
    lat = latency(run_dir, store, index, chosen, _texts(store, splits)[: args.latency_queries], args.latency_queries)
    recall = recall_at(g, grid, np.arange(len(g.gt)))
    extra = (
        f"index built in {built:.1f} s; largest |re-ranked - exhaustive cost| {g.rerank_diff:.2e}; one query "
        f"through the index at K = {chosen} {lat['index']:.1f} ms, exhaustive {lat['exhaustive']:.1f} ms (median)"
    )
    _print(name, g, rows, recall, extra)
    return {
        "rows": rows,
        "recall": recall,
        "latency_ms": lat,
        "index_s": built,
        "seconds": time.perf_counter() - t0,
        "rerank_diff": g.rerank_diff,
        "queries": len(g.gt),
        "videos": g.videos,
    }


def with_distractors(run_dir: Path, demo_store: Path, args, work: Path) -> dict[str, Any]:
    """The demo's videos among ``args.distractors`` others: calibrated on the val captions, measured on the test."""
    t0 = time.perf_counter()
    store = distractor_store(demo_store, work / "distractors.h5", args.distractors)
    made = time.perf_counter() - t0
    index, built = index_of(store, run_dir, work)
    g = gallery("distractors", run_dir, store, ("val", "test"), index, args.kmax, exhaustive=False)
    with open_store(store) as st:
        n_val = len(st.load_split("val").caption_ids)
    cal_rows, ev_rows = np.arange(n_val), np.arange(n_val, len(g.gt))
    grid = [k for k in shortlist_grid(K0, g.videos) if k <= g.order.shape[1]]
    rows = coverage_rows(g, grid, args.splits, cal_rows, ev_rows)
    chosen = rows["0.1"]["K chosen"]["k"][0]
    lat = latency(run_dir, store, index, chosen, _texts(store, ("test",))[: args.latency_queries], 3)
    recall = recall_at(g, grid, ev_rows)
    extra = (
        f"store written in {made:.0f} s, index built in {built:.1f} s; the {len(cal_rows)} val captions calibrate "
        f"(a random half of their videos each of {args.splits} draws), the {len(ev_rows)} test queries are measured; "
        f"one query through the index at K = {chosen}: {lat['index']:.1f} ms, exhaustive {lat['exhaustive']:.0f} ms "
        "(median; exhaustive of 3 queries)"
    )
    _print("distractors", g, rows, recall, extra)
    test = np.arange(n_val, len(g.gt))
    ranks = match_ranks(run_dir, store, index, _texts(store, ("test",)), g.gt[test], args.exhaustive_queries)
    print(
        "the test queries' match in the index's whole ranking: "
        + ", ".join(f"recall at K={k}: {r:.3f}" for k, r in ranks["first_stage_recall"].items())
        + f"; median rank {ranks['first_stage_median_rank'] or 'past every returned video'}. In the exhaustive DAB "
        f"ranking of all "
        f"{g.videos:,} videos (first {args.exhaustive_queries} test queries): ranks "
        + ", ".join(str(r) for r in sorted(ranks["exhaustive_ranks"]))
    )
    return {
        "match_ranks": ranks,
        "rows": rows,
        "recall_test": recall,
        "latency_ms": lat,
        "index_s": built,
        "store_s": made,
        "seconds": time.perf_counter() - t0,
        "queries": len(g.gt),
        "videos": g.videos,
    }


def match_ranks(run_dir: Path, store: Path, index: Path, text: np.ndarray, gt: np.ndarray, exhaustive: int) -> dict:
    """Where the match lands (1 = first): in the index's whole ranking for every query (its recall at any K; past
    the lists an IVF probes it is absent), and in the exhaustive DAB ranking of every video for the first
    ``exhaustive`` queries (whether the distractors outrank it in the run's own cost, which no first stage fixes)."""
    first = np.full(len(text), np.inf)
    with Searcher(run_dir, store, split="all", index=index, device="cpu", encoder=False) as s:
        n = s.num_videos
        for a in range(0, len(text), 16):
            order = s.first_stage_order(text[a : a + 16], n, None)  # (16, <=V)
            hit = order == gt[a : a + 16, None]
            first[a : a + 16] = np.where(hit.any(1), hit.argmax(1) + 1, np.inf)
    run = load_run(run_dir, "cpu")
    with open_store(store) as st:
        every = st.load_split("all")
    with Scorer(run.model, device="cpu") as scorer:
        cost = np.asarray(scorer.score(text[:exhaustive], every.frames, every.frame_mask).cost)  # (n, V)
    own = cost[np.arange(len(cost)), gt[:exhaustive]]
    full = (cost < own[:, None]).sum(1) + 1
    ks = [k for k in (2000, 5000, 10_000, 20_000, 50_000, n) if k <= n]
    return {
        "first_stage_recall": {str(k): float((first <= k).mean()) for k in ks},
        # None where most matches are never returned (JSON holds no Infinity)
        "first_stage_median_rank": float(np.median(first)) if np.isfinite(np.median(first)) else None,
        "exhaustive_ranks": full.tolist(),
    }


def _texts(store: Path, splits: tuple[str, ...]) -> np.ndarray:
    with open_store(store) as st:
        return np.concatenate([np.asarray(st.load_split(sp).text, np.float32) for sp in splits])


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, default=Path("demo_out"), help="the folder `make demo` wrote")
    ap.add_argument("--eval-store", type=Path, default=None, help="default: <demo>/store-eval.h5, built if absent")
    ap.add_argument("--distractors", type=int, default=100_000, help="0: skip the distractor gallery")
    ap.add_argument("--splits", type=int, default=200)
    ap.add_argument("--kmax", type=int, default=2000, help="the largest shortlist re-ranked")
    ap.add_argument("--latency-queries", type=int, default=30)
    ap.add_argument("--work", type=Path, default=Path("bench_data/e2e"))
    ap.add_argument("--exhaustive-queries", type=int, default=10, help="test queries scored against every distractor")
    ap.add_argument(
        "--galleries", nargs="+", choices=["demo", "eval", "distractors"], default=["demo", "eval", "distractors"]
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    run_dir, store = args.demo / "runs" / "dab", args.demo / "store.h5"
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.process_time()
    report: dict[str, Any] = {}
    try:
        if "demo" in args.galleries:
            report["demo"] = pooled("demo", run_dir, store, ("val", "test"), args, args.work)
        ev = args.eval_store or args.demo / "store-eval.h5"
        if "eval" in args.galleries and not ev.exists():
            sys.path.insert(0, str(Path(__file__).parent))
            from claims import eval_store  # benchmarks/claims.py: every caption of the world's val and test videos

            eval_store(args.demo / "world", ev, workers=2)
        if "eval" in args.galleries:
            report["eval"] = pooled("eval", run_dir, ev, ("val", "test"), args, args.work)
        if args.distractors and "distractors" in args.galleries:
            report["distractors"] = with_distractors(run_dir, store, args, args.work)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)  # the distractor store and the indexes
    report["cpu_seconds"] = time.process_time() - t0
    print(f"\n{report['cpu_seconds'] / 60:.1f} CPU-minutes in this process")
    if args.json:  # allow_nan=False: a JSON of dab's holds no NaN or Infinity (a None where a value is missing)
        args.json.write_text(json.dumps(report, indent=1, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
