"""What dab wrote before keeps loading: a store (HDF5 and Zarr), a trained and evaluated run, an index and a sweep
folder written by an earlier version (tests/data/compat/, made by its make_fixtures.py) are read, evaluated,
searched, resumed and swept again by this one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.store import open_store

from .helpers.runner import invoke

FIXTURES = Path(__file__).resolve().parent / "data" / "compat"
SMALL = [
    "--set",
    "model.drift_hidden=16",
    "--set",
    "model.time_embed_dim=8",
    "--set",
    "model.steps=2",
    "--set",
    "batch_size=4",
    "--set",
    "lr=3e-3",
]


@pytest.fixture(params=sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def old(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of one version's fixtures, as the working directory (their paths are relative to it)."""
    root = tmp_path / request.param
    shutil.copytree(FIXTURES / request.param, root)
    monkeypatch.chdir(root)
    return root


def test_old_stores_open_and_both_backends_hold_the_same_features(old: Path) -> None:
    with open_store("store.h5") as h5, open_store("store.zarr") as zr:
        assert h5.is_complete and zr.is_complete and h5.num_videos == zr.num_videos == 14
        a, b = h5.load_split("test"), zr.load_split("test")
        assert list(a.video_ids) == list(b.video_ids) and np.array_equal(a.frames, b.frames)
        assert np.isfinite(a.frames).all()
    assert invoke(["inspect", "store.h5", "--verify"]).exit_code == 0
    assert invoke(["inspect", "store.zarr", "--verify"]).exit_code == 0


def test_an_old_run_evaluates_to_its_own_numbers_and_resumes_as_complete(old: Path) -> None:
    saved = json.loads((old / "run" / "metrics.json").read_text())
    res = invoke(["evaluate", "--run", "run", "--out", "again"])
    assert res.exit_code == 0, res.output
    now = json.loads((old / "again" / "metrics.json").read_text())
    for key in ("R@1", "R@5", "R@10", "MdR", "MnR"):
        assert now["t2v"][key] == pytest.approx(saved["t2v"][key]), key
    res = invoke(["train", "--resume", "--out", "run", "--quiet"])
    assert res.exit_code == 0 and "complete" in json.loads((old / "run" / "status.json").read_text())["state"]


def test_an_old_index_still_fits_its_store_and_searches(old: Path) -> None:
    pytest.importorskip("faiss")
    from dab_pipeline import Searcher

    with Searcher("run", "store.h5", index="index", device="cpu", encoder=False) as s:  # checks the fingerprint
        with open_store("store.h5") as st:
            text = st.read_captions(np.arange(3))
        results = s.rank(["a", "b", "c"], text, k=2, shortlist=4)
    assert all(len(r.hits) == 2 for r in results)


def test_an_old_sweep_is_reused_not_retrained(old: Path) -> None:
    stamps = {p: p.stat().st_mtime_ns for p in (old / "sweep").rglob("checkpoints/*.pt")}
    table = json.loads((old / "sweep" / "sweep.json").read_text())
    res = invoke(
        [
            "sweep",
            "--features",
            "store.zarr",
            "--out",
            "sweep",
            "--grid",
            "model.variant=prob",
            "--seeds",
            "1",
            "--set",
            "epochs=1",
            *SMALL,
            "--quiet",
        ]
    )
    assert res.exit_code == 0, res.output
    assert {p: p.stat().st_mtime_ns for p in (old / "sweep").rglob("checkpoints/*.pt")} == stamps
    again = json.loads((old / "sweep" / "sweep.json").read_text())
    assert again["rows"] == table["rows"]
