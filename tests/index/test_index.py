"""dab index: the vectors against naive references, the FAISS index against brute force, resume, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline.core.errors import ConfigError, StoreMismatchError
from dab_pipeline.core.events import Event
from dab_pipeline.index import (
    DEFAULT_VECTOR,
    VECTOR_KINDS,
    auto_factory,
    build_index,
    load_index,
    query_vectors,
    staging_path,
    video_vectors,
)
from dab_pipeline.index.vectors import SEGMENTS, segment_ids
from dab_pipeline.scoring import score_all_reference, score_query
from dab_pipeline.store import open_store, store_fingerprint
from dab_pipeline.testing import random_store

from ..helpers.models import small_model

pytest.importorskip("faiss")

SPLITS = ["test"] * 40


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def naive_segments(frames: np.ndarray, mask: np.ndarray, s: int) -> np.ndarray:
    """Per video: its real frames cut into s near-equal consecutive runs, the meanP of each (whole-video meanP
    for an empty run)."""
    out = np.empty((len(frames), s, frames.shape[2]), np.float32)
    for b in range(len(frames)):
        real = unit(frames[b][mask[b]])
        m = len(real)
        whole = unit(real.mean(0))
        for j in range(s):
            part = [real[r] for r in range(m) if r * s // m == j]
            out[b, j] = unit(np.mean(part, 0)) if part else whole
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_store(tmp_path_factory.mktemp("index") / "s.h5", n_videos=40, frames=6, splits=SPLITS)


def test_segment_vectors_match_the_naive_reference() -> None:
    rng = np.random.default_rng(0)
    frames = rng.standard_normal((5, 7, 8)).astype(np.float32)
    mask = np.ones((5, 7), bool)
    mask[1, 3:] = False  # 3 real frames
    mask[2, 2:] = False  # 2 real frames: fewer than the segments, two are empty
    mask[3, 0] = False  # a hole at the start
    got = video_vectors("segments", frames, mask)  # (B, S, D)
    np.testing.assert_allclose(got, naive_segments(frames, mask, SEGMENTS), atol=1e-5)
    assert (segment_ids(torch.as_tensor(mask), SEGMENTS)[1, 3:] == -1).all()


def test_single_vector_kinds_match_numpy() -> None:
    rng = np.random.default_rng(1)
    frames = rng.standard_normal((4, 5, 8)).astype(np.float32)
    mask = np.ones((4, 5), bool)
    mask[0, 2:] = False
    meanp = np.stack([unit(unit(f[m]).mean(0)) for f, m in zip(frames, mask)])
    mean = np.stack([unit(f[m].mean(0)) for f, m in zip(frames, mask)])
    np.testing.assert_allclose(video_vectors("meanp", frames, mask)[:, 0], meanp, atol=1e-5)
    np.testing.assert_allclose(video_vectors("mean", frames, mask)[:, 0], mean, atol=1e-5)
    text = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(query_vectors("meanp", text), unit(text), atol=1e-6)


def test_pooled_vector_is_the_models_pooling_of_the_average_query() -> None:
    model = small_model("dab", seed=0).eval()
    rng = np.random.default_rng(2)
    frames = rng.standard_normal((3, 4, 16)).astype(np.float32)
    mask = np.ones((3, 4), bool)
    avg = rng.standard_normal(16).astype(np.float32)
    got = video_vectors("pooled", frames, mask, model, avg)[:, 0]
    with torch.no_grad():
        ts = model.encode_text(torch.tensor(avg)[None])
        vs = model.encode_video(torch.tensor(frames), torch.tensor(mask))
        v_c = model.pool.pool(ts.q, vs.k, vs.v, vs.mask, grid=True)[0]  # (V, D) on the grid
        ref = torch.nn.functional.normalize(model.prob(v_c)[0], dim=-1).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_unknown_vector_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="segments"):
        VECTOR_KINDS.get("nope")


@pytest.mark.parametrize("vector", ["segments", "meanp"])
def test_flat_index_equals_brute_force(store: Path, tmp_path: Path, vector: str) -> None:
    with open_store(store) as st:
        meta = build_index(st, tmp_path / "idx", split="test", vector=vector, chunk=7)
        frames, mask = st.read_videos(np.arange(40))
        text = st.read_captions(np.arange(0, 80, 9))
    assert meta.factory == "Flat" and meta.count == 40 and meta.per_video == VECTOR_KINDS.get(vector).per_video
    idx = load_index(tmp_path / "idx")
    qv = query_vectors(vector, text)
    rows, scores = idx.search(qv, 10)
    best = np.einsum("qd,vsd->qvs", qv, video_vectors(vector, frames, mask)).max(axis=2)  # (Q, V) best vector
    ref = np.argsort(-best, axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(rows, ref)  # random features: no ties
    np.testing.assert_allclose(scores, np.take_along_axis(best, ref, axis=1), atol=1e-5)
    assert all(len(set(r)) == 10 for r in rows)  # one entry a video, though a video has several vectors


def test_ivf_index_builds_and_searches(store: Path, tmp_path: Path) -> None:
    assert auto_factory(1000, 512) == "Flat"
    assert auto_factory(4_000_000, 512) == "IVF4096,PQ64"
    with open_store(store) as st:
        build_index(st, tmp_path / "ivf", split="test", vector="meanp", factory="IVF4,Flat", nprobe=4)
        build_index(st, tmp_path / "flat", split="test", vector="meanp")
        text = st.read_captions(np.arange(5))
    qv = query_vectors("meanp", text)
    rows, _ = load_index(tmp_path / "ivf").search(qv, 5)
    np.testing.assert_array_equal(rows, load_index(tmp_path / "flat").search(qv, 5)[0])  # every list probed: exact
    with pytest.raises(ConfigError, match="nprobe"):
        load_index(tmp_path / "ivf").search(qv, 5, nprobe=0)
    with open_store(store) as st, pytest.raises(ConfigError, match="factory string"):
        build_index(st, tmp_path / "bad", split="test", factory="NotAFactory")


def test_a_stopped_build_resumes(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    seen: list[int] = []

    def stop_after_two_chunks(ev: Event) -> None:
        if ev.kind == "advance" and ev.task == "vectors":
            seen.append(ev.n)
            if len(seen) == 3:  # the resume offset (0), then two chunks of 8
                raise KeyboardInterrupt

    with open_store(store) as st, pytest.raises(KeyboardInterrupt):
        build_index(st, out, split="test", chunk=8, progress=stop_after_two_chunks)
    state = json.loads((staging_path(out) / "state.json").read_text())
    assert state["done"] == 16 and not out.exists()
    resumed: list[Event] = []
    with open_store(store) as st:
        build_index(st, out, split="test", chunk=8, progress=resumed.append)
    first = [e.n for e in resumed if e.kind == "advance" and e.task == "vectors"]
    assert first[0] == 16 and sum(first) == 40  # picked up at video 16
    fresh = tmp_path / "fresh"
    with open_store(store) as st:
        build_index(st, fresh, split="test", chunk=40)
    a, b = load_index(out), load_index(fresh)
    q = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_array_equal(a.search(q, 40)[0], b.search(q, 40)[0])
    assert not staging_path(out).exists()


def test_refuses_to_overwrite_what_is_not_an_index(store: Path, tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "precious.txt").write_text("x")
    with open_store(store) as st:
        with pytest.raises(ConfigError, match="already exists"):
            build_index(st, tmp_path / "keep", split="test")
        with pytest.raises(ConfigError, match="not a dab index"):
            build_index(st, tmp_path / "keep", split="test", overwrite=True)
    assert (tmp_path / "keep" / "precious.txt").exists()


def test_fingerprint_sees_a_changed_store(store: Path, tmp_path: Path) -> None:
    other = random_store(tmp_path / "other.h5", n_videos=40, frames=6, splits=SPLITS, seed=5)
    with open_store(store) as a, open_store(other) as b:
        rows = np.arange(40)
        assert store_fingerprint(a, rows) == store_fingerprint(a, rows)
        assert store_fingerprint(a, rows) != store_fingerprint(b, rows)
        build_index(a, tmp_path / "idx", split="test")
    with pytest.raises(StoreMismatchError, match="another store"):
        with open_store(other) as b:
            load_index(tmp_path / "idx").check_store(store_fingerprint(b, rows), other)


def test_score_query_matches_the_reference() -> None:
    model = small_model("dab", seed=3).eval()
    rng = np.random.default_rng(3)
    text = rng.standard_normal((1, 16)).astype(np.float32)
    frames = rng.standard_normal((9, 4, 16)).astype(np.float32)
    mask = np.ones((9, 4), bool)
    mask[2, 1:] = False
    ref = score_all_reference(model, text, frames, mask).cost[0]
    np.testing.assert_allclose(score_query(model, text[0], frames, mask, video_chunk=4), ref, rtol=1e-5, atol=1e-5)
    bf = score_query(model, text, frames, mask, dtype="bfloat16")
    assert np.abs(bf - ref).max() < 0.05 * np.abs(ref).mean()


def test_cli_default_vector_is_the_librarys() -> None:
    from dab_pipeline.cli.commands.indexing import index

    opt = next(p for p in index.params if p.name == "vector")
    assert opt.default == DEFAULT_VECTOR


def test_a_quantised_index_re_scores_on_exact_vectors(store: Path, tmp_path: Path) -> None:
    with open_store(store) as st:
        build_index(st, tmp_path / "pq", split="test", factory="IVF2,PQ4x4", nprobe=2, refine=4)
        build_index(st, tmp_path / "flat", split="test")
        text = st.read_captions(np.arange(0, 80, 7))
    pq, flat = load_index(tmp_path / "pq"), load_index(tmp_path / "flat")
    assert (tmp_path / "pq" / "refine.f16").stat().st_size == 40 * SEGMENTS * 16 * 2
    assert pq.meta.refine == 4 and flat.meta.refine == 0 and not (tmp_path / "flat" / "refine.f16").exists()
    qv = query_vectors(DEFAULT_VECTOR, text)
    rows, scores = pq.search(qv, 10)  # 4 x 10 x 4 candidates cover the 160 vectors: the exact ranking
    ref_rows, ref_scores = flat.search(qv, 10)
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_allclose(scores, ref_scores, atol=2e-3)  # float16 vectors
    pq.meta.refine = 0
    assert not np.array_equal(pq.search(qv, 10)[0], ref_rows)  # 4-bit codes alone do reorder
    pq.close()


def test_a_quantised_index_without_its_exact_vectors_is_refused(store: Path, tmp_path: Path) -> None:
    with open_store(store) as st:
        build_index(st, tmp_path / "pq", split="test", factory="IVF2,PQ4x4", nprobe=2, refine=4)
    (tmp_path / "pq" / "refine.f16").unlink()
    with pytest.raises(ConfigError, match="refine.f16 is missing"):
        load_index(tmp_path / "pq")


def test_video_terms_are_the_runs_token_terms_and_survive_a_resume(store: Path, tmp_path: Path) -> None:
    """--video-terms: terms.f16 holds the run's W1 h_bar + b1 of each indexed video (float16), read back by store
    row; a stopped build resumes them with the vectors."""
    model = small_model("dab").eval()
    out = tmp_path / "idx"
    seen: list[int] = []

    def stop(ev: Event) -> None:
        if ev.kind == "advance" and ev.task == "vectors":
            seen.append(ev.n)
            if len(seen) == 3:
                raise KeyboardInterrupt

    run = {"path": "r", "checkpoint_sha256": "abc"}
    with open_store(store) as st, pytest.raises(KeyboardInterrupt):
        build_index(st, out, split="test", model=model, run=run, terms=True, chunk=8, progress=stop)
    with open_store(store) as st:
        meta = build_index(st, out, split="test", model=model, run=run, terms=True, chunk=8)
        frames, mask = st.read_videos(np.arange(40))
    assert meta.terms and meta.run == run and not staging_path(out).exists()
    assert json.loads((out / "index.json").read_text())["format"] == 2
    idx = load_index(out)
    rows = np.array([3, 17, 39, 0])
    with torch.no_grad():
        want = model.token_unc.video_term(torch.as_tensor(frames[rows]), torch.as_tensor(mask[rows]))
    np.testing.assert_allclose(idx.video_terms(rows).astype(np.float32), want.numpy(), rtol=2e-3, atol=1e-4)
    assert idx.video_terms(np.array([], np.int64)).shape == (0, 16)
    with pytest.raises(ConfigError, match="does not hold"):
        idx.video_terms(np.array([40]))
    plain = tmp_path / "plain"
    with open_store(store) as st:
        build_index(st, plain, split="test")
    assert load_index(plain).video_terms(rows) is None  # built without: none kept
    written = json.loads((plain / "index.json").read_text())  # what an older dab reads: format 1, no terms field
    assert written["format"] == 1 and "terms" not in written
    (out / "terms.f16").write_bytes(b"\0" * 10)
    with pytest.raises(ConfigError, match="terms.f16 is 10 bytes"):
        load_index(out)


def test_video_terms_need_a_run_with_a_token_branch(store: Path, tmp_path: Path) -> None:
    with open_store(store) as st:
        with pytest.raises(ConfigError, match="pass --run"):
            build_index(st, tmp_path / "a", split="test", terms=True)
        with pytest.raises(ConfigError, match="pass --run"):  # a model without its run's record: no checkpoint sha
            build_index(st, tmp_path / "a", split="test", model=small_model("dab"), terms=True)
        run = {"path": "r", "checkpoint_sha256": "abc"}
        with pytest.raises(ConfigError, match="no token branch"):
            build_index(st, tmp_path / "b", split="test", model=small_model("xpool"), run=run, terms=True)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_index_of_format_1_reads_without_video_terms() -> None:
    idx = load_index(Path(__file__).parents[1] / "data" / "compat" / "v1" / "index")
    assert idx.meta.format == 1 and idx.meta.terms is False and idx.video_terms(idx.video_rows[:2]) is None
