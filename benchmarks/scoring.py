"""All-pairs scoring speed: the plain reference against the engine, in one process.

Builds the paper's default model (D = 512, drift 1024, F = 12 frames) with random
weights (every parameter perturbed, so the zero-initialised drift output really
moves the bridge) and random CLIP-like features, then for each T' prints

* pairs/s of ``score_all_reference`` (paper chunks 128 x 512) and of the engine
  (``Scorer.score``) in float32 and bfloat16, and the engine's speed-up over the reference;
* GFLOP/s two ways: **exec**, the multiply-adds each implementation actually runs
  (``reference_macs`` / ``engine_macs``: per text + per video + per pair), and
  **model**, the paper's count (``bridge_macs_per_pair_step`` x T' per pair plus
  pooling and heads), the same numerator for every row;
* exec GFLOP/s as a share of this machine's matmul rate in the dtype used, two ways:
  **%best**, over the best rate of ``(4096, 1024) x (1024, 1024)`` products (the
  bridge's own shape) seen anywhere in the session; **%paired**, over the rate of
  bare products run between the row's own tiles (:class:`Paired`), which is the
  stable figure on a shared machine whose matmul rate swings 2-3x within seconds;
* the same call made a second time in the child on the same Scorer (**warm p/s**,
  **%best w**): the first call of a process also pays for building the engine, oneDNN
  building its kernels for each new shape and faulting in its buffers (~30k page faults
  at 256 x 256), which a long grid or a server amortises; the main columns stay the
  first call's;
* peak memory (CPU: growth of the peak resident set over the pre-run one; CUDA: peak
  allocated) -- every measurement runs in a fresh child process, so no row inherits
  another's allocator or cache state;
* max relative cost error against the reference and the share of queries whose
  top-1 video agrees;
* shortlist mode (``--shortlist K``, default V/10): the share of exact top-1 /
  top-10 videos it keeps and its speed-up over exact mode.  On a random model the
  cosine first stage knows nothing of the DAB cost, so expect ~K/V there; use
  ``--run`` for a meaningful figure.

Sizes: 256 x 256 pairs at T' = 8 on CPU (``--full``: T' = 8 and 32; ``--large``: 1000 x
1000); on a CUDA device 1000 x 1000 at T' = 32.  The default run takes a few minutes on 2
cores; ``--full`` about 3x longer.

bf16 rows run only where the device multiplies bf16 natively
(:mod:`dab_pipeline.runtime.capabilities`: AMX / AVX512-BF16 with oneDNN on CPU, compute
capability 8.0+ on CUDA): elsewhere they are skipped with the reason (emulated bf16 ran
~100x slower than float32 on an AVX2 CPU); ``--force-bf16`` runs them anyway.  The fused
CPU kernels are built before any timing starts, and every row says which products and
kernels it used.  ``--run RUN --features STORE`` scores a
trained run's split in float32 and bfloat16 and prints the retrieval metrics and
their differences (the bf16 target: R@1 / R@5 / MnR within 0.3).

``--covariance`` (issue 36) adds, per T', a section timed in this process (rows interleaved, ``max(--repeats, 3)``
repeats, mean +- std): ``prob`` and ``dab`` at the same D and T', whole-model all-pairs scoring (pooling, heads,
bridge, cost) with ``diag`` through the reference path a non-diagonal model takes
(:func:`~dab_pipeline.scoring.covariance.score_nondiag`: ``score_all_reference`` in ``covariance_chunks`` blocks)
and through the engine (float32, and bf16 where native), then ``lowrank:4``, ``lowrank:8``, ``mixture:2``,
``mixture:4`` through ``Scorer.score``; pairs/s and each row's time per pair over the diag reference's and the
float32 engine's (per repeat); then a per-pair breakdown of ``model.pair_terms``' stages (pooling, heads, factor
head, token term, bridge, cost, a mixture's moments) on one block of the Scorer's size, checked against
``model.pair_costs``.  128 x 128 pairs on CPU (``--covariance-pairs``), about 10 minutes at T' = 8 on one
thread (``--threads 1``, steadier on a shared machine); ``--covariance only`` skips the usual table.

``--one-query K [K ...]`` (issue 38) adds, per T', a section timed in this process (interleaved, ``max(--repeats, 3)``
repeats, mean +- std): per dtype, the grid (Q x V, as above) through a kept ``Scorer.score``, then one query's re-rank
of K videos through ``Scorer.score_query`` (what ``dab search`` / ``dab serve`` run on a shortlist; ~2,000 pairs of
different queries a repeat) and, beside it, the model's own path that ``score_query`` ran before (``scoring.score_query``,
under autocast in bf16); each prints ``one query x K: N pairs/s, P % of the grid rate``, the share taken repeat by
repeat. On a shared machine ``--threads 1`` keeps another job's thread from stalling every parallel region.

    python benchmarks/scoring.py [--full] [--large] [--steps 8 32] [--pairs Q V] [--device auto] [--repeats 3]
        [--dtypes float32 bfloat16] [--force-bf16] [--no-reference] [--shortlist K]
        [--run RUN --features STORE [--split test]]
        [--covariance [only]] [--covariance-pairs Q V] [--one-query K [K ...]] [--threads N]

The CPU of a shared machine is noisy: ``--repeats N`` runs every row N times,
interleaved, and keeps the fastest.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import subprocess
import time
from typing import Any, Callable

import numpy as np
import torch

from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.model.costs import kl_diag_gaussian
from dab_pipeline.model.covariance import kl_lowrank_gaussian, mixture_moments, soft_min_kl
from dab_pipeline.scoring import Scorer, engine_macs, reference_macs, score_all, score_all_reference, score_query
from dab_pipeline.scoring.covariance import covariance_chunks
from dab_pipeline.scoring.engines.base import engine_covers

NUM_FRAMES = 12


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown CPU"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(dtype: torch.dtype, device: torch.device, repeats: int = 5) -> float:
    """Best GFLOP/s of (rows, 1024) x (1024, 1024) products, the bridge's own shape."""
    rows = 65536 if device.type == "cuda" else 4096
    a = torch.randn(rows, 1024, device=device).to(dtype)
    w = torch.randn(1024, 1024, device=device).to(dtype)
    out = torch.empty(rows, 1024, device=device, dtype=dtype)
    n = 50 if device.type == "cuda" else 10
    for _ in range(3):
        torch.mm(a, w, out=out)
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        for _ in range(n):
            torch.mm(a, w, out=out)
        sync(device)
        best = min(best, (time.perf_counter() - t) / n)
    return 2.0 * rows * 1024 * 1024 / best / 1e9


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def random_model(steps: int, seed: int = 0, variant: str = "dab", covariance: str = "diag") -> DABModel:
    torch.manual_seed(seed)
    model = DABModel(ModelConfig(steps=steps, variant=variant, covariance=covariance))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return model.eval()


