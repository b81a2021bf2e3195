"""Long videos (ActivityNet's 2-3 minutes): sampling 64 frames against reading the whole file, and extraction at F = 12
and F = 64 with a ViT-B/32 of the real shape.

Generates ``--videos`` clips per GOP length (``--gops``, default 60, 300 and 0 = one key frame for the whole file) of
``--seconds`` seconds at ``--fps`` (default 120 s at 30 fps: 3600 frames), ``--size`` (default 320x240), x264
(veryfast, CRF 23, 3 B-frames, scene cuts off so the GOP is what was asked), streamed to disk frame by frame (the
content of ``benchmarks/extract.py``: a panning texture with a bouncing box). Then, in interleaved rounds:

* **decode**: per file, in videos/s (mean ± std over ``--repeats`` rounds), the same PyAV decoder four ways:
  ``whole file`` (every frame decoded and converted to RGB at native size: the full cost),
  ``decode only`` (every frame decoded, none converted), ``pyav`` (dab's default decoder: every frame decoded, the
  64 sampled ones converted) and ``pyav-seek`` (seeks to the key frame before each sampled frame); ratios against
  ``whole file``;
* **extract** (``--extract``): ``run_extract`` on the long videos as a ``folder`` dataset at F = 12 and F = 64
  (``--decoder``, default pyav-seek), open_clip ViT-B-32 with deterministic random weights (no real weights can be
  downloaded here; speed does not depend on the weight values): seconds per video of the video phase and of the
  whole call, and the store's bytes per video (the frame features array, and the file).

Everything generated goes to a temporary folder, deleted at the end.

    python benchmarks/long_videos.py [--seconds 120] [--fps 30] [--size 320x240] [--gops 60,300,0] [--videos 1]
        [--frames 64] [--repeats 3] [--extract] [--extract-repeats 2] [--decoder pyav-seek] [--json]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import av
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract import iter_moving_frames, machine, parse_size, random_weights  # noqa: E402  (the benchmarks' shared parts)

from dab_pipeline.stages.extract import ExtractConfig, run_extract  # noqa: E402
from dab_pipeline.store import open_store  # noqa: E402
from dab_pipeline.video import decode_video  # noqa: E402

WAYS = ("whole file", "decode only", "pyav", "pyav-seek")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_long_video(path: Path, seed: int, frames: int, fps: int, size: tuple[int, int], gop: int) -> Path:
    """An x264 mp4 written frame by frame (a long video does not fit in memory as one array); gop 0: one key frame."""
    w, h = size
    keyint = gop if gop > 0 else frames + 1
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {
            "crf": "23",
            "preset": "veryfast",
            "x264-params": f"keyint={keyint}:min-keyint={keyint}:scenecut=0:bframes=3:threads=1",
        }
        for img in iter_moving_frames(seed, frames, w, h):
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def read_whole(path: Path, convert: bool) -> int:
    """Every frame decoded by PyAV with one thread, as dab's decoders do; ``convert``: each also converted to RGB and
    dropped (reading the whole file at full cost, without holding minutes of frames in memory); else none converted
    (the floor of any sequential reader)."""
    n = 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        for frame in container.decode(stream):
            if convert:
                frame.to_ndarray(format="rgb24")
            n += 1
    return n


def time_way(path: Path, way: str, frames: int) -> float:
    t0 = time.perf_counter()
    if way in ("whole file", "decode only"):
        read_whole(path, convert=way == "whole file")
    else:
        dec = decode_video(path, frames, None, way)
        if way == "pyav-seek" and dec.backend != "pyav-seek":
            raise RuntimeError(f"{path.name}: pyav-seek fell back to {dec.backend}")
    return time.perf_counter() - t0


def decode_rounds(paths: dict[str, list[Path]], frames: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per (GOP case, way), each round every file every way (interleaved, so load hits all alike)."""
    out: dict[str, dict[str, list[float]]] = {g: {w: [] for w in WAYS} for g in paths}
    for r in range(repeats):
        log(f"decode round {r + 1}/{repeats} (load average {os.getloadavg()[0]:.2f})")
        for gop, files in paths.items():
            for way in WAYS:
                out[gop][way].append(sum(time_way(p, way, frames) for p in files))
    return out


