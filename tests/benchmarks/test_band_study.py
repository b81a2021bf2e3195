"""benchmarks/band_study.py's measures and rule on a clustered synthetic gallery (issue 58): each method's sets and
group coverages on one split by video, the rule's verdicts on a table made of them, and the synthetic risk check."""

from __future__ import annotations

import numpy as np
import pytest

from dab_pipeline.testing import clustered_gallery

from ..helpers.benchmarks import load_benchmark

pytest.importorskip("sklearn")
pytest.importorskip("scipy")


def _data(study, gaussian: bool):
    g = clustered_gallery(150, seed=2)
    levels = np.array(["video", "shot", "object", "generic"])[np.arange(len(g["gt"])) % 4]
    tv = g["text_var"] if gaussian else None
    return study.RunData(g["cost"], g["gt"], tv, 1.0, levels, g["lengths"])


def test_one_split_gives_every_method_its_groups() -> None:
    study = load_benchmark("band_study")
    d = _data(study, gaussian=True)
    got = study.measure_split(d, 0, 0.2, conditional=True)
    assert set(got) == {"marginal", "bands", "bands-margin", "conditional"}
    for method, r in got.items():
        assert 0 < r["coverage"] <= 1 and r["size"] >= 1, method
        assert {"variance 1", "margin 3", "level generic"} <= set(r["groups"])
    plain = study.measure_split(_data(study, gaussian=False), 0, 0.2, conditional=False)
    assert set(plain) == {"marginal", "bands"} and "variance 1" not in plain["marginal"]["groups"]
    risk = study.risk_split(d, 0)
    assert set(risk) == {"0.1", "0.2"} and all(0 <= r["answered"] <= 1 for r in risk.values())


def test_the_rule_reads_a_table_of_runs() -> None:
    study = load_benchmark("band_study")
    d = _data(study, gaussian=True)

    def run():
        out = {}
        for alpha in study.ALPHAS:
            per = [study.measure_split(d, s, alpha, s < 1) for s in range(3)]
            out[f"{alpha:g}"] = {m: study._mean_over([p[m] for p in per if m in p]) for m in per[0]}
            out[f"risk {alpha:g}"] = {"answered": 0.0, "splits_answering": 0, "error": None, "splits_above": None}
        return out

    world = {"world": "synthetic", "queries": len(d.gt), "levels": {"generic": 400, "video": 100}, "table": {}}
    world["table"] = {"prob": [run(), run()], "dab": [run()]}
    ok, low, ratio = study.reaches(world, "prob", 0.2, "bands")
    assert ok in (True, False) and 0 < low <= 1 and ratio > 0
    assert study.compare_signals(world, "prob", 0.2) in ("better", "worse", "mixed")
    syn = study.synthetic_risk(draws=4, videos=200, population=50_000)
    lines = study.verdict([world], syn)
    assert lines[0].startswith("question 1, bands:") and lines[2].startswith("question 2,")
    assert lines[3].startswith("question 3,") and "caption-binomial" in lines[3]
    text = study.markdown([world], syn)
    assert "| prob | bands |" in text and "clustered population" in text