def random_features(n_q: int, n_v: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CLIP-like features: a shared direction (the modality gap) plus noise; 10% of videos are short (padded)."""
    gen = torch.Generator().manual_seed(seed)
    d = 512
    common = torch.randn(d, generator=gen)
    text = 0.3 * common + torch.randn(n_q, d, generator=gen)  # (Q, D)
    frames = 0.3 * common + torch.randn(n_v, NUM_FRAMES, d, generator=gen)  # (V, F, D)
    mask = torch.ones(n_v, NUM_FRAMES, dtype=torch.bool)
    short = torch.randperm(n_v, generator=gen)[: max(1, n_v // 10)]
    lengths = torch.randint(3, NUM_FRAMES, (len(short),), generator=gen)
    for v, n in zip(short.tolist(), lengths.tolist()):
        mask[v, n:] = False
    return text, frames, mask


class Paired:
    """Interleaves the run with bursts of bare matrix products of the same work.

    After each progress step of the scoring call (an equal tile of the grid) it runs
    ``(rows, 1024) x (1024, 1024)`` products in the run's dtype worth that tile's executed
    FLOPs, and keeps their time apart.  Their total over the run's own (shadow-free) time
    is the run's rate as a share of the matmul rate *of the same moments*: on a shared
    machine whose matmul rate swings 2-3x within seconds, this is the stable figure.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device, exec_flops: float) -> None:
        rows = 2048
        self.a = torch.randn(rows, 1024, device=device).to(dtype)
        self.w = torch.randn(1024, 1024, device=device).to(dtype)
        self.out = torch.empty(rows, 1024, device=device, dtype=dtype)
        self.flops_per_mm = 2.0 * rows * 1024 * 1024
        self.exec_flops, self.device = exec_flops, device
        self.total = 1
        self.shadow = 0.0  # seconds of bare products
        self.run = 0.0  # seconds of the scoring call itself
        self.mark = 0.0

    def start(self) -> None:
        sync(self.device)
        self.mark = time.perf_counter()

    def __call__(self, ev: Any) -> None:
        if ev.kind == "start" and ev.total:
            self.total = ev.total
        if ev.kind != "advance":
            return
        sync(self.device)
        now = time.perf_counter()
        self.run += now - self.mark
        work = self.exec_flops * ev.n / self.total
        n = max(1, round(work / self.flops_per_mm))
        for _ in range(n):
            torch.mm(self.a, self.w, out=self.out)
        sync(self.device)
        after = time.perf_counter()
        self.shadow += (after - now) * work / (n * self.flops_per_mm)
        self.mark = after

    def finish(self) -> None:
        sync(self.device)
        self.run += time.perf_counter() - self.mark


