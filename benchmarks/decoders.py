"""Video decoders side by side: which frames each returns, and how fast.

For every file, each backend of ``dab_pipeline.video`` (``pyav``, the default;
``pyav-seek``; ``decord``) decodes the 12 sampled frames:

* **exact**: the backend's frames against ``video.reference.read_every_frame``
  (a plain sequential PyAV read of every frame, not dab's decoders), at native size; the number
  shown is the largest mean absolute pixel difference over the 12 slots (0 is
  exact; a wrong frame is typically 10-50);
* **speed**: milliseconds per video at the extraction's decode size (short side
  224), mean +- std over ``--repeats`` interleaved rounds, and the ratio to
  ``pyav`` (below 1: faster than the default).

Files: generated clips of every format in ``synthetic.VIDEO_FORMATS`` (a
panning texture, ``--frames`` frames at ``--size``), a long x264 clip
(``--long-frames``, GOP 50) and, with ``--videos-dir``, every video file in that
folder (e.g. real dataset clips).

    python benchmarks/decoders.py [--frames 300] [--size 320x240] [--long-frames 3000]
        [--repeats 5] [--videos-dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import av
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract import moving_frames, parse_size  # noqa: E402  (the benchmarks' shared clip content)

from dab_pipeline.core.errors import VideoDecodeError  # noqa: E402
from dab_pipeline.video import BACKENDS, decode_video  # noqa: E402
from dab_pipeline.video.reference import read_every_frame  # noqa: E402
from dab_pipeline.video.synthetic import VIDEO_FORMATS, write_video  # noqa: E402

SUFFIXES = (".mp4", ".avi", ".webm", ".mkv", ".mov", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv", ".3gp")


def exactness(path: Path, backend: str) -> Optional[float]:
    """Largest per-slot mean |difference| to the reference frames at the backend's indices (None: failed)."""
    try:
        dec = decode_video(path, 12, None, backend)
    except VideoDecodeError:
        return None
    ref = read_every_frame(path)
    worst = 0.0
    for slot, i in enumerate(dec.indices):
        r = ref[min(int(i), len(ref) - 1)]
        f = dec.frames[slot]
        if r.shape != f.shape:  # rotated file: compare as displayed is not possible against raw frames
            return float("nan")
        worst = max(worst, float(np.abs(f.astype(np.int16) - r.astype(np.int16)).mean()))
    return worst


def timings(paths: list[Path], repeats: int) -> dict[tuple[str, str], list[float]]:
    """Seconds per (file, backend), interleaved: every round decodes every file with every backend."""
    out: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):
        for p in paths:
            for b in BACKENDS:
                t0 = time.perf_counter()
                try:
                    decode_video(p, 12, 224, b)
                except VideoDecodeError:
                    continue
                out.setdefault((str(p), b), []).append(time.perf_counter() - t0)
    return out


def make_clips(root: Path, frames: int, size: tuple[int, int], long_frames: int) -> list[Path]:
    w, h = size
    content = moving_frames(0, frames, w, h)
    paths = [write_video(root / f"{name}{spec.suffix}", content, fmt=name) for name, spec in VIDEO_FORMATS.items()]
    if long_frames:
        long = moving_frames(1, long_frames, w, h)
        paths.append(write_video(root / f"long-x264-{long_frames}.mp4", long, fmt="x264-bframes"))
    return paths


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=300, help="frames of each generated clip (default 300: 12 s)")
    ap.add_argument("--size", type=parse_size, default=(320, 240), help="generated frame size WxH (default 320x240)")
    ap.add_argument("--long-frames", type=int, default=3000, help="frames of the long clip (0: none; default 3000)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (default 5)")
    ap.add_argument("--videos-dir", type=Path, default=None, help="also every video file in this folder")
    ap.add_argument("--json", action="store_true", help="print machine-readable results only")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_clips(Path(tmp), args.frames, args.size, args.long_frames)
        if args.videos_dir:
            paths += sorted(p for p in args.videos_dir.iterdir() if p.suffix.lower() in SUFFIXES)
        exact = {(str(p), b): exactness(p, b) for p in paths for b in BACKENDS}
        times = timings(paths, args.repeats)
        used = {}
        for p in paths:
            for b in BACKENDS:
                try:
                    used[(str(p), b)] = decode_video(p, 12, 224, b).backend
                except VideoDecodeError as exc:
                    used[(str(p), b)] = f"failed: {exc}"[:60]
        rows = []
        for p in paths:
            base = statistics.mean(times[(str(p), "pyav")]) if (str(p), "pyav") in times else None
            for b in BACKENDS:
                t = times.get((str(p), b))
                rows.append(
                    {
                        "file": p.name,
                        "backend": b,
                        "decoded_by": used[(str(p), b)],
                        "ms_mean": statistics.mean(t) * 1e3 if t else None,
                        "ms_std": statistics.pstdev(t) * 1e3 if t else None,
                        "ratio_to_pyav": statistics.mean(t) / base if t and base else None,
                        "max_slot_diff": exact[(str(p), b)],
                    }
                )
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "pyav": av.__version__,
        },
        "args": {k: str(v) for k, v in vars(args).items()},
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(rows)
    return result


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else ("n/a" if v != v else format(v, spec))


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'file':28s} {'backend':10s} {'decoded by':12s} {'ms/video':>16s} {'vs pyav':>8s} {'max diff':>9s}")
    for r in rows:
        ms = "-" if r["ms_mean"] is None else f"{r['ms_mean']:.1f} +- {r['ms_std']:.1f}"
        print(
            f"{r['file'][:28]:28s} {r['backend']:10s} {r['decoded_by'][:12]:12s} {ms:>16s} "
            f"{_fmt(r['ratio_to_pyav'], '.2f'):>8s} {_fmt(r['max_slot_diff'], '.2f'):>9s}"
        )
    print(
        "max diff: largest mean |pixel difference| over the 12 slots against a plain sequential read "
        "(0 = the right frames)"
    )


if __name__ == "__main__":
    main()
