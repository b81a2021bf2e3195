"""benchmarks/coverage.py's tables on a synthetic gallery: coverage over random halves within its bounds, sets
that grow as alpha falls, conditional coverage per tercile, and the risk check's answered share."""

from __future__ import annotations

import pytest

from ..calibration.synthetic import synthetic_costs
from ..helpers.benchmarks import load_benchmark

pytest.importorskip("sklearn")


def _coverage():
    return load_benchmark("coverage")


def test_the_coverage_table_holds_its_bounds_on_a_synthetic_gallery() -> None:
    bench = _coverage()
    cost, gt, tv = synthetic_costs(300, 40, seed=5)
    table = bench.coverage_table(cost.astype("float64"), gt, tv, 1.0, [0.1, 0.2], splits=40)
    assert set(table) == {f"{s} {a}" for s in ("lac", "aps", "raps", "normalized") for a in ("0.1", "0.2")}
    for key, row in table.items():
        assert row["holds"], (key, row)
        assert len(row["by_uncertainty_tercile"]) == 3 and row["claim_aware"] is None
    assert table["lac 0.1"]["size"][0] > table["lac 0.2"]["size"][0]


def test_the_risk_table_answers_some_queries_of_an_easy_gallery() -> None:
    bench = _coverage()
    cost, gt, tv = synthetic_costs(600, 20, seed=6)
    risk = bench.risk_table(cost.astype("float64"), gt, tv, 1.0, [0.2], delta=0.1, splits=10)
    r = risk["0.2"]
    assert 0 < r["answered"] < 1 and r["splits_answering"] >= 1 and 0 <= r["exceeded_share"] <= 1