def runnable_dtypes(
    requested: list[str], device: torch.device, force: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The dtypes to time on ``device``, and why each skipped one is skipped (bf16 where it is emulated)."""
    from dab_pipeline.runtime.capabilities import capabilities

    caps = capabilities(device)
    keep, skipped = [], {}
    for dt in requested:
        if dt == "bfloat16" and not caps.bf16 and not force:
            skipped[dt] = f"{caps.device} has no native bf16 ({caps.bf16_why}); --force-bf16 runs them anyway"
        elif dt == "tfloat32" and not caps.tf32:
            skipped[dt] = f"{caps.device} has no TF32 (a CUDA device of compute capability 8.0+ does)"
        else:
            keep.append(dt)
    return keep, skipped


def score_dtype(dt: str) -> str:
    """The engine's dtype of a row: "tfloat32" is float32 scoring with TF32 matrix products allowed."""
    return "float32" if dt == "tfloat32" else dt


def torch_dtype(dt: str) -> torch.dtype:
    return getattr(torch, score_dtype(dt))


def use_tf32(dt: str) -> None:
    """Allow (tfloat32 rows) or forbid TF32 products for this process, CUDA's matmul and cuDNN alike."""
    torch.backends.cuda.matmul.allow_tf32 = dt == "tfloat32"
    torch.backends.cudnn.allow_tf32 = dt == "tfloat32"


def prepare_kernels(device: torch.device, dtypes: list[str]) -> str:
    """Build the fused CPU kernels now (the timed children load the cached build), and say what is used."""
    from dab_pipeline.runtime.capabilities import capabilities

    line = f"capabilities: {capabilities(device).summary()}"
    if device.type != "cpu" or "bfloat16" not in dtypes:
        return line + "; fused CPU kernels not used by these rows"
    from dab_pipeline.scoring.kernels.cpu import get_kernels

    t = time.perf_counter()
    k = get_kernels()
    how = f"compiled or loaded in {time.perf_counter() - t:.1f} s, before timing" if k.fused else f"eager: {k.reason}"
    return line + f"; fused CPU kernels: {how}"


def measure(
    impl: str,
    dtype: str,
    steps: int,
    n_q: int,
    n_v: int,
    device: torch.device,
    shortlist: int | None = None,
    out: str | None = None,
) -> dict:
    """One timed run in this (fresh) process: seconds, peak memory growth, the dtype's matmul rate next to it.

    The engine's exact runs are also measured paired (:class:`Paired`): "paired" is its
    rate over the matmul rate of the same moments.
    """
    use_tf32(dtype)
    if impl == "engine-untuned":  # the budget's sub-block size, as before scoring/tiles.py
        os.environ["DAB_TILE_TUNING"] = "0"
        impl = "engine"
    dtype_name, dtype = dtype, score_dtype(dtype)  # the row's name; the engine's dtype
    model = random_model(steps)
    text, frames, mask = random_features(n_q, n_v)
    scorer = Scorer(model, device=device, dtype=dtype)  # as a server keeps it: engines built once per shape
    if impl == "reference":

        def fn() -> Any:
            return score_all_reference(model, text, frames, mask, device=device)
    else:

        def fn() -> Any:
            return scorer.score(text, frames, mask, shortlist=shortlist)

    # warm-up: kernels, thread pools
    warm = slice(0, 8)
    if impl == "reference":
        score_all_reference(model, text[warm], frames[warm], mask[warm], device=device)
    else:
        scorer.score(text[warm], frames[warm], mask[warm])
        if impl == "engine":  # the sub-block size is measured once per machine and shape: not inside the timing
            scorer.prepare(n_q, n_v, NUM_FRAMES)
    rate = matmul_rate(torch_dtype(dtype_name), device, repeats=3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        base = rss_bytes()
    sync(device)
    t = time.perf_counter()
    res = fn()
    sync(device)
    seconds = time.perf_counter() - t
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        import resource

        # ru_maxrss (KiB on Linux) is the process's lifetime peak; set-up (model, features,
        # warm-up) is small next to the run, so the growth over the pre-run RSS is the run's
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    if out:
        np.save(out, res.cost)
    result = {
        "seconds": seconds,
        "peak": max(0, peak),
        "rate": rate,
        "info": {k: v for k, v in res.info.items() if isinstance(v, (str, int, float))},
    }
    if impl == "engine" and not shortlist:  # engine-untuned too (renamed above)
        em = engine_macs(model.cfg, NUM_FRAMES)
        paired = Paired(torch_dtype(dtype_name), device, 2.0 * total_macs(em, n_q, n_v))
        paired.start()
        scorer.score(text, frames, mask, progress=paired)
        paired.finish()
        result["paired"] = paired.shadow / paired.run
        result["paired_seconds"] = paired.run
    if not shortlist:  # the same call again in this process: oneDNN's kernels built, the heap grown, caches warm
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        result["warm_seconds"] = time.perf_counter() - t
    return result


def in_child(
    impl: str, dtype: str, steps: int, n_q: int, n_v: int, device: torch.device, shortlist: int | None, out: str
) -> dict:
    """Run :func:`measure` in a fresh interpreter: no allocator or cache history from earlier runs."""
    import json
    import sys

    cmd = [
        sys.executable,
        __file__,
        "--child",
        impl,
        dtype,
        str(steps),
        str(n_q),
        str(n_v),
        str(device),
        str(shortlist or 0),
        out,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def total_macs(counts: dict[str, int], n_q: int, n_v: int, key: str = "per_pair") -> int:
    return counts[key] * n_q * n_v + counts.get("per_text", 0) * n_q + counts.get("per_video", 0) * n_v


def row(
    name: str,
    seconds: float,
    peak: int,
    pairs: int,
    exec_macs: int,
    model_macs: int,
    rate: float,
    ref_seconds: float | None,
    err: float | None,
    top1: float | None,
    paired: float | None = None,
    warm: float | None = None,
) -> str:
    gf_exec = 2 * exec_macs / seconds / 1e9
    gf_model = 2 * model_macs / seconds / 1e9
    speed = f"{ref_seconds / seconds:6.2f}x" if ref_seconds else "      -"
    err_s = f"{err:9.2e}" if err is not None else "        -"
    top = f"{100 * top1:6.1f}%" if top1 is not None else "      -"
    pair_s = f"{100 * paired:6.1f}%" if paired is not None else "      -"
    warm_s = f"{pairs / warm:10.1f} {100 * 2 * exec_macs / warm / 1e9 / rate:6.1f}%" if warm else f"{'-':>10} {'-':>7}"
    return (
        f"  {name:<22} {pairs / seconds:10.1f} {speed} {gf_exec:9.1f} {100 * gf_exec / rate:6.1f}% {pair_s} "
        f"{warm_s} {gf_model:9.1f} {peak / 2**20:9.1f} {err_s} {top}"
    )


HEADER = (
    f"  {'implementation':<22} {'pairs/s':>10} {'speed':>7} {'exec GF/s':>9} {'%best':>7} {'%paired':>7} "
    f"{'warm p/s':>10} {'%best w':>7} {'model GF/s':>9} {'peak MiB':>9} {'max relerr':>9} {'top-1 =':>7}"
)


RATES: dict[str, float] = {}  # the best matmul rate of each dtype seen in this session
PAIRED: dict[tuple[str, str], float] = {}  # the best paired share of each row


def bench_size(
    n_q: int,
    n_v: int,
    steps: int,
    device: torch.device,
    dtypes: list[str],
    reference: bool,
    shortlist: int | None,
    repeats: int,
    tmp: str,
) -> None:
    cfg = random_model(steps).cfg
    rm, em = reference_macs(cfg, NUM_FRAMES), engine_macs(cfg, NUM_FRAMES)
    pairs = n_q * n_v
    model_macs = rm["paper_per_pair"] * pairs
    print(
        f"\n{n_q} x {n_v} pairs, T'={steps}, D={cfg.embed_dim}, drift {cfg.drift_hidden}, F={NUM_FRAMES}: "
        f"per pair {rm['per_pair'] / 1e6:.2f} M MACs (reference), {em['per_pair'] / 1e6:.2f} M (engine), "
        f"{rm['paper_per_pair'] / 1e6:.2f} M (paper count); best of {repeats}"
    )
    print(HEADER, flush=True)
    runs = [("reference", "float32")] if reference else []
    runs += [("engine", dt) for dt in dtypes]
    if device.type == "cpu":  # side by side: sub-blocks of the measured size (scoring/tiles.py) and of the budget's
        runs += [("engine-untuned", dt) for dt in dtypes]
    best: dict[tuple[str, str], dict] = {}
    warm: dict[tuple[str, str], float] = {}  # the fastest second call of each row
    for _ in range(repeats):  # interleaved, so a burst of load on the machine hits every row alike
        for impl, dt in runs:
            r = in_child(impl, dt, steps, n_q, n_v, device, None, os.path.join(tmp, f"{impl}-{dt}.npy"))
            key = (impl, dt)
            RATES[dt] = max(RATES.get(dt, 0.0), r["rate"])
            if "paired" in r:
                PAIRED[key] = max(PAIRED.get(key, 0.0), r["paired"])
            if key not in best or r["seconds"] < best[key]["seconds"]:
                best[key] = r
            if "warm_seconds" in r:
                warm[key] = min(warm.get(key, float("inf")), r["warm_seconds"])
    ref_cost = np.load(os.path.join(tmp, "reference-float32.npy")) if reference else None
    ref_s = best[("reference", "float32")]["seconds"] if reference else None
    for impl, dt in runs:
        r = best[(impl, dt)]
        err = top1 = None
        if impl.startswith("engine") and ref_cost is not None:
            cost = np.load(os.path.join(tmp, f"{impl}-{dt}.npy"))
            err = float(np.max(np.abs(cost - ref_cost) / np.abs(ref_cost)))
            top1 = float(np.mean(cost.argmin(1) == ref_cost.argmin(1)))
        macs = total_macs(rm if impl == "reference" else em, n_q, n_v)
        print(
            row(
                f"{impl} {dt}",
                r["seconds"],
                r["peak"],
                pairs,
                macs,
                model_macs,
                RATES[dt],
                ref_s if impl.startswith("engine") else None,
                err,
                top1,
                PAIRED.get((impl, dt)),
                warm.get((impl, dt)),
            )
        )
        extra = {k: r["info"][k] for k in ("products", "kernels", "block_pairs") if k in r.get("info", {})}
        if extra:
            print(f"  {'':<22} ({', '.join(f'{k}: {v}' for k, v in extra.items())})")
    if shortlist and ("engine", "float32") in best:
        k = min(shortlist, n_v)
        r = in_child("engine", "float32", steps, n_q, n_v, device, k, os.path.join(tmp, "shortlist.npy"))
        exact = np.load(os.path.join(tmp, "engine-float32.npy"))
        print(
            f"  shortlist K={k}: {best[('engine', 'float32')]['seconds'] / r['seconds']:.2f}x faster than exact "
            f"float32, "
            + recall_kept(exact, np.load(os.path.join(tmp, "shortlist.npy")))
            + f"  (random model: ~{100 * k / n_v:.0f}% expected)"
        )


def recall_kept(exact_cost: np.ndarray, approx_cost: np.ndarray) -> str:
    ex = np.argsort(exact_cost, axis=1, kind="stable")[:, :10]
    ap = np.argsort(approx_cost, axis=1, kind="stable")[:, :10]
    top1 = float(np.mean(ex[:, 0] == ap[:, 0]))
    top10 = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ex, ap)]))
    return f"exact top-1 kept {100 * top1:.1f}%, exact top-10 kept {100 * top10:.1f}%"


