"""F = 64 end to end (issue 37: the peers sample 64 frames for DiDeMo and ActivityNet): `dab extract --frames 64`
gives a store whose F is 64, and a run on such a store trains, evaluates, is indexed and searched (the
rest of the suite runs at F = 4 and 12)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dab_pipeline.store import open_store
from dab_pipeline.testing import random_store

from ..helpers.models import hand_made_run
from ..helpers.runner import extract_args, invoke
from ..helpers.stores import SEARCH_CAPTIONS, text_store
from ..helpers.training import SMALL_TRAIN


def test_extract_frames_64_gives_a_store_of_64_frames(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "f64.h5"
    res = invoke(extract_args(tiny_folder_dataset, "--frames", "64", out=out), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    with open_store(out) as st:
        assert st.manifest["frames"] == 64
        test = st.load_split("test")
        frames, mask = np.asarray(test.frames), np.asarray(test.frame_mask)
    assert frames.shape[1] == 64 and mask.shape[1] == 64
    assert np.isfinite(frames[mask]).all() and mask.any(axis=1).all()


def test_a_dab_run_on_64_frames_trains_evaluates_and_is_indexed(tmp_path: Path) -> None:
    store = random_store(tmp_path / "f64.h5", frames=64)
    run = tmp_path / "run"
    sets = [x for s in [*SMALL_TRAIN, "epochs=1"] for x in ("--set", s)]
    res = invoke(["train", "--features", store, "--out", run, "--variant", "dab", *sets], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    res = invoke(["evaluate", "--run", run, "--no-plots"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads((run / "metrics.json").read_text())["t2v"]["R@1"] >= 0
    idx = tmp_path / "idx"
    res = invoke(["index", "--features", store, "--out", idx, "--vector", "pooled", "--run", run])
    assert res.exit_code == 0, res.output


def test_search_on_64_frames_with_and_without_an_index_agree(tmp_path: Path) -> None:
    store = text_store(tmp_path / "f64.h5", frames=64)
    run, _ = hand_made_run(tmp_path / "run", store, "dab")
    idx = tmp_path / "idx"
    res = invoke(["index", "--features", store, "--out", idx, "--vector", "pooled", "--run", run])
    assert res.exit_code == 0, res.output
    hits = []
    for extra in ([], ["--index", idx, "--shortlist", "6"]):
        args = ["search", "--run", run, "--features", store, "--device", "cpu", "-k", "3", "--json", *extra]
        res = invoke([*args, SEARCH_CAPTIONS[1]])
        assert res.exit_code == 0, res.output
        hits.append([h["video_id"] for h in json.loads(res.output)[0]["hits"]])
    assert len(hits[0]) == 3 and hits[0] == hits[1]
