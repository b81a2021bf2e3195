"""benchmarks/shards.py: a sharded index answers as the one index over the same videos, on a small store in the
quick suite and on 100k videos in the slow one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("faiss")


def _bench():
    spec = importlib.util.spec_from_file_location("shards_benchmark", REPO / "benchmarks" / "shards.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_compares_shards_with_one_index(tmp_path: Path) -> None:
    out = _bench().main(
        ["--videos", "400", "--factory", "IVF8,PQ8x4", "--nprobe", "3", "--shards", "3", "--shortlist", "20",
         "--queries", "30", "--repeats", "1", "--work", str(tmp_path)]
    )  # fmt: skip
    rows = {(r["shards"], r["shortlist"]): r for r in out["rows"]}
    assert set(rows) == {(1, 20), (3, 20)}
    assert rows[(3, 20)]["identical"] == 1.0 and rows[(3, 20)]["max_score_diff"] == 0.0
    assert rows[(3, 20)]["ms_mean"] > 0


@pytest.mark.slow
def test_a_100k_store_in_four_shards_answers_as_one_index(tmp_path: Path) -> None:
    out = _bench().main(
        ["--videos", "100000", "--factory", "IVF256,PQ8", "--nprobe", "16", "--shards", "4", "--shortlist", "100",
         "--queries", "100", "--repeats", "1", "--work", str(tmp_path)]
    )  # fmt: skip
    four = next(r for r in out["rows"] if r["shards"] == 4)
    assert four["identical"] == 1.0 and four["common"] == 1.0, four
