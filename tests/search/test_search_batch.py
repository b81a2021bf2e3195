"""Searcher.search_batch (issue 38): queries that arrive together, encoded in one batch and scored in one call,
each answered as it is answered alone; and score_shortlists, the batch's pass over its (query, video) pairs, against
score_query one query at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.index import build_index
from dab_pipeline.scoring import Scorer, score_query
from dab_pipeline.search import Searcher, SearchResult
from dab_pipeline.search import searcher as searcher_module
from dab_pipeline.search.pairs import score_shortlists
from dab_pipeline.store import open_store

from ..helpers.models import hand_made_run, random_inputs, small_model
from ..helpers.stores import SEARCH_CAPTIONS, text_store

pytest.importorskip("faiss")

CAPTIONS = [*SEARCH_CAPTIONS, "a bird on a wire", "snow falls on a city", "a boat on a lake", "kids play football"]
TEST_VIDEOS = 10
QUERIES = [CAPTIONS[0], CAPTIONS[4], "something else entirely", CAPTIONS[9], "a dog and a cat"]
KS = [1, 3, 2, 10, 5]  # one per query; 10 is more than a shortlist of 4 holds
RUNS = [("dab", "diag"), ("prob", "diag"), ("dab", "lowrank:2"), ("dab", "mixture:2")]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("batch")
    store = text_store(root / "store.h5", CAPTIONS, test_videos=TEST_VIDEOS, frames=4)
    with open_store(store) as st:
        build_index(st, root / "index", split="test")
    return {"store": store, "index": root / "index", "root": root}


@pytest.fixture(scope="module", params=RUNS, ids=[f"{v}-{c}" for v, c in RUNS])
def run(world: dict, request: pytest.FixtureRequest) -> Path:
    variant, cov = request.param
    path, _ = hand_made_run(world["root"] / f"run-{variant}-{cov}", world["store"], variant, {"covariance": cov})
    return path


def assert_same(got: SearchResult, alone: SearchResult) -> None:
    """The same hits in the same order, costs and margin within float32 tolerance, the same scored videos."""
    assert [(h.video_id, h.video_index, h.rank) for h in got.hits] == [
        (h.video_id, h.video_index, h.rank) for h in alone.hits
    ]
    np.testing.assert_allclose([h.cost for h in got.hits], [h.cost for h in alone.hits], rtol=1e-4, atol=1e-5)
    assert (got.margin is None) == (alone.margin is None)
    if alone.margin is not None:
        assert got.margin == pytest.approx(alone.margin, rel=1e-3, abs=1e-4)
    assert got.query == alone.query and got.shortlist == alone.shortlist
    assert list(got.video_ids) == list(alone.video_ids)
    np.testing.assert_allclose(got.costs, alone.costs, rtol=1e-4, atol=1e-5)  # +inf where not scored, on both


@pytest.mark.parametrize("shortlist", [None, 4])
@pytest.mark.parametrize("with_index", [True, False], ids=["index", "split"])
def test_a_batch_answers_each_query_as_it_is_answered_alone(
    world: dict, run: Path, with_index: bool, shortlist
) -> None:
    index = world["index"] if with_index else None
    with Searcher(run, world["store"], index=index, device="cpu") as s:
        batch = s.search_batch(QUERIES, KS, shortlist=shortlist)
        assert len(batch) == len(QUERIES)
        for q, k, got in zip(QUERIES, KS, batch):
            assert isinstance(got, SearchResult), got
            (alone,) = s.search([q], k=k, shortlist=shortlist)
            assert len(got.hits) == min(k, shortlist or TEST_VIDEOS)
            assert_same(got, alone)


def test_a_bad_query_gets_its_error_and_the_others_their_answers(world: dict, run: Path) -> None:
    queries, ks = [CAPTIONS[0], "   ", CAPTIONS[1], CAPTIONS[2]], [2, 2, 0, 3]
    with Searcher(run, world["store"], index=world["index"], device="cpu") as s:
        out = s.search_batch(queries, ks, shortlist=4)
        assert isinstance(out[1], ConfigError) and "non-empty" in str(out[1])
        assert isinstance(out[2], ConfigError) and "k must be a positive integer" in str(out[2])
        for i in (0, 3):
            assert_same(out[i], s.search([queries[i]], k=ks[i], shortlist=4)[0])
        s.encode = lambda texts: pytest.fail("nothing to encode")  # type: ignore[method-assign]
        assert all(isinstance(o, ConfigError) for o in s.search_batch(["", " "], 3))
        with pytest.raises(ConfigError, match="shortlist"):  # the batch's setting, not a query's
            s.search_batch([CAPTIONS[0]], 3, shortlist=0)


def test_an_index_with_the_runs_video_terms_answers_as_one_without(
    world: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dab index --video-terms: a search with that run passes each shortlist's terms to the re-rank (one query and a
    batch) and answers as the plain index does; another run's terms are not used, with a warning."""
    from dab_pipeline.runs.load import load_run
    from dab_pipeline.stages.index import IndexConfig, run_index

    run, _ = hand_made_run(tmp_path / "run", world["store"], "dab")
    run_index(IndexConfig(features=world["store"], out=tmp_path / "terms", run=run, video_terms=True))
    passed: list[bool] = []
    real = Scorer.score_queries

    def spy(self, text, frames, mask, shortlists, terms=None):
        passed.append(terms is not None and len(terms) == len(frames))
        return real(self, text, frames, mask, shortlists, terms)

    monkeypatch.setattr(Scorer, "score_queries", spy)
    with Searcher(run, world["store"], index=world["index"], device="cpu") as plain:
        want = [plain.search([q], k=k, shortlist=4)[0] for q, k in zip(QUERIES, KS)]
    assert passed and not any(passed)
    passed.clear()
    with Searcher(run, world["store"], index=tmp_path / "terms", device="cpu") as s:
        assert s.terms
        for q, k, alone in zip(QUERIES, KS, want):
            assert_same(s.search([q], k=k, shortlist=4)[0], alone)
        for got, alone in zip(s.search_batch(QUERIES, KS, shortlist=4), want):
            assert_same(got, alone)
    assert passed and all(passed)
    other, _ = hand_made_run(tmp_path / "other", world["store"], "dab", {"drift_hidden": 16})
    assert load_run(other, "cpu").checkpoint != load_run(run, "cpu").checkpoint
    warnings: list[str] = []
    with Searcher(other, world["store"], index=tmp_path / "terms", device="cpu", warn=warnings.append) as s:
        assert not s.terms and s.search([QUERIES[0]], k=2, shortlist=4)
    assert len(warnings) == 1 and "video terms of another run" in warnings[0]


