"""ServedShardedIndex: the shards answering through a call (Ray Serve's handles in `dab serve --ray`) give the same
shortlists as the index loaded in one process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import StoreError
from dab_pipeline.index import build_index, build_sharded_index, load_index, query_vectors
from dab_pipeline.index.served import ServedShardedIndex, ShardService, shard_folders
from dab_pipeline.store import open_store
from dab_pipeline.testing import random_store

pytest.importorskip("faiss")

N = 240


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_store(tmp_path_factory.mktemp("served") / "s.h5", n_videos=N, frames=6, splits=["test"] * N)


def served(path: Path) -> tuple[ServedShardedIndex, list[ShardService], list[str]]:
    services = [ShardService(f) for f in shard_folders(path)]
    asked: list[str] = []

    def call(method: str, args: dict[int, tuple]) -> dict:
        asked.append(method)
        return {i: getattr(services[i], method)(*a) for i, a in args.items()}

    return ServedShardedIndex(path, [s.describe() for s in services], call), services, asked


@pytest.mark.parametrize(
    "factory, vector, shards, refine",
    [
        ("IVF8,Flat", "meanp", 3, 2),
        ("IVF8,PQ8x4", "segments", 4, 3),
        ("PQ8x4", "segments", 2, 0),
        ("Flat", "meanp", 1, 0),
    ],
)
def test_a_served_index_answers_as_the_one_in_this_process(
    store: Path, tmp_path: Path, factory: str, vector: str, shards: int, refine: int
) -> None:
    with open_store(store) as st:
        if shards == 1:  # one index folder (no --shards): served as one shard
            build_index(st, tmp_path / "i", split="test", vector=vector, factory=factory, nprobe=3, refine=refine)
        else:
            build_sharded_index(
                st, tmp_path / "i", shards=shards, split="test", vector=vector, factory=factory, nprobe=3, refine=refine
            )
        qv = query_vectors(vector, st.read_captions(np.arange(0, 2 * N, 5)))
    local = load_index(tmp_path / "i")
    remote, services, asked = served(tmp_path / "i")
    assert remote.meta.count == N and remote.meta.store == local.meta.store
    for k in (1, 10, 60):
        rows, scores = local.search(qv, k)
        rows_r, scores_r = remote.search(qv, k)
        np.testing.assert_array_equal(rows_r, rows)
        np.testing.assert_array_equal(scores_r, scores)  # the same float32 numbers, merged from the shards
    assert set(asked) == {"candidates"} and len(asked) == 3  # one call a search, to every shard at once
    local.close()


def test_a_shard_whose_files_changed_answers_a_store_error(store: Path, tmp_path: Path) -> None:
    with open_store(store) as st:
        build_sharded_index(st, tmp_path / "i", shards=2, split="test", factory="IVF4,Flat", refine=2)
        qv = query_vectors("segments", st.read_captions(np.arange(4)))
    remote, _, _ = served(tmp_path / "i")
    remote.search(qv, 5)
    codes = tmp_path / "i" / "shard-001" / "index.faiss"
    codes.write_bytes(b"\0" * codes.stat().st_size)  # copied over in place: the shard must not answer from it
    with pytest.raises(StoreError, match="shard-001"):
        remote.search(qv, 5)


def test_a_served_index_checks_its_shards_against_the_plan_and_a_shard_its_files(store: Path, tmp_path: Path) -> None:
    """As load_index: a shard built otherwise than shards.json says is refused, naming it; a shard service whose
    folder was rebuilt since the server read it refuses to start (its ids would map to rows no longer held)."""
    from dab_pipeline.core.errors import ConfigError
    from dab_pipeline.index.served import describe_folders, shard_identity

    with open_store(store) as st:
        build_sharded_index(st, tmp_path / "i", shards=2, split="test", vector="meanp", factory="Flat")
    described = describe_folders(tmp_path / "i")
    assert [d["meta"] for d in described] == [ShardService(f).describe()["meta"] for f in shard_folders(tmp_path / "i")]
    other = dict(described[1], meta={**described[1]["meta"], "factory": "IVF8,Flat"})
    with pytest.raises(ConfigError, match="shard-001 was built otherwise"):
        ServedShardedIndex(tmp_path / "i", [described[0], other], lambda m, a: {})
    expect = shard_identity(described[1])
    ShardService(shard_folders(tmp_path / "i")[1], expect).close()  # the same files: starts
    with pytest.raises(StoreError, match="changed since the server started"):
        ShardService(shard_folders(tmp_path / "i")[1], {**expect, "rows_sha256": "0" * 64})