# ------------------------------------------------------------------------------------------------------------------
# --covariance: the non-diagonal forms of issue 36 beside diag, full model, in this process


COVARIANCES = ("lowrank:4", "lowrank:8", "mixture:2", "mixture:4")
STAGES = ("pool", "heads", "factor", "token", "bridge", "cost", "rest")

CovRow = tuple[str, str, str, Callable[..., Any]]  # (variant, row, block, call(text, frames, mask))


def covariance_rows(
    steps: int, text: torch.Tensor, frames: torch.Tensor, mask: torch.Tensor, device: torch.device, dtypes: list[str]
) -> list[CovRow]:
    """prob and dab at one T': diag through the reference path and the engine, then each covariance form.

    "diag reference" is :func:`score_all_reference` on the blocks :func:`covariance_chunks` gives a diag model (the
    path a non-diagonal ``dab`` model takes, :func:`~dab_pipeline.scoring.covariance.score_nondiag`); "diag engine"
    the Scorer's engine in each dtype; the forms the Scorer itself: ``prob``'s through its engine in each dtype
    ("<form> engine <dtype>"), ``dab``'s through the reference path.
    """
    n_q, n_v = text.shape[0], frames.shape[0]
    rows: list[CovRow] = []
    for variant in ("prob", "dab"):
        diag = random_model(steps, variant=variant)
        tc, vc = covariance_chunks(diag, n_q, n_v, device, None)
        ref = functools.partial(score_all_reference, diag, text_chunk=tc, video_chunk=vc, device=device)
        rows.append((variant, "diag reference", f"{tc} x {vc}", ref))
        for dt in dtypes:
            scorer = Scorer(diag, device=device, dtype=score_dtype(dt))
            scorer.score(text[:8], frames[:8], mask[:8])  # engine built, kernels loaded: not inside the timing
            scorer.prepare(n_q, n_v, NUM_FRAMES)  # the sub-block size measured once per shape, as in a server
            rows.append((variant, f"diag engine {dt}", "engine", scorer.score))
        for cov in COVARIANCES:
            model = random_model(steps, variant=variant, covariance=cov)
            if engine_covers(model.cfg):  # prob: the engine (U's heads in its basis, then the form's cost)
                for dt in dtypes:
                    scorer = Scorer(model, device=device, dtype=score_dtype(dt))
                    scorer.score(text[:8], frames[:8], mask[:8])
                    scorer.prepare(n_q, n_v, NUM_FRAMES)
                    rows.append((variant, f"{cov} engine {dt}", "engine", scorer.score))
                continue
            tc, vc = covariance_chunks(model, n_q, n_v, device, None)
            rows.append((variant, cov, f"{tc} x {vc}", Scorer(model, device=device).score))
    return rows