def test_video_terms_of_a_run_re_ranked_by_its_own_path_are_refused_at_build_and_not_read(
    world: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dab low-rank run is re-ranked by the model's own path: dab index refuses its video terms in one line, and an
    index that holds them anyway (one built before that check) is searched without reading them, with a warning."""
    from dab_pipeline.index import VideoIndex
    from dab_pipeline.stages.index import IndexConfig, run_index

    run, _ = hand_made_run(tmp_path / "run", world["store"], "dab", {"covariance": "lowrank:2"})
    cfg = IndexConfig(features=world["store"], out=tmp_path / "terms", run=run, video_terms=True)
    with pytest.raises(ConfigError, match="own path"):
        run_index(cfg)
    assert not (tmp_path / "terms").exists()
    with monkeypatch.context() as m:  # as an index built before the check was
        m.setattr(Scorer, "takes_video_terms", lambda self: True)
        run_index(cfg)
    monkeypatch.setattr(VideoIndex, "video_terms", lambda self, rows: pytest.fail("terms read"))
    warnings: list[str] = []
    with Searcher(run, world["store"], index=tmp_path / "terms", device="cpu", warn=warnings.append) as s:
        assert not s.terms and s.search([QUERIES[0]], k=2, shortlist=4)[0].hits
        assert len(s.search_batch(QUERIES, KS, shortlist=4)) == len(QUERIES)
    assert len(warnings) == 1 and "re-ranked by its own path" in warnings[0]


@pytest.mark.parametrize("variant", ["dab", "xpool"])
def test_the_batch_reads_its_shortlists_once_and_scores_only_their_pairs_in_one_call(
    world: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """dab: one ``Scorer.score_queries`` call (each query through the engine's one-text path); xpool (no such path):
    one ``score_shortlists`` pass of aligned pairs. Either way the union is read once and only each query's own
    videos are scored."""
    run, _ = hand_made_run(tmp_path / "run", world["store"], variant)
    calls: list[tuple[str, int, list[np.ndarray]]] = []
    real, real_queries = searcher_module.score_shortlists, Scorer.score_queries

    def spy(model, text, frames, mask, shortlists, **kw):
        calls.append(("pairs", len(frames), [np.asarray(x) for x in shortlists]))
        return real(model, text, frames, mask, shortlists, **kw)

    def spy_queries(self, text, frames, mask, shortlists, terms=None):
        out = real_queries(self, text, frames, mask, shortlists, terms)
        if out is not None:
            calls.append(("engine", len(frames), [np.asarray(x) for x in shortlists]))
        return out

    monkeypatch.setattr(searcher_module, "score_shortlists", spy)
    monkeypatch.setattr(Scorer, "score_queries", spy_queries)
    with Searcher(run, world["store"], index=world["index"], device="cpu") as s:
        reads: list[np.ndarray] = []
        read = s.store.read_videos
        monkeypatch.setattr(s.store, "read_videos", lambda rows: (reads.append(np.asarray(rows)), read(rows))[1])
        s.search_batch(QUERIES, KS, shortlist=4)
    assert len(reads) == 1 and len(calls) == 1  # one read of the union, one scoring call
    assert calls[0][0] == ("engine" if variant == "dab" else "pairs")
    union = reads[0]
    assert list(union) == sorted(set(union.tolist())) and calls[0][1] == len(union)
    shortlists = calls[0][2]
    assert [len(x) for x in shortlists] == [4] * len(QUERIES)  # each query's own 4 videos: 20 pairs ...
    assert len(union) > 4  # ... of a union larger than one shortlist, so not every query against the union


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "variant, cov, kw",
    [("dab", "diag", {}), ("prob", "diag", {}), ("prob", "mixture:2", {}), ("dab", "mixture:2", {"drift": "constant"})],
)
def test_score_queries_equals_score_query_one_query_at_a_time(variant: str, cov: str, kw: dict, dtype: str) -> None:
    """``Scorer.score_queries`` (a batch, each query through the one-text path on its own rows of a float16 union)
    gives each query what ``Scorer.score_query`` gives it alone (to float32's rounding: a batch's text heads are one
    (M, D) product), empty shortlists included."""
    model = small_model(variant, covariance=cov, **kw).eval()
    text, frames, mask, _ = random_inputs(q=5, v=9, frames=5)
    frames16 = frames.half().numpy()  # as a store's rows are read
    shortlists = [np.array([0, 3, 5]), np.array([], np.int64), np.array([8, 1, 2]), np.arange(9), np.array([4])]
    scorer = Scorer(model, dtype=dtype)
    got = scorer.score_queries(text.numpy(), frames16, mask.numpy(), shortlists)
    assert got is not None and [len(g) for g in got] == [len(s) for s in shortlists]
    for i, sl in enumerate(shortlists):
        alone = scorer.score_query(text[i], frames16[sl], mask.numpy()[sl])
        np.testing.assert_allclose(got[i], alone, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant, kw", [("dab", {}), ("prob", {}), ("dab", {"drift": "constant"})])
def test_a_batchs_pairs_go_through_the_engine_in_one_call(
    variant: str, kw: dict, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's (query, video) pairs, each query's own shortlist, in one one_query call of a text a video (D = 32,
    drift 64: the AMX bridge and oneDNN products where the CPU has them); each query's costs as alone, within the
    engine's tolerance (the products' blocking may differ with the rows)."""
    model = small_model(variant, embed_dim=32, drift_hidden=64, num_heads=2, **kw).eval()
    text, frames, mask, _ = random_inputs(q=4, v=40, frames=5, dim=32)
    rng = np.random.default_rng(0)
    shortlists = [rng.choice(40, 30, replace=False), np.array([], np.int64), np.arange(40), rng.choice(40, 7)]
    scorer = Scorer(model, dtype=dtype)
    alone = [scorer.score_query(text[i], frames[sl], mask[sl]) for i, sl in enumerate(shortlists)]
    calls: list[int] = []
    eng_class = type(scorer._engine(128))
    real = eng_class.one_query

    def spy(self, ts, frames, mask, terms=None):
        calls.append(len(frames))
        return real(self, ts, frames, mask, terms)

    monkeypatch.setattr(eng_class, "one_query", spy)
    got = scorer.score_queries(text, frames, mask, shortlists)
    assert calls == [77]  # 30 + 0 + 40 + 7 pairs, one call
    tol = 1e-5 if dtype == "float32" else 2e-3
    for g, a in zip(got, alone):
        np.testing.assert_allclose(g, a, rtol=tol, atol=tol)


@pytest.mark.parametrize("variant, cov", [("xpool", "diag"), ("prob", "lowrank:2"), ("dab", "mixture:2")])
def test_score_queries_says_none_where_the_model_has_no_one_text_path(variant: str, cov: str) -> None:
    model = small_model(variant, covariance=cov).eval()
    text, frames, mask, _ = random_inputs(q=2, v=4, frames=5)
    assert Scorer(model).score_queries(text, frames, mask, [np.array([0, 1]), np.array([2])]) is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "variant, cov", [("dab", "diag"), ("prob", "diag"), ("dab", "lowrank:2"), ("dab", "mixture:2"), ("xpool", "diag")]
)
def test_score_shortlists_equals_score_query_one_query_at_a_time(variant: str, cov: str, dtype: str) -> None:
    """The batch's pass (chunks of 4 videos and 3 pairs, so every loop turns) against the plain path it replaces."""
    model = small_model(variant, covariance=cov).eval()
    text, frames, mask, _ = random_inputs(q=5, v=9, frames=5)
    shortlists = [np.array([0, 3, 5]), np.array([], np.int64), np.array([8, 1, 2]), np.arange(9), np.array([4])]
    got = score_shortlists(model, text, frames, mask, shortlists, dtype=dtype, video_chunk=4, pair_chunk=3)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-3, "atol": 1e-3}  # both bf16: close
    assert [len(g) for g in got] == [len(s) for s in shortlists]
    for i, sl in enumerate(shortlists):
        if len(sl):
            idx = torch.as_tensor(sl)
            ref = score_query(model, text[i], frames[idx], mask[idx], dtype=dtype)
            np.testing.assert_allclose(got[i], ref, **tol)
    assert score_shortlists(model, text[:0], frames, mask, []) == []
