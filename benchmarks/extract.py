"""Stage-one (``dab extract``) throughput: decode alone, encode alone, end to end.

Generates N synthetic videos (panning sinusoidal texture plus a bouncing box,
lossless libx264 via ``dab_pipeline.video.synthetic.write_video``) and a
``captions.csv`` in a temp dir, then measures, in videos per second:

* **decode**: the extract stage's own DataLoader path (``DecodeDataset``,
  ``collate_items``, ``decode_worker_init`` imported from ``dab_pipeline.stages.extract``):
  PyAV decode (the default decoder) with resize at decode time + CLIP's PIL preprocessing, in
  ``--workers`` one-thread worker processes; worker start-up included;
* **encode**: the pre-decoded pixel tensors encoded in batches of
  ``--batch-size`` videos with ``encode_images`` (after one warm-up batch);
* **end to end**: ``run_extract`` on a ``folder`` dataset into a fresh HDF5
  store; the video phase (progress events "start"/"end" of task "videos") is
  reported separately from caption encoding and from the whole call (model
  load, dataset scan, store creation, captions, videos);
* **overlap** = end-to-end video-phase rate / min(decode, encode), per round:
  1.0 means decoding is completely hidden behind encoding (or the other way
  round); and the end-to-end rate against taking turns, 1 / (1/decode +
  1/encode): on a CPU-only machine decode and encode share the same cores, so
  above 1 means the overlap gains anything at all.

Then the design choices the stage relies on:

* decoder layout, on ``--design-videos`` videos with one video per DataLoader
  item (so both workers get equal work): 2 one-thread worker processes (the
  stage's layout) vs one process whose PyAV decoder has 2 threads (and torch
  2 threads for the preprocessing), plus one process with a 2-thread PyAV
  decoder and 1 torch thread, and one process with one thread;
* CLIP ``--dtype-model`` (ViT-B-32) with deterministic random weights
  (``load_clip`` refuses ``pretrained=None`` for open_clip architectures, so
  the weights are written once with ``write_tiny_weights(model="ViT-B-32")``
  and loaded from that file) encoded in float32, bfloat16
  (``load_clip(dtype="bfloat16")``: open_clip's bf16 conversion) and float32
  under CPU ``torch.autocast(bfloat16)``.

Measurements run in ``--repeats`` interleaved rounds (each measurement once
per round), so a burst of load from other processes hits all of them alike;
the table shows the best and the median round.

    python benchmarks/extract.py [--videos 48] [--frames-per-video 75] [--size 320x240]
        [--workers 2] [--batch-size 16] [--model dab-tiny|ViT-B-32] [--pretrained PATH|TAG]
        [--dtype float32|bfloat16] [--threads N] [--repeats 3] [--design-videos 16] [--dtype-videos 2] [--skip-design]
        [--data-dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as _dt
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch

from dab_pipeline.clip_models import ClipBundle, encode_images, load_clip, write_tiny_weights
from dab_pipeline.runtime.capabilities import capabilities, resolve_clip_dtype
from dab_pipeline.stages.extract import DecodeDataset, ExtractConfig, collate_items, decode_worker_init, run_extract
from dab_pipeline.video import DecodedVideo
from dab_pipeline.video.pyav_decoder import decode_sequential
from dab_pipeline.video.synthetic import write_video

_QUIET = False


def log(msg: str) -> None:
    if not _QUIET:
        print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- synthetic data


def iter_moving_frames(seed: int, n: int, w: int, h: int) -> Iterator[np.ndarray]:
    """(h, w, 3) uint8 frames one at a time: a panning two-axis sinusoid, diagonal colour stripes and a bouncing box
    (a long video need not fit in memory)."""
    rng = np.random.default_rng(seed)
    xs = np.arange(w, dtype=np.float32)
    ys = np.arange(h, dtype=np.float32)
    fx, fy = rng.uniform(0.01, 0.06, 2)
    vx, vy = rng.uniform(-3.0, 3.0, 2)
    col = rng.uniform(40, 200, 3).astype(np.float32)  # (3,)
    diag = (xs[None, :, None] + ys[:, None, None]) * 0.1 + np.arange(3, dtype=np.float32)  # (h, w, 3)
    s_d, c_d = np.sin(diag), np.cos(diag)
    bw, bh = max(2, w // 5), max(2, h // 5)
    bx, by = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
    bvx, bvy = rng.choice([-4, -3, 3, 4], 2)
    for i in range(n):
        base = 0.5 + 0.25 * np.sin((xs + vx * i) * fx)[None, :] + 0.25 * np.cos((ys + vy * i) * fy)[:, None]  # (h, w)
        ph = 0.2 * i
        img = base[..., None] * col + 20.0 * (s_d * np.cos(ph) + c_d * np.sin(ph))  # sin(diag + ph)
        x0 = int(abs((bx + bvx * i) % (2 * (w - bw)) - (w - bw)))
        y0 = int(abs((by + bvy * i) % (2 * (h - bh)) - (h - bh)))
        img[y0 : y0 + bh, x0 : x0 + bw] = 255.0 - col
        yield np.clip(img, 0, 255).astype(np.uint8)


def moving_frames(seed: int, n: int, w: int, h: int) -> np.ndarray:
    """(n, h, w, 3) uint8: :func:`iter_moving_frames` as one array."""
    out = np.empty((n, h, w, 3), np.uint8)
    for i, img in enumerate(iter_moving_frames(seed, n, w, h)):
        out[i] = img
    return out


def _write_one(job: tuple[str, int, int, int, int]) -> None:
    path, seed, n, w, h = job
    write_video(Path(path), moving_frames(seed, n, w, h))


def make_videos(root: Path, count: int, frames: int, size: tuple[int, int], procs: int) -> tuple[Path, Path, float]:
    """Write (or reuse) ``count`` videos and a captions.csv under ``root``; returns (videos dir, csv, seconds)."""
    w, h = size
    vdir = root / "videos"
    meta = root / "meta.json"
    want = {"count": count, "frames": frames, "size": [w, h], "version": 1}
    t0 = time.perf_counter()
    if not (meta.is_file() and json.loads(meta.read_text()) == want):
        vdir.mkdir(parents=True, exist_ok=True)
        for old in vdir.glob("*.mp4"):
            old.unlink()
        jobs = [(str(vdir / f"bench_{i:04d}.mp4"), i, frames, w, h) for i in range(count)]
        if procs > 1:
            with mp.get_context("fork").Pool(procs) as pool:
                pool.map(_write_one, jobs, chunksize=1)
        else:
            for j in jobs:
                _write_one(j)
        meta.write_text(json.dumps(want))
    csv_path = root / "captions.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        wr = csv.DictWriter(fh, fieldnames=["video", "caption", "split"])
        wr.writeheader()
        for i in range(count):
            for text in ("a box bounces over moving stripes", f"synthetic clip number {i}"):
                wr.writerow({"video": f"bench_{i:04d}.mp4", "caption": text, "split": "test"})
    return vdir, csv_path, time.perf_counter() - t0


# --------------------------------------------------------------------------- helpers


def summarise(times: list[float], units: int) -> dict[str, Any]:
    """Seconds per repeat -> rates (units/s): best, median, all."""
    rates = [units / t for t in times]
    return {
        "seconds": [round(t, 3) for t in times],
        "best": max(rates),
        "median": statistics.median(rates),
        "units": units,
    }


def video_items(vdir: Path, count: int) -> list[tuple[int, str]]:
    return [(i, str(vdir / f"bench_{i:04d}.mp4")) for i in range(count)]


def load_bundle(model: str, pretrained: Optional[str], dtype: str) -> ClipBundle:
    return load_clip(model, pretrained, device="cpu", dtype=dtype)


def random_weights(model: str, where: Path) -> str:
    """A deterministic random-weights file for ``model`` (any open_clip architecture), written once."""
    path = where / f"{model}-random-seed0.pt"
    if not path.is_file():
        log(f"writing random {model} weights to {path}")
        write_tiny_weights(path, seed=0, model=model)
    return str(path)


# --------------------------------------------------------------------------- measurements


def decode_pipeline(
    items,
    frames: int,
    short_side: int,
    preprocess,
    workers: int,
    batch_size: int,
    keep: Optional[list] = None,
    decoder: str = "pyav",
) -> float:
    """The extract stage's DataLoader (same dataset, collate, worker init, prefetch); seconds."""
    ds = DecodeDataset(items, frames, short_side, decoder, preprocess)
    t0 = time.perf_counter()
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        collate_fn=collate_items,
        worker_init_fn=decode_worker_init if workers > 0 else None,
        prefetch_factor=2 if workers > 0 else None,
        persistent_workers=False,
    )
    n_err = 0
    for batch in loader:
        for b in batch:
            if b["error"] is not None:
                n_err += 1
            elif keep is not None:
                keep.append(b["pixels"])
    dt = time.perf_counter() - t0
    if n_err:
        raise RuntimeError(f"{n_err} videos failed to decode")
    return dt


