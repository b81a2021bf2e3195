"""benchmarks/scoring.py --covariance: every form's row beside diag, and a stage breakdown that is the model's path;
--one-query: its line per dtype and K."""

from __future__ import annotations

import pytest
import torch

from ..helpers.benchmarks import load_benchmark


def _scoring_benchmark():
    return load_benchmark("scoring")


def test_the_covariance_section_times_every_form_beside_diag(capsys: pytest.CaptureFixture[str]) -> None:
    sb = _scoring_benchmark()
    sb.bench_covariance(4, 3, 1, torch.device("cpu"), ["float32"], repeats=2)  # pair_stages checks itself
    out = capsys.readouterr().out
    lines = out.splitlines()
    for variant in ("prob", "dab"):
        for row in ("diag reference", "diag engine float32", *sb.COVARIANCES):
            assert any(line.split()[:1] == [variant] and f" {row} " in line for line in lines), (variant, row)
        for cov in sb.COVARIANCES:  # a row in the timings and one in the breakdown
            assert sum(line.split()[:2] == [variant, cov] for line in lines) == 2, (variant, cov)
        assert sum(line.split()[:2] == [variant, "diag"] for line in lines) == 3  # reference, engine, breakdown
    assert "where a pair's time goes" in out


def test_the_one_query_section_prints_a_line_per_dtype_and_k(capsys: pytest.CaptureFixture[str]) -> None:
    sb = _scoring_benchmark()
    sb.bench_one_query([2, 5], 4, 3, 1, torch.device("cpu"), ["float32"], repeats=2, min_pairs=4)
    lines = capsys.readouterr().out.splitlines()
    for k in (2, 5):  # the line, and the model's path beside it
        assert sum(f"float32   one query x {k}: " in line and "% of the grid rate" in line for line in lines) == 1
        assert sum(f"model's path x {k}: " in line for line in lines) == 1
        assert sum(f"video terms cached x {k}: " in line and "% of the grid rate" in line for line in lines) == 1
    assert any("float32   grid 4 x 3:" in line for line in lines)