def decode_table(times: dict[str, dict[str, list[float]]], videos: int) -> list[dict[str, Any]]:
    rows = []
    for gop, ways in times.items():
        base = statistics.mean(ways["whole file"])
        for way, secs in ways.items():
            rates = [videos / s for s in secs]
            rows.append(
                {
                    "gop": gop,
                    "way": way,
                    "videos_per_s": statistics.mean(rates),
                    "std": statistics.pstdev(rates),
                    "ms_per_video": statistics.mean(secs) / videos * 1e3,
                    "speed_vs_whole_file": base / statistics.mean(secs),
                }
            )
    return rows


def write_captions(root: Path, files: list[Path]) -> Path:
    path = root / "captions.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        wr = csv.DictWriter(fh, fieldnames=["video", "caption", "split"])
        wr.writeheader()
        for p in files:
            wr.writerow({"video": p.name, "caption": "a box bounces over moving stripes", "split": "test"})
    return path


def extract_once(root: Path, csv_path: Path, weights: str, frames: int, decoder: str) -> dict[str, float]:
    """run_extract into a fresh store; seconds (whole call, video phase) and the store's bytes."""
    marks: dict[str, float] = {}

    def progress(ev) -> None:
        if ev.kind in ("start", "end") and ev.task == "videos":
            marks[ev.kind] = time.perf_counter()

    out = root / f"store-F{frames}.h5"
    cfg = ExtractConfig(
        dataset="folder",
        out=out,
        videos=root / "videos",
        annotations=csv_path,
        model="ViT-B-32",
        pretrained=weights,
        frames=frames,
        compute_dtype="auto",
        decode_backend=decoder,
        overwrite=True,
    )
    t0 = time.perf_counter()
    res = run_extract(cfg, progress=progress)
    total = time.perf_counter() - t0
    with open_store(out) as st:
        arrays = st.summary().get("arrays", {})
        dtype = st.manifest["compute_dtype"]
    frames_bytes = arrays["videos/frames"]["nbytes"]
    file_bytes = out.stat().st_size
    out.unlink()
    return {"total": total, "videos": marks["end"] - marks["start"], "n": res.videos_ok, "frames_bytes": frames_bytes,
            "file_bytes": file_bytes, "compute_dtype": dtype}  # fmt: skip


def extract_rounds(root: Path, files: list[Path], repeats: int, decoder: str) -> dict[int, list[dict[str, float]]]:
    csv_path = write_captions(root, files)
    weights = random_weights("ViT-B-32", root)
    out: dict[int, list[dict[str, float]]] = {12: [], 64: []}
    for r in range(repeats):
        for frames in out:
            log(f"extract round {r + 1}/{repeats}, F = {frames} (load average {os.getloadavg()[0]:.2f})")
            got = extract_once(root, csv_path, weights, frames, decoder)
            if got["n"] != len(files):
                raise RuntimeError(f"F = {frames}: {got['n']} of {len(files)} videos encoded")
            out[frames].append(got)
    return out


def extract_table(runs: dict[int, list[dict[str, float]]]) -> list[dict[str, Any]]:
    rows = []
    for frames, rs in runs.items():
        n = rs[0]["n"]
        per_video = [r["videos"] / n for r in rs]
        whole = [r["total"] / n for r in rs]
        rows.append(
            {
                "frames": frames,
                "s_per_video": statistics.mean(per_video),
                "std": statistics.pstdev(per_video),
                "s_per_video_whole_call": statistics.mean(whole),
                "frames_bytes_per_video": (rs[0]["frames_bytes"] or 0) / n,
                "file_bytes_per_video": rs[0]["file_bytes"] / n,
                "compute_dtype": rs[0]["compute_dtype"],
            }
        )
    return rows