def _decode_threads(path: str, frames: int, short_side: int, threads: int) -> DecodedVideo:
    """The stage's PyAV decoder with ``threads`` FFmpeg decoding threads."""
    return decode_sequential(Path(path), frames, short_side, threads=threads)


def decode_in_process(
    items, frames: int, short_side: int, preprocess, threads: int, torch_threads: Optional[int] = None
) -> float:
    """One process, no workers: PyAV with ``threads`` decoding threads, torch with ``torch_threads``
    (default: the same) for the preprocessing; seconds."""
    from PIL import Image

    old = torch.get_num_threads()
    torch.set_num_threads(threads if torch_threads is None else torch_threads)
    try:
        t0 = time.perf_counter()
        for _, path in items:
            dec = _decode_threads(path, frames, short_side, threads)
            torch.stack([preprocess(Image.fromarray(f)) for f in dec.frames])
        return time.perf_counter() - t0
    finally:
        torch.set_num_threads(old)


def encode_batches(bundle: ClipBundle, pixels: list[torch.Tensor], batch_size: int, autocast: bool = False) -> float:
    """Encode (F, 3, S, S) videos in batches of ``batch_size`` videos as the stage does; seconds."""
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    t0 = time.perf_counter()
    with ctx:
        for s in range(0, len(pixels), batch_size):
            px = torch.stack(pixels[s : s + batch_size])  # (B, F, 3, S, S)
            B, F = px.shape[:2]
            feats, _ = encode_images(bundle, px.flatten(0, 1), None)
            feats.float().reshape(B, F, -1).cpu().numpy()
    return time.perf_counter() - t0


