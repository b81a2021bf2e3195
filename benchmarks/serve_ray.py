"""`dab serve --ray` at 100k videos: throughput and p50/p99 for 1, 2 and 4 re-rank replicas on one machine, beside
`dab serve` (one process), and the per-shard figures docs/search.md's sizing table is computed from (issue 49).

In ``--work`` (kept for the next run unless ``--remove``): a store of the real layout (search_scale.py's: HDF5,
F = 12, D = 512, float16, 2,000 topics, a caption every 50 videos) whose CLIP is ViT-B/32 with random weights saved
to a local file (every query is encoded by the real text tower: its cost is the shapes', not the weights'), a
random-weight T' = 8 dab run, and an index of ``--shards`` shards (``dab index --shards``: the default vector and
factory). Then:

* **per shard**, in a fresh process: the folder's bytes, the RSS a shard's service adds once loaded, and the time
  it takes to answer a batch of 16 queries (candidates and their exact scores, as a shard deployment does);
* **the load**: each candidate started as a real server on a free loopback port (`dab serve` with ``--threads``
  = the machine's cores; `dab serve --ray --replicas R` with ``--threads max(1, cores // R)``, so R replicas share
  the same cores), warmed up, then ``--clients`` kept-alive clients released together, each sending ``--queries``
  queries (serve_load.py's workload), ``--rounds`` times in alternating order, each round a fresh start. Printed
  per candidate: answered queries a second, p50 and p99 (mean ± std over the rounds), the ratio to `dab serve`
  round by round, and whether every query got `dab serve`'s hits;
* **the sizing inputs**: store and index bytes a video, shard RAM a video, the re-rank's queries a second a core.

    python benchmarks/serve_ray.py [--videos 100000] [--shards 2] [--replicas 1,2,4] [--clients 16] [--queries 15]
        [--rounds 2] [--work bench_data/serve_ray] [--remove] [--shards-only]

Needs the ray extra (pip install 'dab-pipeline[ray]'). The store takes 1.2 GB at 100k videos.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import search_scale  # noqa: E402
import serve_load  # noqa: E402

from dab_pipeline.index import build_sharded_index  # noqa: E402
from dab_pipeline.store import open_store  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--videos", type=int, default=100_000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--replicas", default="1,2,4", help="re-rank replicas of each --ray candidate, comma-separated")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--queries", type=int, default=15, help="queries a client sends a round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--work", type=Path, default=Path("bench_data/serve_ray"))
    ap.add_argument("--remove", action="store_true", help="delete --work at the end")
    ap.add_argument("--shards-only", action="store_true", help="only the per-shard figures (a large shard's cost)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a request may take")
    return ap.parse_args(argv)


def world(work: Path, n: int, shards: int) -> dict:
    """The store (with its CLIP's weights file), the run and the sharded index, each made once."""
    import open_clip
    import torch

    from dab_pipeline.core.fsutil import sha256_file

    work.mkdir(parents=True, exist_ok=True)
    weights = work / "vit-b-32-random.pt"
    if not weights.is_file():
        torch.manual_seed(0)
        torch.save(open_clip.create_model("ViT-B-32", pretrained=None).state_dict(), weights)
    store = work / f"store-{n}.h5"
    manifest = {"model": "ViT-B-32", "pretrained": str(weights), "weights_sha256": sha256_file(weights)}
    took = search_scale.write_store(store, n, manifest=manifest)
    if took:
        print(f"store of {n:,} videos written in {took:.0f} s", flush=True)
    run = search_scale.make_runs(work, store)["T8"]
    index = work / f"index-{shards}"
    if not (index / "shards.json").is_file() or not all((index / f"shard-{i:03d}" / "index.json").is_file()
                                                         for i in range(shards)):  # fmt: skip
        t0 = time.perf_counter()
        with open_store(store) as st:
            build_sharded_index(st, index, shards=shards, split="test", overwrite=True)
        print(f"index of {shards} shards built in {time.perf_counter() - t0:.0f} s", flush=True)
    return {"store": store, "run": run, "index": index}


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(ln.split()[1]) / 1024 for ln in fh if ln.startswith("VmRSS:"))


def shard_child(args: tuple) -> dict:
    """In a fresh process: one shard's service loaded, its RSS, and a batch of 16 queries answered 10 times."""
    folder, queries, n_cand = args
    import faiss

    from dab_pipeline.index.served import ShardService

    faiss.omp_set_num_threads(1)
    before = _rss_mb()
    service = ShardService(folder)
    loaded = _rss_mb() - before
    exact = bool(service.index.meta.refine)
    service.candidates(queries, n_cand, None, None, exact)  # warm-up
    ms = []
    for _ in range(10):
        t0 = time.perf_counter()
        service.candidates(queries, n_cand, None, None, exact)
        ms.append(1000 * (time.perf_counter() - t0))
    return {"rss_mb": loaded, "ms": ms, "videos": service.index.meta.count, "factory": service.index.meta.factory}


