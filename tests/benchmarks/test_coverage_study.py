"""benchmarks/coverage_study.py's measures and rule on synthetic galleries: the sets' coverage and groups, the
paired comparisons, and the verdict the rule in docs/quality.md gives."""

from __future__ import annotations

import numpy as np
import pytest

from ..calibration.synthetic import synthetic_costs
from ..helpers.benchmarks import load_benchmark

pytest.importorskip("sklearn")


def _run(study, seed: int, gaussian: bool, q: int = 240, v: int = 30) -> dict:
    cost, gt, tv = synthetic_costs(q, v, seed=seed)
    levels = np.array(["video", "shot", "object", "generic"])[np.arange(q) % 4]
    sets = study.run_sets(cost.astype("float64"), gt, tv if gaussian else None, 1.0, levels, 0.1, splits=30)
    return {"queries": q, "scores": sets}


def test_run_sets_gives_each_query_a_set_size_and_each_group_a_coverage() -> None:
    study = load_benchmark("coverage_study")
    got = _run(study, 3, gaussian=True)["scores"]
    assert set(got) == {"lac", "aps", "raps", "normalized"}
    for score, r in got.items():
        assert r["holds"], (score, r["coverage"], r["se"])
        assert len(r["size_per_query"]) == 240 and min(r["size_per_query"]) >= 0
        assert set(r["groups"]) == {"tercile 0", "tercile 1", "tercile 2"} | {
            f"level {x}" for x in ("video", "shot", "object", "generic")
        }
    # a cost-only run has no variance: no normalized score
    assert "normalized" not in _run(study, 3, gaussian=False)["scores"]


def test_the_rule_picks_a_default_and_answers_both_questions() -> None:
    study = load_benchmark("coverage_study")
    worlds = []
    for w in range(3):
        table = {
            name: study.summarise([_run(study, 10 * w + s, name != "xpool") for s in (1, 2)])
            for name in ("xpool", "prob", "dab", "dab-const")
        }
        worlds.append({"world": f"w{w}", "queries": 240, "table": table, "comparisons": study.comparisons(table)})
    lines = study.verdict(worlds)
    default = [x for x in lines if x.startswith("=> DEFAULT_CONFORMAL_SCORE")]
    assert len(default) == 1 and any(f"'{s}'" in default[0] for s in ("lac", "aps", "raps", "normalized"))
    assert sum("worlds:" in x for x in lines) == 4  # prob and dab, normalized and cost-only
    # the same synthetic costs for prob and dab-const: their comparisons are paired on equal queries
    c = worlds[0]["comparisons"]
    assert [x["a"].split()[0] for x in c] == ["prob", "prob", "dab", "dab"]
    assert all(x["low"] <= x["diff"] <= x["high"] for x in c)
    text = study.markdown(worlds[0], 0.1, [1, 2])
    assert "| prob | normalized |" in text and "tercile 2" in text


def test_qualifying_needs_coverage_to_hold_and_every_group_at_the_bar() -> None:
    study = load_benchmark("coverage_study")
    row = {"holds": True, "conditional": 0.9}
    world = {"table": {"xpool": {"lac": dict(row)}, "prob": {"lac": dict(row), "normalized": dict(row)}}}
    assert study.qualifies(world, "lac") and study.qualifies(world, "normalized")
    world["table"]["xpool"]["lac"]["conditional"] = 0.84
    assert not study.qualifies(world, "lac") and study.qualifies(world, "normalized")
    world["table"]["prob"]["normalized"]["holds"] = False
    assert not study.qualifies(world, "normalized")
    assert study.qualifies(world, "raps") is None
