"""A sharded index against one index over the same videos: the same shortlists? at what build and search cost?

On a store (``--features``; or a generated one of ``--videos`` videos, random clustered features), builds one index
and a sharded one per ``--shards`` with the same factory and search settings (``dab index``'s library calls), then
searches ``--queries`` captions of the store with both at each shortlist size and prints, per shard count: the
share of queries whose shortlist is identical (ids and order), the share of shortlisted videos in common, the
largest score difference, build seconds, and the search's mean ± std milliseconds a query over ``--repeats``
repeats (one process, the candidates side by side).

    python benchmarks/shards.py [--features STORE | --videos 100000] [--shards 2 4] [--factory IVF256,PQ8]
        [--work bench_data/shards] [--queries 200] [--shortlist 100 1000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dab_pipeline.index import build_index, build_sharded_index, load_index, query_vectors  # noqa: E402
from dab_pipeline.store import open_store  # noqa: E402
from dab_pipeline.testing import random_store  # noqa: E402


def compare(one, sharded, qv: np.ndarray, shortlist: int) -> dict:
    """How far the sharded index's shortlists are from the one index's, on the queries ``qv``."""
    rows, scores = one.search(qv, shortlist)
    rows_s, scores_s = sharded.search(qv, shortlist)
    common = np.mean([len(set(a) & set(b)) / max(1, len(set(a))) for a, b in zip(rows, rows_s)])
    finite = np.isfinite(scores) & np.isfinite(scores_s)
    return {
        "identical": float(np.mean((rows == rows_s).all(axis=1))),
        "common": float(common),
        "max_score_diff": float(np.abs(scores[finite] - scores_s[finite]).max()) if finite.any() else 0.0,
    }


def timed(index, qv: np.ndarray, shortlist: int, repeats: int) -> tuple[float, float]:
    """Mean and std over ``repeats`` of the milliseconds a query, one query at a time."""
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for q in qv:
            index.search(q[None], shortlist)
        per.append(1e3 * (time.perf_counter() - t0) / len(qv))
    return float(np.mean(per)), float(np.std(per))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", type=Path, default=None, help="a store (default: generate one)")
    ap.add_argument("--videos", type=int, default=100_000, help="videos of the generated store")
    ap.add_argument("--split", default="test")
    ap.add_argument("--shards", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--factory", default="IVF256,PQ8")
    ap.add_argument("--vector", default="segments")
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--shortlist", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("bench_data/shards"))
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    store = args.features
    if store is None:
        store = args.work / f"store-{args.videos}.h5"
        if not store.exists():
            random_store(store, n_videos=args.videos, caps_per_video=1, dim=32, frames=6, splits=["test"] * args.videos)
    settings = dict(split=args.split, vector=args.vector, factory=args.factory, nprobe=args.nprobe, refine=4)
    out: dict = {"store": str(store), "factory": args.factory, "nprobe": args.nprobe, "rows": []}
    with open_store(store) as st:
        pick = np.unique(np.linspace(0, st.num_captions - 1, args.queries).astype(np.int64))
        qv = query_vectors(args.vector, st.read_captions(pick))
        folders = {1: args.work / "one"}
        seconds = {}
        for n in [1, *args.shards]:
            folder = folders.setdefault(n, args.work / f"shards-{n}")
            shutil.rmtree(folder, ignore_errors=True)
            t0 = time.perf_counter()
            if n == 1:
                build_index(st, folder, **settings)
            else:
                build_sharded_index(st, folder, shards=n, **settings)
            seconds[n] = time.perf_counter() - t0
    one = load_index(folders[1])
    for n in [1, *args.shards]:
        index = load_index(folders[n])
        for k in args.shortlist:
            row = {"shards": n, "shortlist": k, "build_s": round(seconds[n], 1)}
            row |= compare(one, index, qv, k) if n > 1 else {"identical": 1.0, "common": 1.0, "max_score_diff": 0.0}
            row["ms_mean"], row["ms_std"] = timed(index, qv, k, args.repeats)
            out["rows"].append(row)
            print(
                f"shards {n} K {k}: identical {row['identical']:.3f}, common {row['common']:.4f}, "
                f"max score diff {row['max_score_diff']:.2e}, build {row['build_s']} s, "
                f"{row['ms_mean']:.2f} ± {row['ms_std']:.2f} ms a query",
                flush=True,
            )
        index.close()
    return out


if __name__ == "__main__":
    main()