def make_files(root: Path, args) -> dict[str, list[Path]]:
    vdir = root / "videos"
    vdir.mkdir(parents=True)
    n = args.seconds * args.fps
    paths: dict[str, list[Path]] = {}
    for g in args.gops:
        label = f"gop {g}" if g else "one key frame"
        paths[label] = []
        for i in range(args.videos):
            t0 = time.perf_counter()
            p = write_long_video(vdir / f"long-g{g}-{i}.mp4", 100 + i, n, args.fps, args.size, g)
            log(f"wrote {p.name}: {n} frames, {p.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")
            paths[label].append(p)
    return paths


def print_tables(result: dict[str, Any]) -> None:
    print(f"decode, {result['config']['frames']} frames sampled; videos/s mean ± std over the rounds")
    print(f"{'GOP':14s} {'way':12s} {'videos/s':>16s} {'ms/video':>9s} {'x whole file':>13s}")
    for r in result["decode"]:
        rate = f"{r['videos_per_s']:.2f} ± {r['std']:.2f}"
        print(f"{r['gop']:14s} {r['way']:12s} {rate:>16s} {r['ms_per_video']:9.0f} {r['speed_vs_whole_file']:13.2f}")
    if result.get("extract"):
        print(f"extract, ViT-B-32 random weights, decoder {result['config']['decoder']}")
        print(
            f"{'F':>3s} {'s/video (videos)':>18s} {'s/video (call)':>15s} {'frames B/video':>15s} {'file B/video':>13s}"
        )
        for r in result["extract"]:
            sv = f"{r['s_per_video']:.2f} ± {r['std']:.2f}"
            print(
                f"{r['frames']:3d} {sv:>18s} {r['s_per_video_whole_call']:15.2f} "
                f"{r['frames_bytes_per_video']:15,.0f} {r['file_bytes_per_video']:13,.0f}  ({r['compute_dtype']})"
            )


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=120, help="length of each generated video (default 120)")
    ap.add_argument("--fps", type=int, default=30, help="frame rate of the generated videos (default 30)")
    ap.add_argument("--size", type=parse_size, default=(320, 240), help="frame size WxH (default 320x240)")
    ap.add_argument("--gops", default="60,300,0", help="GOP lengths in frames, 0: one key frame (default 60,300,0)")
    ap.add_argument("--videos", type=int, default=1, help="videos per GOP length (default 1)")
    ap.add_argument("--frames", type=int, default=64, help="frames sampled in the decode comparison (default 64)")
    ap.add_argument("--repeats", type=int, default=3, help="decode rounds (default 3)")
    ap.add_argument("--extract", action="store_true", help="also extract at F = 12 and F = 64 with ViT-B-32")
    ap.add_argument("--extract-repeats", type=int, default=2, help="extraction rounds (default 2)")
    ap.add_argument("--decoder", default="pyav-seek", help="the extraction's --decoder (default pyav-seek)")
    ap.add_argument("--json", action="store_true", help="print machine-readable results only")
    args = ap.parse_args(argv)
    args.gops = [int(g) for g in args.gops.split(",")]
    result: dict[str, Any] = {"machine": machine(), "config": {k: str(v) for k, v in vars(args).items()}}
    result["config"]["frames"] = args.frames
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dab-bench-long-") as tmp:
        root = Path(tmp)
        paths = make_files(root, args)
        result["video_bytes"] = {g: int(np.mean([p.stat().st_size for p in ps])) for g, ps in paths.items()}
        result["decode"] = decode_table(decode_rounds(paths, args.frames, args.repeats), args.videos)
        if args.extract:
            files = [p for ps in paths.values() for p in ps]
            result["extract"] = extract_table(extract_rounds(root, files, args.extract_repeats, args.decoder))
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_tables(result)
        print(f"machine: {result['machine']['cpu']}, {result['machine']['nproc']} CPUs; load average "
              f"{result['machine']['loadavg_start']} -> {result['machine']['loadavg_end']}; {result['seconds']} s")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