def per_shard(w: dict, shards: int) -> list[dict]:
    from dab_pipeline.index import query_vectors
    from dab_pipeline.index.served import shard_folders

    with open_store(w["store"]) as st:
        pick = np.random.default_rng(1).choice(st.num_captions, 16, replace=False)
        meta = json.loads((shard_folders(w["index"])[0] / "index.json").read_text())
        q = query_vectors(meta["vector"], st.read_captions(np.sort(pick)))
    out = []
    ctx = mp.get_context("spawn")
    for folder in shard_folders(w["index"]):
        with ctx.Pool(1) as pool:
            r = pool.apply(shard_child, ((str(folder), q, 100 * max(1, int(meta.get("refine") or 1))),))
        r["bytes"] = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        out.append(r)
        print(
            f"shard {folder.name}: {r['videos']:,} videos ({r['factory']}), {r['bytes'] / 2**20:.0f} MiB on disk, "
            f"{r['rss_mb']:.0f} MiB RSS loaded, a batch of 16 queries {np.mean(r['ms']):.1f} ± {np.std(r['ms']):.1f} ms",
            flush=True,
        )
    return out


def candidates(args: argparse.Namespace, cores: int) -> dict[str, tuple[tuple[str, ...], int]]:
    """name -> (dab serve's extra options, --threads)."""
    out = {"dab serve": ((), cores)}
    for r in (int(x) for x in args.replicas.split(",")):
        out[f"--ray --replicas {r}"] = (("--ray", "--replicas", str(r)), max(1, cores // r))
    return out


def one_round(name: str, extra: tuple, threads: int, w: dict, args: argparse.Namespace, load: list) -> dict:
    sargs = argparse.Namespace(
        run=w["run"], features=w["store"], index=w["index"], threads=threads, dtype="float32", wait_ms=5.0
    )
    t0 = time.perf_counter()
    server = serve_load.Server(sargs, args.max_batch, extra)
    try:
        started = time.perf_counter() - t0
        for text, k in load[0][:8]:  # warm-up: the engines built, the first reads done
            server.get(f"/search?q={urllib.parse.quote_plus(text)}&k={k}")
        res = serve_load.run_load(server, load, args.timeout)
    finally:
        server.stop()
    res["started_s"] = started
    print(
        f"  {name:<22} (--threads {threads}): started in {started:.0f} s, {res['answered']} answered, "
        f"{res['qps']:.1f} queries/s, p50 {res['p50']:.0f} ms, p99 {res['p99']:.0f} ms"
        + (f", errors: {res['errors'][:2]}" if res["errors"] else ""),
        flush=True,
    )
    return res


def report(results: dict[str, list[dict]]) -> None:
    base = results["dab serve"]
    print("\ncandidate                queries/s        p50 ms          p99 ms          queries/s against dab serve")
    for name, rs in results.items():
        ratio = [r["qps"] / b["qps"] for r, b in zip(rs, base)]
        print(
            f"{name:<24} {serve_load.mean_std([r['qps'] for r in rs])} "
            f"{serve_load.mean_std([r['p50'] for r in rs], 0)} {serve_load.mean_std([r['p99'] for r in rs], 0)} "
            f"x{np.mean(ratio):.2f} ± {np.std(ratio):.2f}"
        )
    for name, rs in results.items():
        if name != "dab serve":
            print(f"{name}: {serve_load.compare_answers(base[0]['answers'], rs[0]['answers'])}")


def sizing_inputs(w: dict, shards: list[dict], results: dict[str, list[dict]], cores: int, n: int) -> None:
    store_b = w["store"].stat().st_size / n
    index_b = sum(s["bytes"] for s in shards) / n
    ram_b = sum(s["rss_mb"] for s in shards) * 2**20 / n
    best = max(results.items(), key=lambda kv: np.mean([r["qps"] for r in kv[1]]))
    print(
        f"\nsizing inputs: store {store_b:,.0f} B a video, index {index_b:,.0f} B a video, a shard's RAM "
        f"{ram_b:,.0f} B a video; a shard answers 16 queries in {np.mean([np.mean(s['ms']) for s in shards]):.1f} ms "
        f"({n // len(shards):,} videos); the best candidate ({best[0]}) {np.mean([r['qps'] for r in best[1]]):.1f} "
        f"queries/s on {cores} cores, {np.mean([r['qps'] for r in best[1]]) / cores:.1f} a core"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cores = os.cpu_count() or 1
    print(f"{args.videos:,} videos, {args.shards} shards, {args.clients} clients x {args.queries} queries, loopback, "
          f"--max-batch {args.max_batch}, float32; {serve_load.machine()}", flush=True)  # fmt: skip
    w = world(args.work, args.videos, args.shards)
    shards = per_shard(w, args.shards)
    if args.shards_only:
        return 0
    load = serve_load.workload(w["store"], args.clients, args.queries)
    cands = candidates(args, cores)
    results: dict[str, list[dict]] = {name: [] for name in cands}
    try:
        for r in range(args.rounds):
            print(f"round {r + 1}", flush=True)
            for name in list(cands) if r % 2 == 0 else list(cands)[::-1]:
                extra, threads = cands[name]
                results[name].append(one_round(name, extra, threads, w, args, load))
        report(results)
        sizing_inputs(w, shards, results, cores, args.videos)
        print(f"  load average at the end: {os.getloadavg()[0]:.1f}")
    finally:
        if args.remove:
            shutil.rmtree(args.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
