"""benchmarks/coverage.py's tables on a clustered synthetic gallery (several captions a video): coverage over random
halves by video within its bounds, bands that even out the coverage per uncertainty tercile, sets that grow as alpha
falls, and the risk check's answered share (issue 58)."""

from __future__ import annotations

import numpy as np
import pytest

from dab_pipeline.testing import clustered_gallery

from ..helpers.benchmarks import load_benchmark

pytest.importorskip("sklearn")


def _coverage():
    return load_benchmark("coverage")


def test_the_coverage_table_splits_by_video_and_bands_even_out_the_terciles() -> None:
    bench = _coverage()
    g = clustered_gallery(240, seed=5)
    table = bench.coverage_table(g["cost"], g["gt"], g["text_var"], 1.0, [0.2], splits=40)
    assert set(table) == {f"{s} 0.2 {m}" for s in ("lac", "aps", "raps", "normalized") for m in ("marginal", "bands")}
    for key, row in table.items():
        assert len(row["by_uncertainty_tercile"]) == 3 and row["claim_aware"] is None
        if key.endswith("marginal"):
            assert row["coverage"] >= 0.8 - 2 * row["se"], (key, row)
            # the upper bound assumes continuous scores: normalized ties at 1 / d for every video of mass ~0
            assert row["holds"] or key.startswith("normalized"), (key, row)
    marginal, bands = table["aps 0.2 marginal"], table["aps 0.2 bands"]
    # the hardest tercile: under-covered marginally, near 1 - alpha per band
    assert marginal["by_uncertainty_tercile"][2] < 0.75 < bands["by_uncertainty_tercile"][2]
    edge, held, ev = bench.video_halves(g["gt"], 0)
    assert not set(g["gt"][ev]) & set(g["gt"][np.concatenate([edge, held])])  # no video on both sides


def test_the_risk_table_answers_some_queries_of_an_easy_gallery() -> None:
    bench = _coverage()
    g = clustered_gallery(1500, seed=6, max_captions=2)
    risk = bench.risk_table(g["cost"], g["gt"], g["text_var"], 1.0, [0.3], delta=0.1, splits=3)
    r = risk["0.3"]
    assert 0 < r["answered"] < 1 and r["splits_answering"] >= 1 and 0 <= r["exceeded_share"] <= 1
