"""Feature-store read speed: the library's read paths against naive indexing.

Builds a 1000-video store of each backend in a temp dir (F=12, D=512, float16,
5 captions per video, splits assigned at random so a split is many short runs)
and prints milliseconds per 32-video random batch for

* ``read_videos`` (the library: sorted unique rows, one read per run of
  consecutive rows; zarr chunk files read directly when uncompressed),
* naive fancy indexing of the same array (h5py ``ds[sorted_idx]``, zarr ``oindex``),
* naive one-call-per-row through h5py / zarr,

plus ``load_split`` times and the on-disk size. A second, smaller store with
token grids (K>0: F=12, L=50, W=768) times ``read_vision_states`` for 8 videos.

    python benchmarks/store_read.py [--videos 1000] [--repeats 30] [--token-videos 96]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from dab_pipeline.store import open_store
from dab_pipeline.testing import empty_store  # noqa: E402


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds per call (after one warm-up call)."""
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return 1000 * float(np.median(out))


def build(
    path: Path, n: int, f: int, d: int, captions_per_video: int, rng: np.random.Generator, vision_state_shape=None
) -> float:
    split = rng.choice(["train", "val", "test"], size=n, p=[0.7, 0.1, 0.2])
    cvid = np.repeat(np.arange(n), captions_per_video)
    extra = {}
    if vision_state_shape is not None:
        extra = {
            "vision_state_shape": vision_state_shape,
            "text_state_width": 8,
            "text_state_lengths": np.full(len(cvid), 2),
        }
    t = time.perf_counter()
    with empty_store(
        path,
        n,
        captions_per_video=captions_per_video,
        splits=split,
        video_id="video{i}",
        caption_id="{video}#{q}",
        caption_text=lambda q, v: f"a caption about video {v}",
        manifest={"benchmark": True},
        num_frames=f,
        dim=d,
        dtype="float16",
        **extra,
    ) as s:
        b = 32
        for a in range(0, n, b):
            idx = np.arange(a, min(a + b, n))
            states = None
            if vision_state_shape is not None:
                states = rng.standard_normal((len(idx), f, *vision_state_shape), dtype=np.float32).astype(np.float16)
            s.write_videos(
                idx, rng.standard_normal((len(idx), f, d)), np.ones((len(idx), f), bool), np.full(len(idx), 100), states
            )
        for a in range(0, len(cvid), 256):
            q = np.arange(a, min(a + 256, len(cvid)))
            ts = [np.zeros((2, 8))] * len(q) if vision_state_shape is not None else None
            s.write_captions(q, rng.standard_normal((len(q), d)), ts)
    return time.perf_counter() - t


def disk_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--token-videos", type=int, default=96, help="videos in the token-grid store (0 skips it)")
    args = ap.parse_args()
    f, d, batch = 12, 512, 32
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        print(
            f"store: {args.videos} videos, F={f}, D={d}, float16, 5 captions/video, random splits; batch {batch}; median ms"
        )
        print(
            f"{'backend':8} {'write s':>8} {'MB':>6} {'read_videos':>12} {'fancy':>8} {'per-row':>8} {'load train':>11} {'load test':>10}"
        )
        for suffix in (".h5", ".zarr"):
            path = Path(tmp) / f"bench{suffix}"
            write_s = build(path, args.videos, f, d, 5, rng)
            batches = [np.sort(rng.choice(args.videos, batch, replace=False)) for _ in range(args.repeats + 1)]
            with open_store(path) as s:
                it = iter(batches * 3)
                t_lib = timed(lambda: s.read_videos(next(it)), args.repeats)
                arr = s.raw_backend.raw("videos/frames")  # the raw h5py dataset / zarr array, for the naive baselines
                it = iter(batches * 3)
                if suffix == ".h5":
                    t_fancy = timed(lambda: arr[next(it)].astype(np.float32), args.repeats)
                else:
                    t_fancy = timed(lambda: arr.oindex[next(it)].astype(np.float32), args.repeats)
                it = iter(batches * 3)
                t_rows = timed(lambda: np.stack([arr[int(i)] for i in next(it)]).astype(np.float32), args.repeats)
                t_train = timed(lambda: s.load_split("train"), 3)
                t_test = timed(lambda: s.load_split("test"), 3)
            print(
                f"{suffix[1:]:8} {write_s:8.2f} {disk_bytes(path) / 1e6:6.1f} {t_lib:12.2f} {t_fancy:8.2f} {t_rows:8.2f} "
                f"{t_train:11.1f} {t_test:10.1f}"
            )
        if args.token_videos:
            n, shape, b = args.token_videos, (50, 768), 8
            print(
                f"\ntoken grids: {n} videos, states (F={f}, L={shape[0]}, W={shape[1]}) float16, batch {b}; median ms"
            )
            print(f"{'backend':8} {'MB':>6} {'read_vision_states':>19} {'fancy':>8}")
            for suffix in (".h5", ".zarr"):
                path = Path(tmp) / f"tokens{suffix}"
                build(path, n, f, d, 1, rng, vision_state_shape=shape)
                batches = [np.sort(rng.choice(n, b, replace=False)) for _ in range(10)]
                with open_store(path) as s:
                    it = iter(batches * 3)
                    t_lib = timed(lambda: s.read_vision_states(next(it)), 8)
                    arr = s.raw_backend.raw("videos/states")
                    it = iter(batches * 3)
                    if suffix == ".h5":
                        t_fancy = timed(lambda: arr[next(it)], 8)
                    else:
                        t_fancy = timed(lambda: arr.oindex[next(it)], 8)
                print(f"{suffix[1:]:8} {disk_bytes(path) / 1e6:6.0f} {t_lib:19.2f} {t_fancy:8.2f}")


if __name__ == "__main__":
    main()