def pair_stages(model: DABModel, ts: Any, vs: Any, device: torch.device) -> dict[str, float]:
    """Seconds of each stage of ``model.pair_terms`` on one grid block, run one by one as it runs them.

    pool; heads (LayerNorm, mu, logvar); factor (U, lowrank); token (the video's token term and the fusion);
    bridge (K bridges per pair for a mixture); cost (the KL; a mixture's soft minimum); rest (a mixture's moments
    and best component, which ``pair_terms`` reports); total (``model.pair_costs``, which must agree).
    """
    cfg, prob, tok = model.cfg, model.prob, model.token_unc
    assert prob is not None and tok is not None and vs.tok_logvar is not None
    out = dict.fromkeys(STAGES, 0.0)

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        sync(device)
        t = time.perf_counter()
        res = fn()
        sync(device)
        out[name] = out.get(name, 0.0) + time.perf_counter() - t
        return res

    lo, hi = cfg.logvar_min, cfg.logvar_max
    v_c = timed("pool", lambda: model.pool.pool(ts.q, vs.k, vs.v, vs.mask, True))  # (Q, V, D)
    h = timed("heads", lambda: prob.hidden(v_c))
    mu_v = timed("heads", lambda: prob.mu_head(h))
    lv_base = timed("heads", lambda: prob.logvar_head(h).clamp(lo, hi))
    u_v = timed("factor", lambda: prob.factor(h)) if prob.factor_head is not None else None  # (Q, V, D, R)
    lv_v = timed("token", lambda: (0.5 * (lv_base + vs.tok_logvar[None] + tok.pair_term(v_c))).clamp(lo, hi))
    if ts.mix_mu is not None:
        mu_t, lv_t, logits = ts.mix_mu[:, None], ts.mix_logvar[:, None], ts.mix_logits[:, None]  # (Q, 1, K, D)
        if model.bridge is not None:
            mu_t, lv_t = timed("bridge", lambda: model.bridge(mu_t, lv_t, mu_v[..., None, :], lv_v[..., None, :]))
        kl_k = timed("cost", lambda: kl_diag_gaussian(mu_v[..., None, :], lv_v[..., None, :], mu_t, lv_t))
        cost = timed("cost", lambda: soft_min_kl(kl_k, logits))  # (Q, V)
        timed("rest", lambda: (mixture_moments(mu_t, lv_t, logits), (torch.log_softmax(logits, -1) - kl_k).argmax(-1)))
    else:
        mu_t, lv_t = ts.mu[:, None], ts.logvar[:, None]  # (Q, 1, D)
        if model.bridge is not None:
            mu_t, lv_t = timed("bridge", lambda: model.bridge(mu_t, lv_t, mu_v, lv_v))
        if u_v is None:
            cost = timed("cost", lambda: model.cost_fn(mu_v, lv_v, mu_t, lv_t))
        else:
            cost = timed("cost", lambda: kl_lowrank_gaussian(mu_v, lv_v, u_v, mu_t, lv_t, ts.factor[:, None]))
    total = timed("total", lambda: model.pair_costs(ts, vs))
    torch.testing.assert_close(cost, total, rtol=1e-5, atol=1e-4)  # the stages are the model's path
    return out


def stage_table(steps: int, text: torch.Tensor, frames: torch.Tensor, mask: torch.Tensor, device, repeats: int):
    """Per-pair microseconds of each stage on one block of the size the Scorer uses, mean over interleaved repeats."""
    cases = []
    for variant in ("prob", "dab"):
        for cov in ("diag", *COVARIANCES):
            model = random_model(steps, variant=variant, covariance=cov).to(device)
            tc, vc = covariance_chunks(model, len(text), len(frames), device, None)
            ts, vs = (
                model.encode_text(text[:tc].to(device)),
                model.encode_video(frames[:vc].to(device), mask[:vc].to(device)),
            )
            cases.append((variant, cov, model, ts, vs, tc * vc))
    times: dict[tuple[str, str], list[dict[str, float]]] = {(v, c): [] for v, c, *_ in cases}
    for rep in range(repeats + 1):  # the first round warms up
        for variant, cov, model, ts, vs, _ in cases:
            st = pair_stages(model, ts, vs, device)
            if rep:
                times[(variant, cov)].append(st)
    print(
        f"\n  where a pair's time goes: us/pair of each stage of model.pair_terms on one block of the Scorer's size, "
        f"mean of {repeats}; sum: the stages' (mean +- std); pair_costs: the same block in one call"
    )
    print(
        f"  {'variant':<8}{'covariance':<11}{'pairs':>6}"
        + "".join(f"{s:>8}" for s in STAGES)
        + f"{'sum':>17}{'pair_costs':>17}"
    )
    for variant, cov, _, _, _, pairs in cases:
        per = {k: [1e6 * st[k] / pairs for st in times[(variant, cov)]] for k in (*STAGES, "total")}
        total = [sum(x) for x in zip(*(per[s] for s in STAGES))]
        cols = "".join(f"{statistics.mean(per[s]):8.1f}" if any(per[s]) else f"{'-':>8}" for s in STAGES)
        print(
            f"  {variant:<8}{cov:<11}{pairs:>6}"
            + cols
            + f"{_mean_std(total, '7.1f'):>17}{_mean_std(per['total'], '7.1f'):>17}"
        )


