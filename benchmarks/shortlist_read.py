"""What a shortlist costs to read: K random videos of a store, HDF5 against Zarr.

Writes a store of ``--videos`` videos of ViT-B/32 shape (F = 12, D = 512, float16) in each
backend (temp dir), then times ``FeatureStore.read_videos`` of K random videos (sorted,
as the search reads them) for K in {10, 100, 1000}: median ms a read and us a video over
``--repeats`` reads, with the chunk layout of ``videos/frames``.

    python benchmarks/shortlist_read.py [--videos 20000] [--repeats 30]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from dab_pipeline.store import open_store
from dab_pipeline.testing import empty_store


def build(path: Path, n: int, f: int, d: int) -> None:
    st = empty_store(path, n, splits="test", num_frames=f, dim=d, dtype="float16", manifest={"model": "x"})
    rng = np.random.default_rng(0)
    with st:
        for a in range(0, n, 4096):
            b = min(a + 4096, n)
            st.write_videos(
                np.arange(a, b),
                rng.standard_normal((b - a, f, d)).astype(np.float16),
                np.ones((b - a, f), bool),
                np.full(b - a, f),
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--videos", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    f, d = 12, 512
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in (".h5", ".zarr"):
            path = Path(tmp) / f"store{suffix}"
            build(path, args.videos, f, d)
            with open_store(path) as st:
                raw = st.raw_backend.raw("videos/frames")
                chunks = getattr(raw, "chunks", None)
                for k in (10, 100, 1000):
                    times = []
                    for _ in range(args.repeats):
                        rows = np.sort(rng.choice(args.videos, k, replace=False))
                        t0 = time.perf_counter()
                        st.read_videos(rows)
                        times.append(time.perf_counter() - t0)
                    ms = 1000 * float(np.median(times))
                    print(
                        f"{suffix[1:]:5} chunks {str(chunks):18} K={k:5}: {ms:8.2f} ms a read, "
                        f"{1000 * ms / k:7.1f} us a video ({f * d * 2 / 1024:.0f} KiB of features a video)"
                    )


if __name__ == "__main__":
    main()
