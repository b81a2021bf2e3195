"""dab index --shards: N indexes over disjoint video ranges, searched as the one index over them all would be."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.index import ShardedIndex, build_index, build_sharded_index, load_index, query_vectors, shard_ranges
from dab_pipeline.store import open_store
from dab_pipeline.testing import random_store

pytest.importorskip("faiss")

N = 300


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_store(tmp_path_factory.mktemp("shards") / "s.h5", n_videos=N, frames=6, splits=["test"] * N)


def test_ranges_cover_every_video_once() -> None:
    for n, s in ((10, 3), (300, 4), (7, 7), (5, 1)):
        r = shard_ranges(n, s)
        assert r[0][0] == 0 and r[-1][1] == n and all(a < b for a, b in r) and len(r) == s
        assert (
            all(r[i][1] == r[i + 1][0] for i in range(s - 1))
            and max(b - a for a, b in r) - min(b - a for a, b in r) <= 1
        )


@pytest.mark.parametrize(
    "factory, vector, nprobe",
    [("Flat", "segments", 1), ("IVF8,Flat", "meanp", 3), ("IVF8,PQ8x4", "segments", 3), ("PQ8x4", "segments", 1)],
)
def test_the_shards_answer_as_one_index(store: Path, tmp_path: Path, factory: str, vector: str, nprobe: int) -> None:
    """The same shortlist, the same scores, at the same nprobe: the shards' lists partition the one index's (the
    PQ8x4 case without re-scoring: the quantised scores' merge itself)."""
    refine = 0 if factory == "PQ8x4" else 2
    with open_store(store) as st:
        build_index(st, tmp_path / "one", split="test", vector=vector, factory=factory, nprobe=nprobe, refine=refine)
        build_sharded_index(
            st, tmp_path / "four", shards=4, split="test", vector=vector, factory=factory, nprobe=nprobe, refine=refine
        )
        exact = build_index(st, tmp_path / "flat", split="test", vector=vector)
        qv = query_vectors(vector, st.read_captions(np.arange(0, 2 * N, 7)))
    one, four = load_index(tmp_path / "one"), load_index(tmp_path / "four")
    assert isinstance(four, ShardedIndex) and four.meta.count == N and len(four.shards) == 4
    for k in (1, 10, 40):
        rows, scores = one.search(qv, k)
        rows4, scores4 = four.search(qv, k)
        np.testing.assert_array_equal(rows4, rows)
        np.testing.assert_allclose(scores4, scores, rtol=0, atol=1e-6)
    if factory != "Flat":  # the approximation is real: what the shards reproduce is not the exact answer
        assert not np.array_equal(one.search(qv, 40)[0], load_index(tmp_path / "flat").search(qv, 40)[0])
    assert exact.count == N
    files = {p.relative_to(tmp_path / "four").as_posix() for p in four.identity_files() if p.is_file()}
    assert {"shards.json", "shard-000/index.json", "shard-003/index.faiss"} <= files
    four.close()


def test_each_shard_builds_on_its_own_and_a_missing_one_is_named(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    with open_store(store) as st:
        for i in (2, 0):
            build_sharded_index(st, out, shards=3, shard=i, split="test", factory="IVF4,PQ8x4", refine=2)
        with pytest.raises(ConfigError, match=r"shard-001 is missing: build it with .*--shards 3 --shard 1"):
            load_index(out)
        build_sharded_index(st, out, shards=3, shard=1, split="test", factory="IVF4,PQ8x4", refine=2)
        qv = query_vectors("segments", st.read_captions(np.arange(9)))
        build_index(st, tmp_path / "one", split="test", factory="IVF4,PQ8x4", refine=2)
        # another plan into the same folder is refused, naming what differs
        with pytest.raises(ConfigError, match="shards differ"):
            build_sharded_index(st, out, shards=4, shard=0, split="test", factory="IVF4,PQ8x4")
        with pytest.raises(ConfigError, match="--shard must be between 0 and 2"):
            build_sharded_index(st, out, shards=3, shard=3, split="test", factory="IVF4,PQ8x4")
        with pytest.raises(ConfigError, match="cannot split the graph"):
            build_sharded_index(st, tmp_path / "h", shards=2, split="test", factory="HNSW8")
    np.testing.assert_array_equal(load_index(out).search(qv, 20)[0], load_index(tmp_path / "one").search(qv, 20)[0])
    # a shard rebuilt from another training is refused
    meta = json.loads((out / "shard-001" / "index.json").read_text())
    meta["build"]["trained_sha256"] = "0" * 64
    (out / "shard-001" / "index.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"shard-001 was built otherwise .*trained.faiss.*--shard 1 --overwrite"):
        load_index(out)
    (out / "shards.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not a dab shards.json"):
        load_index(out)


def test_a_search_over_shards_answers_as_over_one_index(tmp_path: Path) -> None:
    """`dab index --shards` shard by shard, then the Searcher (as dab search and dab serve use it): the same
    answers as with one index, video terms read from the right shard."""
    from dab_pipeline.search import Searcher

    from ..helpers.models import hand_made_run
    from ..helpers.runner import invoke
    from ..helpers.stores import text_store

    store = text_store(tmp_path / "s.h5", test_videos=8)
    run, _ = hand_made_run(tmp_path / "run", store, "dab")
    base = ["index", "--features", store, "--run", run, "--video-terms", "--factory", "IVF2,Flat", "--nprobe", "1"]
    assert invoke([*base, "--out", tmp_path / "one", "--quiet"]).exit_code == 0
    for i in (1, 0, 2):
        res = invoke([*base, "--out", tmp_path / "three", "--shards", "3", "--shard", str(i), "--quiet"])
        assert res.exit_code == 0 and f"(shard {i} of 3)" in res.output, res.output
    res = invoke([*base, "--out", tmp_path / "three", "--shards", "3", "--quiet"])  # every shard built: kept
    assert res.exit_code == 0 and "in 3 shards: 8 videos" in res.output, res.output
    with open_store(store) as st:
        text = st.read_captions(np.arange(st.num_captions))
    queries = [f"q{i}" for i in range(len(text))]
    with Searcher(run, store, index=tmp_path / "one", device="cpu", encoder=False) as one:
        want = one.rank(queries, text, k=5, shortlist=8)
    with Searcher(run, store, index=tmp_path / "three", device="cpu", encoder=False) as three:
        assert three.terms and isinstance(three.index, ShardedIndex)
        got = three.rank(queries, text, k=5, shortlist=8)
    for a, b in zip(want, got):
        assert [h.video_id for h in a.hits] == [h.video_id for h in b.hits]
        np.testing.assert_allclose([h.cost for h in a.hits], [h.cost for h in b.hits], rtol=1e-5, atol=1e-6)
    bad = invoke([*base, "--out", tmp_path / "three", "--shards", "3", "--shard", "5"])
    assert bad.exit_code != 0 and "shard must be between 0 and 2" in bad.output and "Traceback" not in bad.output


def test_bad_arguments_write_nothing_and_replace_nothing(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    with open_store(store) as st:
        with pytest.raises(ConfigError, match="pass --run"):
            build_sharded_index(st, out, shards=2, split="test", vector="pooled", factory="IVF4,Flat")
        with pytest.raises(ConfigError, match="factory string"):
            build_sharded_index(st, out, shards=2, split="test", factory="NotAFactory")
        with pytest.raises(ConfigError, match="cannot split the graph"):
            build_sharded_index(st, out, shards=2, split="test", factory="NSG16,Flat")
        assert not out.exists()
        build_sharded_index(st, out, shards=2, split="test", factory="IVF4,Flat")
        before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
        with pytest.raises(ConfigError, match="pass --run"):  # --overwrite with a bad argument: the index stays
            build_sharded_index(st, out, shards=2, split="test", factory="IVF4,Flat", terms=True, overwrite=True)
        assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
        with pytest.raises(ConfigError, match=r"settings differ"):  # another refine or nprobe is another index
            build_sharded_index(st, out, shards=2, shard=0, split="test", factory="IVF4,Flat", nprobe=2)
        # the run's or the store's path as another machine names it is the same index
        plan = json.loads((out / "shards.json").read_text())
        plan["store"]["path"], plan["run"]["path"] = "/elsewhere/s.h5", "/elsewhere/run"
        (out / "shards.json").write_text(json.dumps(plan))
        build_sharded_index(st, out, shards=2, shard=1, split="test", factory="IVF4,Flat")
    assert load_index(out).meta.count == N
    # a trained file replaced since the plan was written: refused before any shard is built from it
    plan = json.loads((out / "shards.json").read_text())
    (out / "shards.json").write_text(json.dumps(plan | {"trained_sha256": "0" * 64}))
    with open_store(store) as st, pytest.raises(ConfigError, match="is not the file .*shards.json was planned with"):
        build_sharded_index(st, out, shards=2, shard=1, split="test", factory="IVF4,Flat", overwrite=True)