def _mean_std(xs: list[float], fmt: str) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):{fmt}} +- {sd:{fmt}}"


def bench_covariance(
    n_q: int, n_v: int, steps: int, device: torch.device, dtypes: list[str], repeats: int, stages: bool = True
) -> None:
    """pairs/s of every covariance form beside diag (reference path and engine), in this process, interleaved."""
    text, frames, mask = random_features(n_q, n_v)
    cfg = random_model(steps).cfg
    print(
        f"\ncovariance forms (issue 36): {n_q} x {n_v} pairs, T'={steps}, D={cfg.embed_dim}, drift {cfg.drift_hidden}, "
        f"F={NUM_FRAMES}; float32 unless named; {torch.get_num_threads()} threads; mean +- std of {repeats} "
        "interleaved repeats (best: the fastest repeat of each row)",
        flush=True,
    )
    with torch.no_grad():
        rows = covariance_rows(steps, text, frames, mask, device, dtypes)
        for *_, call in rows:  # warm-up: allocator, oneDNN kernels of each shape
            call(text[:8], frames[:8], mask[:8])
        times: dict[tuple[str, str], list[float]] = {(v, r): [] for v, r, *_ in rows}
        for _ in range(repeats):  # interleaved, so a slow spell of a shared machine hits every row
            for variant, name, _, call in rows:
                sync(device)
                t = time.perf_counter()
                call(text, frames, mask)
                sync(device)
                times[(variant, name)].append(time.perf_counter() - t)
    print(
        f"  {'variant':<8}{'row':<26}{'block':>9}{'pairs/s':>20}{'x diag ref':>15}{'x diag eng':>15}"
        f"{'best p/s':>10}{'best x ref':>11}{'best x eng':>11}"
    )
    for variant, name, block, _ in rows:
        dt = name.rsplit(" ", 1)[-1] if " engine " in name else "float32"  # an engine row: over diag's in its dtype
        ts_, ref, eng = (
            times[(variant, name)],
            times[(variant, "diag reference")],
            times[(variant, f"diag engine {dt}")],
        )
        rate = [n_q * n_v / t for t in ts_]
        x_ref = [t / r for t, r in zip(ts_, ref)]  # a pair's time over a diag pair's, the same repeat
        x_eng = [t / e for t, e in zip(ts_, eng)]
        print(
            f"  {variant:<8}{name:<26}{block:>9}{_mean_std(rate, '8.0f'):>20}{_mean_std(x_ref, '5.2f'):>15}"
            f"{_mean_std(x_eng, '5.2f'):>15}{max(rate):10.0f}{min(ts_) / min(ref):11.2f}{min(ts_) / min(eng):11.2f}"
        )
    print(
        "  x diag ref / x diag eng: a pair's time over a diag pair's through the reference path / the engine (in the"
        " row's dtype for an engine row, float32 else)"
    )
    if stages:
        stage_table(steps, text, frames, mask, device, repeats)


# ------------------------------------------------------------------------------------------------------------------
# --one-query K: one query's shortlist of K videos (what dab search and dab serve re-rank) against the grid's rate


