"""benchmarks/serve_ray.py on a small scale (slow: real servers, a local Ray): it runs every candidate, compares
their answers with dab serve's, and prints the per-shard and sizing figures docs/search.md's table is made from."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_benchmark_runs_its_candidates_and_they_answer_alike(tmp_path: Path) -> None:
    pytest.importorskip("ray.serve")
    pytest.importorskip("faiss")
    pytest.importorskip("open_clip")
    args = ["--videos", "3000", "--shards", "2", "--replicas", "1", "--rounds", "1", "--clients", "3", "--queries", "2"]
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "serve_ray.py"), *args, "--work", str(tmp_path / "w"), "--remove"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert len(re.findall(r"^shard shard-00\d: 1,500 videos", text, re.M)) == 2, text
    for name in ("dab serve", "--ray --replicas 1"):
        assert re.search(rf"{re.escape(name)}\s+\(--threads \d\): started in \d+ s, 6 answered", text), text
    same = re.search(r"--ray --replicas 1: (\d+)/(\d+) queries the same hits in the same order", text)
    assert same and same.group(1) == same.group(2), text
    assert "sizing inputs: store" in text and not (tmp_path / "w").exists()
