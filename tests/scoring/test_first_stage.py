"""The first stage both search paths share: its in-memory source against brute force and against a FAISS
index of the same vectors, down to the Searcher's two paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.index import build_index, load_index, query_vectors, video_vectors
from dab_pipeline.scoring import (
    DEFAULT_SHORTLIST,
    ExactVectors,
    Scorer,
    first_stage,
    frame_mean_vectors,
    text_vectors,
)
from dab_pipeline.search import Searcher
from dab_pipeline.store import open_store
from dab_pipeline.testing import random_store

from ..helpers.models import hand_made_run, random_inputs, small_model

V_TEST = 24  # random_store's first 24 videos are "test", the last 6 "train"


def brute_force(text: torch.Tensor, frames: torch.Tensor, mask: torch.Tensor, k: int) -> np.ndarray:
    """The cosine shortlist written out: each query's k videos by the cosine of the text and the real frames' mean."""
    m = mask.float()[..., None]
    mean = (frames * m).sum(1) / m.sum(1).clamp_min(1)
    sim = torch.nn.functional.normalize(text, dim=-1) @ torch.nn.functional.normalize(mean, dim=-1).T  # (Q, V)
    return np.argsort(-sim.numpy(), axis=1, kind="stable")[:, :k]


def test_the_cosine_shortlist_uses_the_index_mean_vectors() -> None:
    text, frames, mask, _ = random_inputs(q=5, v=9, frames=6)  # two videos with padded frames
    np.testing.assert_allclose(
        frame_mean_vectors(frames, mask).numpy(), video_vectors("mean", frames, mask)[:, 0], atol=1e-6
    )
    np.testing.assert_allclose(text_vectors(text).numpy(), query_vectors("mean", text), atol=1e-6)


def test_first_stage_over_vectors_in_memory_is_brute_force() -> None:
    text, frames, mask, _ = random_inputs(q=7, v=9, frames=6)
    videos = ExactVectors(frame_mean_vectors(frames, mask), torch.device("cpu"), rows_per_block=3)
    np.testing.assert_array_equal(first_stage(text_vectors(text), videos, 4), brute_force(text, frames, mask, 4))
    assert first_stage(text_vectors(text), videos).shape == (7, min(DEFAULT_SHORTLIST, 9))  # K > V: every video
    with pytest.raises(ConfigError, match="shortlist"):
        first_stage(text_vectors(text), videos, 0)
    scorer = Scorer(small_model("dab"))
    cand = scorer.candidates(text, frames, mask, 4)
    np.testing.assert_array_equal(cand, brute_force(text, frames, mask, 4))
    scored = np.isfinite(scorer.score(text, frames, mask, shortlist=4).cost)  # what score(shortlist=) scores
    np.testing.assert_array_equal(scored, _mask_of(cand, 9))


def _mask_of(cand: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((len(cand), n), bool)
    np.put_along_axis(out, cand, True, axis=1)
    return out


@pytest.fixture(scope="module")
def searchable(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 30-video store (D = 32, the hand-made run's), a run on it and a Flat index of the ``mean`` vectors."""
    pytest.importorskip("faiss")
    root = tmp_path_factory.mktemp("first-stage")
    store = random_store(root / "s.h5", n_videos=30, dim=32, splits=["test"] * V_TEST + ["train"] * 6)
    run, model = hand_made_run(root / "run", store)
    with open_store(store) as st:
        build_index(st, root / "index", split="test", vector="mean", factory="Flat")
        feats = st.load_split("test")
        text = st.read_captions(np.arange(8))  # (8, D): captions of the first test videos
    return {"store": store, "run": run, "model": model, "index": root / "index", "feats": feats, "text": text}


def test_the_index_and_the_cosine_shortlist_pick_the_same_candidates(searchable: dict) -> None:
    feats, text = searchable["feats"], torch.as_tensor(searchable["text"])
    in_memory = Scorer(searchable["model"]).candidates(text, feats.frames, feats.frame_mask, 5)  # split positions
    index = load_index(searchable["index"])
    try:
        rows = first_stage(query_vectors("mean", text), index, 5)  # store rows: the test split is rows 0..23
    finally:
        index.close()
    np.testing.assert_array_equal(rows, in_memory)
    np.testing.assert_array_equal(
        in_memory, brute_force(text, torch.as_tensor(feats.frames), torch.as_tensor(feats.frame_mask), 5)
    )


def test_the_searcher_shortlists_the_same_videos_with_and_without_its_index(searchable: dict) -> None:
    text, queries = searchable["text"], [f"q{i}" for i in range(len(searchable["text"]))]
    with (
        Searcher(searchable["run"], searchable["store"], device="cpu", encoder=False) as plain,
        Searcher(
            searchable["run"], searchable["store"], index=searchable["index"], device="cpu", encoder=False
        ) as indexed,
    ):
        a = plain.rank(queries, text, k=3, shortlist=5)
        b = indexed.rank(queries, text, k=3, shortlist=5)
    for x, y in zip(a, b):
        assert x.shortlist == y.shortlist == 5
        assert set(x.video_ids[np.isfinite(x.costs)]) == set(y.video_ids)  # the same five videos scored
        assert [h.video_id for h in x.hits] == [h.video_id for h in y.hits]
        np.testing.assert_allclose([h.cost for h in x.hits], [h.cost for h in y.hits], rtol=1e-4, atol=1e-6)