def one_query_rows(
    steps: int, n_q: int, n_v: int, k_max: int, device: torch.device, dtypes: list[str]
) -> tuple[dict[str, Scorer], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """A kept Scorer per dtype, warmed up as a server's would be: engines built, the grid's sub-block size measured,
    oneDNN's kernels made for every shape timed below."""
    model = random_model(steps).to(device)
    text, frames, mask = random_features(max(n_q, 64), max(n_v, k_max))
    scorers = {}
    for dt in dtypes:
        scorer = scorers[dt] = Scorer(model, device=device, dtype=score_dtype(dt))
        scorer.prepare(n_q, n_v, NUM_FRAMES)
        scorer.score(text[:n_q], frames[:n_v], mask[:n_v])
    return scorers, (text, frames, mask)


def bench_one_query(
    ks: list[int],
    n_q: int,
    n_v: int,
    steps: int,
    device: torch.device,
    dtypes: list[str],
    repeats: int,
    min_pairs: int = 2000,
) -> None:
    """pairs/s of ``Scorer.score_query`` (the re-rank of dab search / dab serve) on K videos, over the grid's, interleaved.

    Each repeat times, per dtype: the n_q x n_v grid through ``Scorer.score``; then per K, ``Scorer.score_query``,
    the same with the videos' token-branch terms given as an index keeps them (``dab index --video-terms``: float16,
    computed before the timing) and the model's own path it replaced (``scoring.score_query``, under autocast in
    bf16), on enough queries for ``min_pairs`` pairs (at least 2), a different query each call. The share of the
    grid rate is taken per repeat (the same moments).
    """
    engines = [dt for dt in dtypes if dt != "tfloat32"]
    scorers, (text, frames, mask) = one_query_rows(steps, n_q, n_v, max(ks), device, engines)
    model = next(iter(scorers.values())).model
    calls = {k: max(2, -(-min_pairs // k)) for k in ks}
    terms = next(iter(scorers.values())).video_terms(frames, mask)  # (V, D) float32, or None: no token branch
    terms = None if terms is None else terms.astype(np.float16)  # as the index keeps them
    for dt, scorer in scorers.items():  # warm-up: the one-text path's products, the model's path under autocast
        for k in ks:
            scorer.score_query(text[0], frames[:k], mask[:k])
            if terms is not None:
                scorer.score_query(text[0], frames[:k], mask[:k], terms[:k])
            score_query(model, text[0], frames[:k], mask[:k], dtype=score_dtype(dt))
    times: dict[tuple, list[float]] = {}

    def timed(key: tuple, pairs: int, fn: Callable[[], Any]) -> None:
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.setdefault(key, []).append(pairs / (time.perf_counter() - t))

    with torch.no_grad():
        for _ in range(repeats):  # interleaved, so a slow spell of a shared machine hits every row
            for dt, scorer in scorers.items():
                timed((dt, "grid"), n_q * n_v, lambda: scorer.score(text[:n_q], frames[:n_v], mask[:n_v]))
                for k in ks:
                    q = [text[i % len(text)] for i in range(calls[k])]
                    timed((dt, k), k * calls[k], lambda: [scorer.score_query(t, frames[:k], mask[:k]) for t in q])
                    if terms is not None:
                        tk = terms[:k]
                        timed(
                            (dt, k, "terms"),
                            k * calls[k],
                            lambda: [scorer.score_query(t, frames[:k], mask[:k], tk) for t in q],
                        )
                    timed(
                        (dt, k, "model"),
                        k * calls[k],
                        lambda: [score_query(model, t, frames[:k], mask[:k], dtype=score_dtype(dt)) for t in q],
                    )
    print_one_query(ks, n_q, n_v, steps, times, repeats)


def print_one_query(ks: list[int], n_q: int, n_v: int, steps: int, times: dict, repeats: int) -> None:
    print(
        f"\none query (Scorer.score_query, the re-rank of dab search / dab serve), T'={steps}, D=512, F={NUM_FRAMES}; "
        f"{torch.get_num_threads()} threads; mean +- std of {repeats} interleaved repeats; the grid: {n_q} x {n_v} "
        "pairs through Scorer.score in this process (warm); the model's path: what score_query ran before"
    )
    for dt in dict.fromkeys(key[0] for key in times):
        grid = times[(dt, "grid")]
        print(f"  {dt:<9} grid {n_q} x {n_v}: {_mean_std(grid, '9.0f')} pairs/s")
        for k in ks:
            rows = [
                ("one query", (dt, k)),
                ("  video terms cached", (dt, k, "terms")),
                ("  model's path", (dt, k, "model")),
            ]
            for label, key in (r for r in rows if r[1] in times):
                share = [100 * r / g for r, g in zip(times[key], grid)]
                print(
                    f"  {dt:<9} {label} x {k}: {_mean_std(times[key], '9.0f')} pairs/s, "
                    f"{_mean_std(share, '5.1f')} % of the grid rate"
                )


def bench_teacher(
    run_dir: str, teacher_dir: str, store: str, split: str, device: torch.device, repeats: int = 3
) -> None:
    """A distilled run against its teacher on the same pairs: speed, metrics, top-1 agreement (float32)."""
    from dab_pipeline.metrics import t2v_metrics
    from dab_pipeline.runs.load import load_run
    from dab_pipeline.store import open_store

    with open_store(store) as s:
        feats = s.load_split(split)
    gt = np.asarray(feats.caption_video)
    pairs = len(feats.caption_ids) * len(feats.video_ids)
    rows = {}
    for name, path in (("teacher", teacher_dir), ("student", run_dir)):
        run = load_run(path, device)
        best, res = float("inf"), None
        for _ in range(repeats):  # interleaving is not needed at this size: best of N per model
            t = time.perf_counter()
            res = score_all(run.model, feats.text, feats.frames, feats.frame_mask, device=device)
            sync(device)
            best = min(best, time.perf_counter() - t)
        rows[name] = (run.model.cfg.steps, pairs / best, t2v_metrics(res.cost, gt), res.cost.argmin(1))
    print(
        f"\n{run_dir} against its teacher {teacher_dir} on {store} [{split}]: {pairs} pairs, float32, best of {repeats}"
    )
    for name, (steps, rate, m, _) in rows.items():
        print(f"  {name:<8} T'={steps:<3} {rate:12,.0f} pairs/s  R@1 {m['R@1']:6.2f}  MnR {m['MnR']:7.2f}")
    agree = float(np.mean(rows["student"][3] == rows["teacher"][3]))
    print(
        f"  speed-up {rows['student'][1] / rows['teacher'][1]:.2f}x; top-1 equal to the teacher's for "
        f"{100 * agree:.1f}% of the queries"
    )


def bench_run(run_dir: str, store: str, split: str, device: torch.device, shortlist: int | None) -> None:
    from dab_pipeline.metrics import t2v_metrics
    from dab_pipeline.runs.load import load_run
    from dab_pipeline.store import open_store

    run = load_run(run_dir, device)
    with open_store(store) as s:
        feats = s.load_split(split)
    gt = np.asarray(feats.caption_video)
    n_q, n_v = len(feats.caption_ids), len(feats.video_ids)
    print(
        f"\ntrained run {run_dir} on {store} [{split}]: {n_q} queries x {n_v} videos, "
        f"variant {run.model.cfg.variant}, T'={run.model.cfg.steps}"
    )
    out = {}
    for dt in ("float32", "bfloat16"):
        t = time.perf_counter()
        res = score_all(run.model, feats.text, feats.frames, feats.frame_mask, device=device, dtype=dt)
        sync(device)
        out[dt] = (time.perf_counter() - t, res, t2v_metrics(res.cost, gt))
    m32, m16 = out["float32"][2], out["bfloat16"][2]
    c32, c16 = out["float32"][1].cost, out["bfloat16"][1].cost
    print(f"  {'metric':<6} {'float32':>9} {'bfloat16':>9} {'delta':>8}")
    for key in ("R@1", "R@5", "R@10", "MdR", "MnR"):
        print(f"  {key:<6} {m32[key]:9.2f} {m16[key]:9.2f} {m16[key] - m32[key]:+8.2f}")
    worst = max(abs(m16[k] - m32[k]) for k in ("R@1", "R@5", "MnR"))
    print(
        f"  bf16 max relative cost error {np.max(np.abs(c16 - c32) / np.abs(c32)):.2e}; "
        f"largest |delta| of R@1/R@5/MnR {worst:.2f} ({'within' if worst <= 0.3 else 'OUTSIDE'} the 0.3 target); "
        f"time {out['float32'][0]:.1f} s float32, {out['bfloat16'][0]:.1f} s bf16"
    )
    k = min(shortlist or max(1, n_v // 10), n_v)
    t = time.perf_counter()
    res = score_all(run.model, feats.text, feats.frames, feats.frame_mask, device=device, shortlist=k)
    sync(device)
    sec = time.perf_counter() - t
    msl = t2v_metrics(res.cost, gt)
    print(
        f"  shortlist K={k}: {out['float32'][0] / sec:.2f}x faster; "
        + recall_kept(c32, res.cost)
        + f"; R@1 {msl['R@1']:.2f} (exact {m32['R@1']:.2f}), R@5 {msl['R@5']:.2f} (exact {m32['R@5']:.2f})"
    )


def main() -> None:
    import sys
    import tempfile

    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        import json

        impl, dtype, steps, n_q, n_v, dev, k, out = sys.argv[2:10]
        r = measure(impl, dtype, int(steps), int(n_q), int(n_v), torch.device(dev), int(k) or None, out)
        print(json.dumps(r))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--large", action="store_true", help="1000 x 1000 pairs on CPU (default 256 x 256)")
    ap.add_argument("--pairs", type=int, nargs=2, metavar=("Q", "V"), default=None, help="explicit sizes")
    ap.add_argument("--steps", type=int, nargs="+", default=None, help="T' values (CPU: 8, --full 8 32; CUDA: 32)")
    ap.add_argument("--full", action="store_true", help="T' = 8 and 32 on CPU (about 3x the default's time)")
    ap.add_argument("--force-bf16", action="store_true", help="run bf16 rows even where bf16 is emulated (slow)")
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto")
    ap.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32", "bfloat16"],
        choices=["float32", "tfloat32", "bfloat16"],
        help="tfloat32: float32 scoring with TF32 products (CUDA, compute capability 8.0+)",
    )
    ap.add_argument("--repeats", type=int, default=1, help="runs per row (interleaved); the fastest is shown")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference (no speed-up / error columns)")
    ap.add_argument("--shortlist", type=int, default=None, help="K of the shortlist row (default V/10; 0: skip)")
    ap.add_argument("--run", default=None, help="trained run folder: float32 vs bf16 metrics on its split")
    ap.add_argument("--features", default=None, help="feature store of --run")
    ap.add_argument(
        "--teacher",
        default=None,
        help="with --run: the teacher of a distilled run (dab distill); speed and agreement on the same pairs",
    )
    ap.add_argument("--split", default="test")
    ap.add_argument(
        "--covariance",
        nargs="?",
        const="also",
        choices=["also", "only"],
        default=None,
        help="also (or only) time prob and dab with covariance lowrank:4/8 and mixture:2/4 beside diag (issue 36)",
    )
    ap.add_argument(
        "--covariance-pairs", type=int, nargs=2, metavar=("Q", "V"), default=None, help="(CPU default 128 x 128)"
    )
    ap.add_argument(
        "--threads", type=int, default=0, help="torch threads of this process (--covariance, --one-query); 0: default"
    )
    ap.add_argument(
        "--one-query",
        type=int,
        nargs="+",
        default=None,
        metavar="K",
        help="also time one query's re-rank of K videos (Scorer.score_query) against the grid's rate, in this process",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # 1 is steadier where other processes share the cores

    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    cuda = device.type == "cuda"
    where = torch.cuda.get_device_name(device) if cuda else f"{cpu_name()}, {os.cpu_count()} cores"
    print(f"device: {device} ({where}); torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    dtypes, skipped = runnable_dtypes(args.dtypes, device, args.force_bf16)
    for dt, why in skipped.items():
        print(f"skipping the {dt} rows: {why}")
    print(prepare_kernels(device, dtypes), flush=True)
    if args.run:
        if not args.features:
            ap.error("--run needs --features STORE")
        if args.teacher:
            bench_teacher(args.run, args.teacher, args.features, args.split, device)
            return
        if "bfloat16" not in dtypes:
            print("--run compares float32 with bf16, and bf16 is skipped here: nothing to compare")
            return
        bench_run(args.run, args.features, args.split, device, args.shortlist)
        return
    # float32 always: the reference and the shortlist run in it; bf16 only where it is timed
    rates = {}
    for dt in dict.fromkeys(["float32", *dtypes]):
        use_tf32(dt)
        rates[dt] = matmul_rate(torch_dtype(dt), device)
    use_tf32("float32")
    RATES.update(rates)
    print(
        "matmul rate: "
        + ", ".join(f"{dt} {r:.0f} GFLOP/s" for dt, r in rates.items())
        + " (at start; %best divides by the best rate seen in the whole session, %paired by the rate of "
        "bare products run between the row's own tiles)"
    )
    n_q, n_v = args.pairs or ((1000, 1000) if (args.large or cuda) else (256, 256))
    steps = args.steps or ([32] if cuda else ([8, 32] if args.full else [8]))
    shortlist = None if args.shortlist == 0 else (args.shortlist or max(1, n_v // 10))
    if args.covariance != "only":
        with tempfile.TemporaryDirectory() as tmp:
            for t in steps:
                bench_size(n_q, n_v, t, device, dtypes, not args.no_reference, shortlist, args.repeats, tmp)
    if args.one_query:
        for t in steps:  # mean +- std needs a few repeats
            bench_one_query(args.one_query, n_q, n_v, t, device, dtypes, max(args.repeats, 3))
    if args.covariance:
        c_q, c_v = args.covariance_pairs or ((n_q, n_v) if cuda else (128, 128))
        engines = [dt for dt in dict.fromkeys(["float32", *dtypes]) if dt != "tfloat32"]
        for t in steps:  # mean +- std needs a few repeats
            bench_covariance(c_q, c_v, t, device, engines, max(args.repeats, 3))


if __name__ == "__main__":
    main()
