"""Written and missing chunks, verify (store/integrity.py): a lost Zarr chunk is damage, not zeros."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import StoreError
from dab_pipeline.store import (
    open_store,
)

from ..helpers.store_rows import make_store, write_all


def test_a_deleted_zarr_chunk_is_damage_not_zeros(tmp_path: Path) -> None:
    """Zarr reads a missing chunk file as zeros: a store must know the chunks it wrote, refuse to read one that is
    gone by its name, say so in inspect, and the same extract command must write those rows again."""
    path = tmp_path / "s.zarr"
    with make_store(path, n=12) as s:
        write_all(s)
    with open_store(path) as s:
        assert s.is_complete and s.missing_chunks() == [] and s.verify() == []
        raw = s.raw_backend.raw_chunks("videos/frames")
        victim = raw.chunk_file(0)
    os.remove(victim)
    with open_store(path) as s:
        ((name, chunk, rows),) = s.missing_chunks()
        assert name == "videos/frames" and chunk == victim and rows >= 1
        assert not s.is_complete and s.summary()["missing_chunks"] == 1 and not s.summary()["complete"]
        with pytest.raises(StoreError, match=f"chunk file {victim} of array 'videos/frames' is missing"):
            s.load_split("train")
        with pytest.raises(StoreError, match="is damaged: 1 chunk file"):
            s.require_complete("dab train")
        assert any("is missing" in p for p in s.verify())
    # resuming the extraction marks every written row of the lost chunk as not extracted
    with open_store(path, "a") as s:
        videos, captions = s.reopen_damaged()
        assert videos >= 1 and captions == 0 and len(s.pending_videos()) == videos


@pytest.mark.parametrize("suffix", [".h5", ".zarr"])
def test_verify_passes_on_an_intact_store_and_finds_a_short_chunk(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"s{suffix}"
    with make_store(path, n=6) as s:
        write_all(s)
    with open_store(path) as s:
        assert s.verify() == []
        if suffix == ".zarr":
            chunk = s.raw_backend.raw_chunks("captions/features").chunk_file(0)
    if suffix == ".zarr":
        with open(chunk, "r+b") as fh:
            fh.truncate(10)
        with open_store(path) as s:
            assert any("holds 10 bytes" in p for p in s.verify())


@pytest.mark.parametrize("suffix", [".h5", ".zarr"])
def test_verify_finds_features_zeroed_since_they_were_written(tmp_path: Path, suffix: str) -> None:
    """Issue 50, 5: zeroed feature bytes passed `dab inspect --verify`, and a search then returned equal costs with a
    margin of 0. Each row's CRC-32 is written with its features and checked by verify."""
    from ..helpers.runner import invoke

    path = tmp_path / f"s{suffix}"
    with make_store(path, n=6) as s:
        write_all(s)
        assert "videos/checksum" in s._specs
    with open_store(path) as s:
        assert s.verify() == []
        frames_row = s.read_videos([2])[0][0]  # (F, D) of the third video
    with open_store(path, "a") as s:  # zeros over one video's and one caption's features, written around the checks
        s.raw_backend.write_range("videos/frames", 2, np.zeros((1, *frames_row.shape), s._specs["videos/frames"].dtype))
        s.raw_backend.write_range("captions/features", 0, np.zeros((1, s.dim), s._specs["captions/features"].dtype))
    with open_store(path) as s:
        problems = s.verify()
        ids = s.video_ids
    assert any("1 videos' features no longer match" in p and str(ids[2]) in p for p in problems), problems
    assert any("1 captions' features no longer match" in p for p in problems), problems
    out = invoke(["inspect", path, "--verify"])
    assert out.exit_code != 0 and "no longer match the checksums" in out.output
