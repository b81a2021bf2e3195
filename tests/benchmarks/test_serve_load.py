"""benchmarks/serve_load.py end to end on a tiny store and run: two real servers (--max-batch 1 and 4), a small
load, the report (the answers compared, the ratios); and its answer comparison on hand-made answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers.benchmarks import load_benchmark
from ..helpers.models import hand_made_run
from ..helpers.stores import SEARCH_CAPTIONS, text_store


def _serve_load():
    return load_benchmark("serve_load")


def test_answers_are_compared_up_to_ties() -> None:
    sl = _serve_load()
    ref = {("a", 2): [("v1", 10.0), ("v2", 11.0)], ("b", 2): [("v1", 10.0), ("v2", 10.0001)], ("c", 1): [("v3", 5.0)]}
    other = {("a", 2): [("v1", 10.0), ("v2", 11.0)], ("b", 2): [("v2", 10.0), ("v1", 10.0001)], ("c", 1): [("v4", 6.0)]}
    out = sl.compare_answers(ref, other)
    assert out.startswith("1/3 queries the same hits in the same order, 1 the same up to ties within 0.0001")
    assert "1 otherwise" in out and "differs: 'c' k=1" in out


@pytest.mark.slow
def test_the_benchmark_loads_two_real_servers_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("uvicorn")
    pytest.importorskip("faiss")
    store = text_store(tmp_path / "store.h5", SEARCH_CAPTIONS, test_videos=6, frames=4)
    run, _ = hand_made_run(tmp_path / "run", store, "dab")
    argv = ["--run", str(run), "--features", str(store), "--batches", "1,4", "--clients", "3", "--queries", "4"]
    assert _serve_load().main([*argv, "--rounds", "2", "--threads", "1", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert out.count("12 answered") == 4  # 2 servers x 2 rounds, every query answered
    assert "--max-batch 4 against --max-batch 1, round by round: throughput x" in out
    assert "queries the same hits in the same order" in out and "0 otherwise" in out
