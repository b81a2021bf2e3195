"""Search at scale: synthetic stores of 10k / 100k / 1M videos, the first stages side by side.

For each N a store of the real layout is written (HDF5, F = 12 frames, D = 512, float16,
ViT-B/32's shape; features are 2,000 random topics plus per-video and per-frame noise,
one caption per 50 videos) into ``--work``, then, in one run:

* the index build (``dab index``'s library call: default vector, auto factory): time,
  size on disk;
* per-query latency, p50 / p99 over ``--queries`` queries (a caption of a random video,
  one query at a time) of
  - brute-force full scoring of every video (the split in RAM; only where affordable),
  - the cosine shortlist over the split in RAM + DAB re-rank (a kept ``Scorer``'s ``score(shortlist=K)``,
    as ``Searcher`` without an index),
  - the FAISS shortlist + DAB re-rank (:class:`Searcher`: reads only the K videos),
  each at K in {100, 1000} for a T' = 8 and a T' = 32 run and an S = 1 (distilled-size)
  run, float32 (``--dtype``); the FAISS path is split into index / store read / scoring;
* with ``--video-terms``, the FAISS path again on an index per run that keeps the run's video terms (``dab index
  --video-terms``): the re-rank reads each shortlisted video's token-branch term instead of computing it;
* the FAISS shortlist's recall of the exact first stage's (the same vectors, Flat) at 100k;
  the recall of the full-scoring top-10 on the world is benchmarks/search_recall.py's;
* peak RSS of the serving process (a fresh process that opens the run, the store and the
  index and answers the queries), against the store's size.

Runs are random-weight models of the real shapes (D = 512): latency depends on shapes,
not on what was learned. Each FAISS-path query is also encoded by ViT-B/32's text tower (random weights,
the same arithmetic), which the serving process holds: its latencies are end to end.

    python benchmarks/search_scale.py [--sizes 10000 100000 1000000] [--work bench_data/scale] [--remove-stores]

The stores stay in ``--work`` for the next run (``--reuse-index``) unless ``--remove-stores``; together they
take about 14 GB: delete the folder when done, a full disk fails whatever runs next on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import resource
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from dab_pipeline.clip_models import encode_queries_short
from dab_pipeline.core.fsutil import sha256_file
from dab_pipeline.index import build_index, load_index, query_vectors
from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.runs.config import TrainConfig
from dab_pipeline.runs.load import load_run
from dab_pipeline.runs.run_folder import RunFolder
from dab_pipeline.runtime.capabilities import resolve_score_dtype
from dab_pipeline.scoring import Scorer
from dab_pipeline.search import Searcher
from dab_pipeline.store import create_store, open_store

F, D, TOPICS, CAPS_EVERY = 12, 512, 2000, 50
RUNS = {"T8": 8, "T32": 32, "S1": 1}


def check_disk(path: Path, n: int, keep_free_gb: float) -> None:
    """Refuse a store that would leave less than ``keep_free_gb`` on its disk.

    The 1M store is 12 GB: a disk filled by a benchmark fails whatever runs next on the machine
    (a CI's pip install did, here), so the benchmark stops first and says how to free space.
    """
    need = n * F * D * 2 * 1.05  # float16 frames, plus masks, captions and HDF5 overhead
    free = shutil.disk_usage(path.parent).free
    if free - need < keep_free_gb * 1e9:
        raise SystemExit(
            f"{path}: writing {n:,} videos needs {need / 1e9:.1f} GB and would leave "
            f"{(free - need) / 1e9:.1f} GB free on its disk (--keep-free-gb {keep_free_gb:g}); "
            f"remove old stores under {path.parent.parent} or pass a --work on a larger disk"
        )


def write_store(path: Path, n: int, seed: int = 0, chunk: int = 16384, manifest: dict | None = None) -> float:
    """The synthetic store of ``n`` videos (``manifest``: its CLIP's record, where a server must encode queries)."""
    if path.exists():
        return 0.0
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((TOPICS, D)).astype(np.float32)
    topic = rng.integers(0, TOPICS, n)
    vids = [f"s{i:07d}" for i in range(n)]
    cap_v = np.arange(0, n, CAPS_EVERY)
    tmp = path.with_name("writing-" + path.name)
    st = create_store(
        tmp,
        manifest={"model": "synthetic", "clip": {"embed_dim": D}, "frames": F, **(manifest or {})},
        video_ids=vids,
        video_split=["test"] * n,
        caption_ids=[f"{vids[v]}#0" for v in cap_v],
        caption_video_index=cap_v,
        caption_text=["synthetic"] * len(cap_v),
        caption_split=["test"] * len(cap_v),
        num_frames=F,
        dim=D,
        dtype="float16",
        overwrite=True,
    )
    with st:
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            centre = topics[topic[a:b]] + 0.7 * rng.standard_normal((b - a, D), dtype=np.float32)  # (B, D)
            fr = centre[:, None] + 0.7 * rng.standard_normal((b - a, F, D), dtype=np.float32)  # (B, F, D)
            st.write_videos(np.arange(a, b), fr.astype(np.float16), np.ones((b - a, F), bool), np.full(b - a, F))
        cap = topics[topic[cap_v]] + 0.7 * rng.standard_normal((len(cap_v), D), dtype=np.float32)
        st.write_captions(np.arange(len(cap_v)), cap.astype(np.float16))
    os.rename(tmp, path)
    return time.perf_counter() - t0


def make_runs(root: Path, store: Path) -> dict[str, Path]:
    out = {}
    for name, steps in RUNS.items():
        path = root / f"run-{name}"
        out[name] = path
        if (path / "checkpoints" / "best.pt").exists():
            continue
        cfg = TrainConfig(features=store, out=path, model=ModelConfig(embed_dim=D, variant="dab", steps=steps))
        torch.manual_seed(0)
        model = DABModel(cfg.model)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        run = RunFolder(path)
        run.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        run.save_config(cfg)
        run.save_checkpoint(RunFolder.BEST, {"model": model.state_dict(), "heads": None, "epoch": 1})
    return out


def terms_index(store: Path, index: Path, root: Path, name: str, run_dir: Path) -> Path:
    """The index of ``index``'s vector and factory with ``run_dir``'s video terms (built once, kept beside it)."""
    out = root / f"index-terms-{name}"
    if not (out / "index.json").is_file():
        meta = load_index(index).meta
        loaded = load_run(run_dir, "cpu")
        run = {"path": str(run_dir), "checkpoint_sha256": sha256_file(loaded.checkpoint)}
        t0 = time.perf_counter()
        with open_store(store) as st:
            build_index(
                st, out, split="test", vector=meta.vector, factory=meta.factory, model=loaded.model, run=run, terms=True
            )
        print(f"{name}: an index with its video terms built in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def queries(store: Path, m: int, seed: int = 1) -> np.ndarray:
    with open_store(store) as st:
        pick = np.sort(np.random.default_rng(seed).choice(st.num_captions, min(m, st.num_captions), replace=False))
        return st.read_captions(pick)  # (M, D)


def pct(ms: list[float]) -> str:
    return f"{np.percentile(ms, 50):8.1f} {np.percentile(ms, 99):8.1f}"


def timed_queries(fn, text: np.ndarray) -> list[float]:
    fn(text[:1])  # warm-up
    out = []
    for i in range(len(text)):
        t0 = time.perf_counter()
        fn(text[i : i + 1])
        out.append(1000 * (time.perf_counter() - t0))
    return out


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: per address space, so a spawned child does not inherit its
    parent's peak the way getrusage's ru_maxrss does across fork and exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def serve_child(args: tuple) -> dict:
    """In a fresh process: what `dab serve` holds (run, store, index), the FAISS path's latencies, peak RSS."""
    import open_clip

    run, store, index, text, ks, dtype = args
    torch.set_num_threads(2)
    rows = {}
    # what `dab serve` holds besides: ViT-B/32's text tower (random weights; the vision tower is dropped, as
    # Searcher does), and every query is encoded with it before the search (its features are then replaced
    # by a stored caption's, which the random tower cannot give)
    clip = open_clip.create_model("ViT-B-32", pretrained=None).eval()
    clip.visual = None
    bundle = SimpleNamespace(
        model=clip,
        tokenizer=open_clip.get_tokenizer("ViT-B-32"),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
    )  # the parts of a ClipBundle the encoder reads

    def answer(s, q: np.ndarray, k: int, t: dict) -> None:
        t0 = time.perf_counter()
        encode_queries_short(bundle, ["a person rides a bicycle down a hill"])  # as Searcher.encode
        t["encode"] = t.get("encode", 0.0) + time.perf_counter() - t0
        s.rank(["q"], q, k=10, shortlist=k, timings=t)

    with Searcher(run, store, index=index, device="cpu", dtype=dtype, encoder=False) as s:
        rss_loaded = peak_rss_mb()
        for k in ks:
            t: dict = {}
            ms = timed_queries(lambda q: answer(s, q, k, t), text)
            n = len(text) + 1
            rows[k] = {"ms": ms, "parts": {p: 1000 * v / n for p, v in t.items()}}
    return {"rows": rows, "rss_loaded_mb": rss_loaded, "rss_peak_mb": peak_rss_mb()}


def in_ram_paths(
    run_dirs: dict, store: Path, text: np.ndarray, ks: list[int], n: int, dtype: str, full_max: int
) -> list[str]:
    lines = []
    with open_store(store) as st:
        feats = st.load_split("test")
    for name, rd in run_dirs.items():
        if n > full_max and name != "T8":
            continue  # the brute-force paths take seconds to minutes a query here: T' = 8 tells the story
        scorer = Scorer(load_run(rd, "cpu").model, dtype=dtype)  # kept between queries, as Searcher keeps it
        if n <= full_max:
            ms = timed_queries(lambda q: scorer.score(q, feats.frames, feats.frame_mask, k=10), text)
            lines.append(f"{n:>9,} {name:4} {'full scoring':28} {'-':>5} {pct(ms)}")
        for k in ks:
            ms = timed_queries(lambda q: scorer.score(q, feats.frames, feats.frame_mask, k=10, shortlist=k), text)
            lines.append(f"{n:>9,} {name:4} {'cosine shortlist + DAB':28} {k:>5} {pct(ms)}")
    return lines


def ann_recall(store: Path, index: Path, work: Path, text: np.ndarray, k: int = 100) -> dict[str, float]:
    """The index's top-k against the exact (Flat) search of the same vectors, with and without the re-scoring
    on exact vectors: the share of the exact top-k kept, and of the exact top-10."""
    exact = work / "index-exact"
    a = load_index(index)
    meta = a.meta
    old = exact / "index.json"
    if not (old.is_file() and json.loads(old.read_text())["store"]["fingerprint"] == meta.store["fingerprint"]):
        with open_store(store) as st:  # the same store as last time: its exact index is reused
            build_index(st, exact, split="test", vector=meta.vector, factory="Flat", overwrite=True)
    e = load_index(exact)
    qv = query_vectors(meta.vector, text)
    re_, _ = e.search(qv, k)
    out = {}
    for label, refine in (("refined", meta.refine), ("codes only", 0)):
        a.meta.refine = refine
        ra, _ = a.search(qv, k)
        out[f"top{k} {label}"] = float(np.mean([len(np.intersect1d(x, y)) / k for x, y in zip(ra, re_)]))
        out[f"top10 {label}"] = float(np.mean([len(np.intersect1d(x, y[:10])) / 10 for x, y in zip(ra, re_)]))
    return out


def encoder_ms(repeats: int = 20) -> dict[str, float]:
    """p50 ms of one query through ViT-B/32's text tower (random weights: the same arithmetic, no download),
    on the full 77-token context and on the tokens up to EOT (what Searcher.encode runs)."""
    import open_clip

    model = open_clip.create_model("ViT-B-32", pretrained=None).eval()
    tok = open_clip.get_tokenizer("ViT-B-32")
    bundle = SimpleNamespace(model=model, tokenizer=tok, device=torch.device("cpu"), autocast=contextlib.nullcontext)
    out = {}
    for name, fn in (
        ("full context", lambda q: model.encode_text(tok(q))),
        ("up to EOT", lambda q: encode_queries_short(bundle, q)),
    ):
        ms = []
        with torch.no_grad():
            for i in range(repeats + 1):
                t0 = time.perf_counter()
                fn([f"a person rides a bicycle down a hill {i}"])
                ms.append(1000 * (time.perf_counter() - t0))
        out[name] = float(np.median(ms[1:]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--work", type=Path, default=Path("bench_data/scale"))
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--ks", nargs="+", type=int, default=[100, 1000])
    ap.add_argument("--dtype", default="auto", help="float32, bfloat16 or auto (bf16 where the CPU has it)")
    ap.add_argument("--ram-max", type=int, default=100_000, help="largest N whose split is loaded in RAM")
    ap.add_argument("--full-max", type=int, default=10_000, help="largest N scored in full")
    ap.add_argument("--ram-queries", type=int, default=5, help="queries timed on the in-RAM paths (slow)")
    ap.add_argument(
        "--reuse-index",
        action="store_true",
        help="keep an index built by an earlier run (its build time is the one it recorded)",
    )
    ap.add_argument(
        "--keep-free-gb",
        type=float,
        default=10.0,
        help="refuse to write a store that would leave less than this much free disk",
    )
    ap.add_argument(
        "--video-terms",
        action="store_true",
        help="also time the FAISS path on an index per run with its video terms (dab index --video-terms)",
    )
    ap.add_argument(
        "--remove-stores", action="store_true", help="delete each N's folder (store, index, runs) once it is measured"
    )
    args = ap.parse_args()
    torch.set_num_threads(2)
    choice = resolve_score_dtype(args.dtype, torch.device("cpu"))
    args.dtype = choice.dtype
    print(f"scoring dtype {args.dtype}" + (f" ({choice.warning})" if choice.warning else ""), flush=True)
    report: dict = {"sizes": {}, "encode_ms": encoder_ms()}
    print(
        "query encoding (ViT-B/32 text tower, 2 threads), p50: "
        + ", ".join(f"{k} {v:.1f} ms" for k, v in report["encode_ms"].items()),
        flush=True,
    )
    lines = [f"{'videos':>9} {'run':4} {'path':28} {'K':>5} {'p50 ms':>8} {'p99 ms':>8}"]
    for n in args.sizes:
        root = args.work / f"n{n}"
        root.mkdir(parents=True, exist_ok=True)
        store = root / "store.h5"
        if not store.exists():
            check_disk(store, n, args.keep_free_gb)
        t_store = write_store(store, n)
        runs = make_runs(root, store)
        text = queries(store, args.queries)
        index = root / "index"
        t0 = time.perf_counter()
        meta = load_index(index).meta if args.reuse_index and (index / "index.json").is_file() else None
        if meta is not None:  # the fingerprint is checked by every Searcher below
            t_build = float(meta.build["seconds"])
        else:
            with open_store(store) as st:
                meta = build_index(st, index, split="test", overwrite=True)
            t_build = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in index.iterdir())
        info = {
            "store_gb": store.stat().st_size / 1e9,
            "store_write_s": t_store,
            "build_s": t_build,
            "factory": meta.factory,
            "vectors": meta.count * meta.per_video,
            "index_mb": size / 1e6,
        }
        print(
            f"N={n:,}: store {info['store_gb']:.2f} GB (written in {t_store:.0f} s), index {meta.factory} over "
            f"{info['vectors']:,} vectors built in {t_build:.1f} s, {info['index_mb']:.1f} MB",
            flush=True,
        )
        if n <= args.ram_max:
            m = args.ram_queries if n <= args.full_max else 2
            lines += in_ram_paths(runs, store, text[:m], args.ks, n, args.dtype, args.full_max)
            print("\n".join(lines[-9:]), flush=True)
        served = [(name, rd, index, "FAISS shortlist + DAB") for name, rd in runs.items()]
        if args.video_terms:
            served += [
                (name, rd, terms_index(store, index, root, name, rd), "  with video terms") for name, rd in runs.items()
            ]
        with mp.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:  # a fresh process a run
            for name, rd, idx, label in served:
                res = pool.apply(serve_child, ((rd, store, idx, text, args.ks, args.dtype),))
                for k, r in res["rows"].items():
                    parts = ", ".join(f"{p} {v:.1f}" for p, v in r["parts"].items())
                    lines.append(f"{n:>9,} {name:4} {label:28} {k:>5} {pct(r['ms'])}   ({parts})")
                info[f"rss_{name}_mb"] = res["rss_peak_mb"]
                info[f"rss_{name}_loaded_mb"] = res["rss_loaded_mb"]
                print(
                    lines[-1],
                    f"peak RSS {res['rss_peak_mb']:.0f} MB ({res['rss_loaded_mb']:.0f} MB once loaded)",
                    flush=True,
                )
        if meta.factory != "Flat":
            info["ann_recall"] = ann_recall(store, index, root, text)
            print(
                f"N={n:,}: the index's top 100 against the exact first stage's (same vectors, Flat): "
                + ", ".join(f"{key} {100 * v:.1f} %" for key, v in info["ann_recall"].items()),
                flush=True,
            )
        report["sizes"][n] = info
        if args.remove_stores:
            shutil.rmtree(root)
    print("\n".join(lines))
    print(json.dumps(report, indent=1))
    (args.work / "search_scale.json").write_text(json.dumps({"report": report, "lines": lines}, indent=1))


if __name__ == "__main__":
    main()