def end_to_end(vdir: Path, csv_path: Path, out: Path, args, pretrained: Optional[str]) -> dict[str, float]:
    """``run_extract`` into a fresh store; seconds for the whole call, the caption and the video phase."""
    marks: dict[str, float] = {}

    def progress(ev) -> None:
        if ev.kind in ("start", "end") and ev.task in ("captions", "videos"):
            marks[f"{ev.task}_{ev.kind}"] = time.perf_counter()

    cfg = ExtractConfig(
        dataset="folder",
        out=out,
        videos=vdir,
        annotations=csv_path,
        model=args.model,
        pretrained=pretrained,
        frames=args.frames,
        compute_dtype=args.dtype,
        batch_size=args.batch_size,
        workers=args.workers,
        device="cpu",
        overwrite=True,
    )
    t0 = time.perf_counter()
    res = run_extract(cfg, progress=progress)
    total = time.perf_counter() - t0
    if res.videos_ok != args.videos:
        raise RuntimeError(f"run_extract encoded {res.videos_ok} of {args.videos} videos ({res.failures[:2]})")
    return {
        "total": total,
        "captions": marks["captions_end"] - marks["captions_start"],
        "videos": marks["videos_end"] - marks["videos_start"],
        "setup": marks["captions_start"] - t0,
        "captions_count": res.captions,
    }


# --------------------------------------------------------------------------- main


