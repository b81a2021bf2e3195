"""The Zarr backend (store/backend_zarr.py): its direct chunk reads against zarr's own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import StoreError

from ..helpers.store_rows import D, F, make_store, write_all


def test_zarr_direct_chunk_reads_match_zarr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dab_pipeline.store.backend_zarr as zarr_backend

    # 5 rows of frames per chunk: 23 videos give an edge chunk of 3 rows, and
    # unwritten videos leave whole chunks absent.
    monkeypatch.setattr(zarr_backend, "ZARR_CHUNK_BYTES", 5 * F * D * 2)
    with make_store(tmp_path / "s.zarr", n=23, states="tokens") as s:
        written = [i for i in range(23) if not 5 <= i < 10]
        write_all(s, videos=written, states="tokens")
        frames = s.raw_backend.raw("videos/frames")
        assert frames.chunks[0] == 5
        rng = np.random.default_rng(0)
        for rows in (np.array(written), rng.choice(written, 9), np.array([22, 21, 20, 0])):
            got, _ = s.read_videos(rows)
            np.testing.assert_array_equal(got, frames.oindex[rows].astype(np.float32))
        np.testing.assert_array_equal(s.load_split("train").frames, frames.oindex[s.load_split("train").video_index])
        # a chunk file that lost its tail is reported, not misread
        chunk = Path(s.raw_backend.raw_chunks("videos/frames").chunk_file(4))
        chunk.write_bytes(chunk.read_bytes()[:100])
        with pytest.raises(StoreError, match="truncated"):
            s.read_videos([21])
