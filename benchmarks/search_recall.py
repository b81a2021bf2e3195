"""Which vector should the search's first stage index? Shortlist recall on the world.

For each run (the benchmark world's dab runs, one per seed) the run's own test cost
matrix (``costs_test.h5``: every test caption query against every test video, the
full DAB cost) gives each query's true top-10. A first stage keeps a shortlist of K
videos; its recall is the share of those 10 inside the shortlist (and the share of
queries whose top-1 is inside). Printed for each vector kind of
:mod:`dab_pipeline.index.vectors` and K, mean +- std over the runs, plus the exact
(Flat) index against approximate FAISS factories on the default vector (at this
size, 2,000 vectors, only a sanity check of the approximation: the 1M-video
benchmark, benchmarks/search_scale.py, measures the index against exact search).

    python benchmarks/search_recall.py [--runs bench_data/runs-benchmark/dab-T8-seed{1,2,3}]
        [--store bench_data/store-benchmark.h5] [--ks 10 20 50 100]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from dab_pipeline.index import DEFAULT_VECTOR, VECTOR_KINDS, build_index, load_index, query_vectors
from dab_pipeline.runs.costfile import read_costs
from dab_pipeline.runs.load import load_run
from dab_pipeline.scoring import first_stage
from dab_pipeline.store import open_store

DEFAULT_RUNS = [f"bench_data/runs-benchmark/dab-T8-seed{s}" for s in (1, 2, 3)]


def full_top(cost: np.ndarray, k: int = 10) -> np.ndarray:
    return np.argsort(cost, axis=1, kind="stable")[:, :k]  # (Q, k) column indices


def recall(short: np.ndarray, top: np.ndarray) -> tuple[float, float]:
    """(share of each query's true top-k inside its shortlist, share of queries whose top-1 is inside)."""
    hit = (short[:, :, None] == top[:, None, :]).any(axis=1)  # (Q, k)
    return float(hit.mean()), float(hit[:, 0].mean())


def run_recall(
    run_dir: Path, store_path: Path, ks: list[int], factories: list[tuple[str, int]], work: Path
) -> dict[tuple[str, str, int], tuple[float, float]]:
    run = load_run(run_dir, "cpu")
    cm = read_costs(run_dir / "costs_test.h5")
    cost = cm.to_cost()  # (Q, V) the run's full DAB costs
    top = full_top(cost)
    out = {}
    with open_store(store_path) as st:
        col_of = {str(v): j for j, v in enumerate(cm.video_ids)}
        cap_row = {str(c): i for i, c in enumerate(st.caption_ids)}
        text = st.read_captions([cap_row[str(q)] for q in cm.query_ids])  # (Q, D)
        plans = [(kind, "Flat", 1) for kind in VECTOR_KINDS.names()] + [(DEFAULT_VECTOR, f, p) for f, p in factories]
        for kind, factory, nprobe in plans:
            where = work / f"{run_dir.name}-{kind}-{factory.replace(',', '_')}"
            build_index(
                st, where, split="test", vector=kind, model=run.model, factory=factory, nprobe=nprobe, overwrite=True
            )
            idx = load_index(where)
            qv = query_vectors(kind, text, run.model)
            for k in ks:
                rows = first_stage(qv, idx, k)  # (Q, k) store rows, as dab search's first stage
                cols = np.vectorize(lambda r: col_of.get(str(st.video_ids[r]), -1) if r >= 0 else -1)(rows)
                label = factory if factory == "Flat" else f"{factory} nprobe={nprobe}"
                out[(kind, label, k)] = recall(cols, top)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", type=Path, default=[Path(r) for r in DEFAULT_RUNS])
    ap.add_argument("--store", type=Path, default=Path("bench_data/store-benchmark.h5"))
    ap.add_argument("--ks", nargs="+", type=int, default=[10, 20, 50, 100])
    args = ap.parse_args()
    factories = [("IVF32,SQ8", 8), ("IVF32,PQ8", 8), ("HNSW32", 1)]  # 2,000 segment vectors
    per_run = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in args.runs:
            per_run.append(run_recall(r, args.store, args.ks, factories, Path(tmp)))
    print(
        f"shortlist recall of the full-scoring top-10 (top-1 in brackets), {len(per_run)} runs, "
        f"{args.store}, test split"
    )
    print(f"{'vector':8} {'index':22} " + " ".join(f"{'K=' + str(k):>22}" for k in args.ks))
    for key in dict.fromkeys((kind, label) for kind, label, _ in per_run[0]):
        cells = []
        for k in args.ks:
            vals = np.array([pr[(*key, k)] for pr in per_run])  # (runs, 2)
            m, s = 100 * vals.mean(0), 100 * vals.std(0)
            cells.append(f"{m[0]:5.1f} ± {s[0]:3.1f} ({m[1]:5.1f})")
        print(f"{key[0]:8} {key[1]:22} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