def machine() -> dict[str, Any]:
    name = platform.processor() or ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                name = line.split(":", 1)[1].strip()
    except Exception:  # noqa: BLE001 - lscpu missing: keep platform's answer
        pass
    flags = ""
    with contextlib.suppress(OSError):
        flags = Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0]
    return {
        "cpu": name,
        "nproc": os.cpu_count(),
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "capabilities": capabilities("cpu").as_dict(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be WxH, e.g. 320x240, got {text!r}") from None
    if w % 2 or h % 2 or w < 16 or h < 16:
        raise argparse.ArgumentTypeError(f"size {text}: sides must be even and >= 16")
    return w, h


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    global _QUIET
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=48, help="generated videos (default 48)")
    ap.add_argument(
        "--frames-per-video", type=int, default=75, help="frames in each generated video, 25 fps (default 75 = 3 s)"
    )
    ap.add_argument("--size", type=parse_size, default=(320, 240), help="generated frame size WxH (default 320x240)")
    ap.add_argument("--frames", type=int, default=12, help="frames sampled per video (default 12)")
    ap.add_argument("--workers", type=int, default=2, help="decoding worker processes (default 2)")
    ap.add_argument("--batch-size", type=int, default=16, help="videos per encoding batch (default 16)")
    ap.add_argument("--model", default="dab-tiny", help="open_clip architecture (default dab-tiny)")
    ap.add_argument(
        "--pretrained",
        default=None,
        help="weights file or tag; default: dab-tiny's own random weights, or deterministic random "
        "weights written for any other architecture",
    )
    ap.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "auto"],
        help="CLIP compute dtype (auto: what `dab extract` picks on this CPU)",
    )
    ap.add_argument(
        "--force-bf16", action="store_true", help="time bf16 even on a CPU without native bf16 (emulated: very slow)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads of the main (encoding) process; 0 keeps torch's default, as the stage does",
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="interleaved rounds; every measurement runs once per round (default 3)"
    )
    ap.add_argument(
        "--design-videos", type=int, default=16, help="videos per decoder-layout measurement (default 16; 0 skips it)"
    )
    ap.add_argument("--dtype-model", default="ViT-B-32", help="architecture for the dtype comparison")
    ap.add_argument(
        "--dtype-videos",
        type=int,
        default=2,
        help="videos (x --frames images) per dtype measurement (default 2; 0 skips it)",
    )
    ap.add_argument("--skip-design", action="store_true", help="skip both design comparisons")
    ap.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="keep the generated videos and random weights here and reuse them (default: temp dir)",
    )
    ap.add_argument("--json", action="store_true", help="print machine-readable results only")
    args = ap.parse_args(argv)
    _QUIET = args.json
    if args.videos < 1 or args.repeats < 1 or args.workers < 0 or args.batch_size < 1:
        ap.error("--videos, --repeats, --batch-size must be >= 1 and --workers >= 0")
    if args.skip_design:
        args.design_videos = args.dtype_videos = 0
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    info = machine()
    bf16_ok = info["capabilities"]["bf16"] or args.force_bf16
    skipped: dict[str, str] = {}
    why = f"this CPU has no native bf16 ({info['capabilities']['bf16_why']}); --force-bf16 times it anyway"
    if args.dtype == "auto":
        args.dtype = resolve_clip_dtype("auto", "cpu").dtype
    elif args.dtype == "bfloat16" and not bf16_ok:
        skipped["--dtype bfloat16"] = why + "; the main rows run in float32"
        args.dtype = "float32"
    results: dict[str, Any] = {
        "machine": info,
        "config": {
            "videos": args.videos,
            "frames_per_video": args.frames_per_video,
            "size": list(args.size),
            "frames": args.frames,
            "workers": args.workers,
            "batch_size": args.batch_size,
            "model": args.model,
            "dtype": args.dtype,
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
        },
    }
    t_start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.data_dir is not None:
            root = args.data_dir.expanduser().absolute()
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dab-bench-extract-")))
        log(
            f"generating {args.videos} videos of {args.frames_per_video} frames at "
            f"{args.size[0]}x{args.size[1]} in {root}"
        )
        vdir, csv_path, gen_s = make_videos(
            root, args.videos, args.frames_per_video, args.size, max(1, min(2, os.cpu_count() or 1))
        )
        results["generate_seconds"] = round(gen_s, 2)
        results["mean_video_bytes"] = int(np.mean([p.stat().st_size for p in vdir.glob("*.mp4")]))

        pretrained = args.pretrained
        if isinstance(pretrained, str) and pretrained.lower() == "none":
            pretrained = None
        if pretrained is None and not args.model.startswith("dab-tiny"):
            pretrained = random_weights(args.model, root)
        bundle = load_bundle(args.model, pretrained, args.dtype)
        short_side = int(bundle.image_size)
        items = video_items(vdir, args.videos)
        sub = items[: min(args.design_videos, args.videos)]
        results["config"].update(
            {
                "model_built": bundle.model_name,
                "image_size": short_side,
                "pretrained": bundle.pretrained,
                "design_videos": len(sub),
                "dtype_model": args.dtype_model,
                "dtype_videos": args.dtype_videos,
            }
        )

        dtype_bundles: dict[str, tuple[ClipBundle, bool]] = {}
        dtype_x: list[torch.Tensor] = []
        if args.dtype_videos > 0:
            dm = args.dtype_model
            if dm == args.model:
                wpath = pretrained
            else:
                wpath = None if dm.startswith("dab-tiny") else random_weights(dm, root)
            log(f"loading {dm} float32" + (" and bfloat16" if bf16_ok else ""))
            f32 = load_bundle(dm, wpath, "float32")
            bf16 = load_bundle(dm, wpath, "bfloat16") if bf16_ok else f32
            dtype_bundles = {"float32": (f32, False), "bfloat16": (bf16, False), "autocast-bf16": (f32, True)}
            if not bf16_ok:
                for label in ("bfloat16", "autocast-bf16"):
                    dtype_bundles.pop(label)
                    skipped[f"encode dtype {label}"] = why
            g = torch.Generator().manual_seed(0)
            dtype_x = [
                torch.randn(args.frames, 3, f32.image_size, f32.image_size, generator=g)
                for _ in range(args.dtype_videos)
            ]
            for b, ac in dtype_bundles.values():
                encode_batches(b, dtype_x[:1], 1, ac)  # warm-up (oneDNN primitive creation)

        times: dict[str, list[float]] = {
            k: []
            for k in (
                "decode",
                "encode",
                "e2e_videos",
                "e2e_total",
                "e2e_captions",
                "e2e_setup",
                "design_2proc_1thread",
                "design_1proc_2threads",
                "design_1proc_2dec_1torch",
                "design_1proc_1thread",
                *dtype_bundles,
            )
        }
        pixels: list[torch.Tensor] = []
        captions = 0
        for r in range(args.repeats):
            info.setdefault("loadavg_rounds", []).append(round(os.getloadavg()[0], 2))
            log(f"round {r + 1}/{args.repeats} (load average {os.getloadavg()[0]:.2f})")
            # decode alone: the stage's DataLoader path
            times["decode"].append(
                decode_pipeline(
                    items,
                    args.frames,
                    short_side,
                    bundle.preprocess,
                    args.workers,
                    args.batch_size,
                    keep=pixels if r == 0 else None,
                )
            )
            log(f"  decode alone      {times['decode'][-1]:6.2f} s")
            # encode alone: pre-decoded pixels
            if r == 0:
                encode_batches(bundle, pixels[: args.batch_size], args.batch_size)  # warm-up
            times["encode"].append(encode_batches(bundle, pixels, args.batch_size))
            log(f"  encode alone      {times['encode'][-1]:6.2f} s")
            # end to end: run_extract
            out = root / f"e2e_{r}.h5"
            e2e = end_to_end(vdir, csv_path, out, args, pretrained)
            out.unlink(missing_ok=True)
            for k in ("videos", "total", "captions", "setup"):
                times[f"e2e_{k}"].append(e2e[k])
            captions = int(e2e["captions_count"])
            log(
                f"  end to end        {e2e['total']:6.2f} s ({e2e['videos']:.2f} s videos, "
                f"{e2e['captions']:.2f} s captions)"
            )
            # decoder layouts, on a subset, with one video per DataLoader item so both workers get equal work
            if sub:
                times["design_2proc_1thread"].append(
                    decode_pipeline(sub, args.frames, short_side, bundle.preprocess, 2, 1)
                )
                times["design_1proc_2threads"].append(
                    decode_in_process(sub, args.frames, short_side, bundle.preprocess, 2)
                )
                times["design_1proc_2dec_1torch"].append(
                    decode_in_process(sub, args.frames, short_side, bundle.preprocess, 2, 1)
                )
                times["design_1proc_1thread"].append(
                    decode_in_process(sub, args.frames, short_side, bundle.preprocess, 1)
                )
                log(
                    f"  decoder layouts   {times['design_2proc_1thread'][-1]:.2f} / "
                    f"{times['design_1proc_2threads'][-1]:.2f} / {times['design_1proc_2dec_1torch'][-1]:.2f} / "
                    f"{times['design_1proc_1thread'][-1]:.2f} s (2 proc x 1 thread / 1 proc x 2 threads / "
                    "1 proc, pyav 2 + torch 1 / 1 proc x 1 thread)"
                )
            # dtypes
            for label, (b, ac) in dtype_bundles.items():
                times[label].append(encode_batches(b, dtype_x, len(dtype_x), ac))
                log(f"  {args.dtype_model} {label:14} {times[label][-1]:6.2f} s")
        del pixels

        n = args.videos
        results["decode"] = summarise(times["decode"], n)
        results["encode"] = summarise(times["encode"], n)
        results["e2e_videos"] = summarise(times["e2e_videos"], n)
        results["e2e_total"] = summarise(times["e2e_total"], n)
        results["e2e_captions_seconds"] = [round(t, 3) for t in times["e2e_captions"]]
        results["e2e_setup_seconds"] = [round(t, 3) for t in times["e2e_setup"]]
        results["captions"] = captions
        # Per round, so that a burst of outside load in one round does not mix into another round's ratio.
        per_round = [
            (n / e) / min(n / d, n / c) for d, c, e in zip(times["decode"], times["encode"], times["e2e_videos"])
        ]
        results["overlap"] = {
            "rounds": [round(x, 3) for x in per_round],
            "median": statistics.median(per_round),
            "min": min(per_round),
            "max": max(per_round),
            "bound": "decode" if results["decode"]["median"] <= results["encode"]["median"] else "encode",
        }
        # Against taking turns: decode then encode on the same cores, rate 1 / (1/decode + 1/encode).
        # On a CPU-only machine both sides compete for the same cores, so this is the fairer reference.
        vs_serial = [(n / e) / (n / (d + c)) for d, c, e in zip(times["decode"], times["encode"], times["e2e_videos"])]
        results["vs_serial"] = {
            "rounds": [round(x, 3) for x in vs_serial],
            "median": statistics.median(vs_serial),
            "min": min(vs_serial),
            "max": max(vs_serial),
        }
        if sub:
            results["design_decode"] = {
                "videos": len(sub),
                "2proc_1thread": summarise(times["design_2proc_1thread"], len(sub)),
                "1proc_2threads": summarise(times["design_1proc_2threads"], len(sub)),
                "1proc_2dec_1torch": summarise(times["design_1proc_2dec_1torch"], len(sub)),
                "1proc_1thread": summarise(times["design_1proc_1thread"], len(sub)),
            }
        if dtype_bundles:
            n_img = len(dtype_x) * args.frames
            results["design_dtype"] = {
                "model": dtype_bundles["float32"][0].model_name,
                "images": n_img,
                **{k: summarise(times[k], n_img) for k in dtype_bundles},
            }
    info["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    results["skipped"] = skipped
    results["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)
    return results


def print_table(r: dict[str, Any]) -> None:
    m, c = r["machine"], r["config"]
    print(
        f"\nmachine: {m['cpu']}, {m['nproc']} CPUs (avx512_bf16={m['avx512_bf16']}, amx_bf16={m['amx_bf16']}), "
        f"torch {m['torch']} ({m['torch_threads']} threads), {m['date']}"
    )
    caps = m["capabilities"]
    print(
        f"bf16 {'native' if caps['bf16'] else 'not native'} ({caps['bf16_why']}); `dab extract --dtype auto` "
        f"picks {resolve_clip_dtype('auto', 'cpu').dtype} here"
    )
    print(
        f"1-min load average at start / each round / end: {m['loadavg_start'][0]} / "
        f"{m.get('loadavg_rounds')} / {m['loadavg_end'][0]}"
    )
    print(
        f"data: {c['videos']} videos x {c['frames_per_video']} frames at {c['size'][0]}x{c['size'][1]} "
        f"(lossless x264, {r['mean_video_bytes'] / 1e6:.2f} MB each, generated in {r['generate_seconds']} s); "
        f"{c['frames']} frames sampled, decoded at short side {c['image_size']}"
    )
    print(
        f"model: {c['model_built']} {c['dtype']}, {c['threads']} torch threads in the main process; "
        f"workers {c['workers']}, batch {c['batch_size']} videos; {c['repeats']} interleaved rounds\n"
    )
    print(f"{'measurement':60} {'best':>8} {'median':>8}  unit")

    def row(name: str, s: dict[str, Any], unit: str = "videos/s") -> None:
        print(f"{name:60} {s['best']:8.2f} {s['median']:8.2f}  {unit}")

    def secs(name: str, vals: list[float]) -> None:
        print(f"{name:60} {min(vals):8.2f} {statistics.median(vals):8.2f}  s")

    row(f"decode alone ({c['workers']} workers x 1 thread, + CLIP preprocess)", r["decode"])
    row(f"encode alone ({c['model_built']} {c['dtype']}, pre-decoded pixels)", r["encode"])
    row("end to end, video phase of run_extract", r["e2e_videos"])
    row("end to end, whole run_extract call", r["e2e_total"])
    secs(f"  caption encoding ({r['captions']} captions)", r["e2e_captions_seconds"])
    secs("  set-up (model load, dataset scan, store creation)", r["e2e_setup_seconds"])
    ov = r["overlap"]
    print(
        f"{'overlap = e2e video phase / min(decode, encode), per round':60} {ov['max']:8.2f} {ov['median']:8.2f}  "
        f"(min {ov['min']:.2f}; slower side: {ov['bound']}; 1.0 = perfect)"
    )
    vs = r["vs_serial"]
    print(
        f"{'e2e video phase / serial rate 1/(1/decode + 1/encode)':60} {vs['max']:8.2f} {vs['median']:8.2f}  "
        f"(min {vs['min']:.2f}; > 1: overlap gains over taking turns)"
    )
    if "design_decode" in r:
        d = r["design_decode"]
        print(f"\ndecoder layout ({d['videos']} videos, one video per DataLoader item)")
        row("2 worker processes x 1 thread (the stage's layout)", d["2proc_1thread"])
        row("1 process, PyAV 2 threads + torch 2 threads", d["1proc_2threads"])
        row("1 process, PyAV 2 threads + torch 1 thread", d["1proc_2dec_1torch"])
        row("1 process, 1 thread", d["1proc_1thread"])
        a, b = d["2proc_1thread"], d["1proc_2threads"]
        print(
            f"{'  2 processes x 1 thread / 1 process x 2 threads':60} {a['best'] / b['best']:8.2f} "
            f"{a['median'] / b['median']:8.2f}  x"
        )
    if "design_dtype" in r:
        d = r["design_dtype"]
        print(f"\nencode dtype ({d['model']}, random weights, {d['images']} images per call)")
        shown = [label for label in ("float32", "bfloat16", "autocast-bf16") if label in d]
        for label in shown:
            path = {
                "float32": "float32 weights",
                "bfloat16": "open_clip's bf16 conversion, oneDNN bf16",
                "autocast-bf16": "float32 weights under torch.autocast(cpu, bfloat16)",
            }[label]
            row(f"{label} ({path})", d[label], "images/s")
        f32 = d["float32"]
        for label in shown[1:]:
            print(
                f"{'  ' + label + ' / float32':60} {d[label]['best'] / f32['best']:8.2f} "
                f"{d[label]['median'] / f32['median']:8.2f}  x"
            )
    for what, reason in r.get("skipped", {}).items():
        print(f"skipped {what}: {reason}")
    print(f"\nbenchmark wall time {r['wall_seconds']} s")


if __name__ == "__main__":
    main()
