"""The risk part of a result's JSON (dab search --json, dab serve's API, the pages read it): the threshold as the
grid writes it, and what the per-video test counted (issue 61, the second probe)."""

from __future__ import annotations

import json

import numpy as np

from dab_pipeline.calibration import QueryUncertainty
from dab_pipeline.metrics.risk import RiskThreshold
from dab_pipeline.search import SearchHit, SearchResult, uncertainty_payload


def _result(risk: RiskThreshold, answered: bool) -> SearchResult:
    hits = [SearchHit(rank=1, video_index=0, video_id="w1", cost=40.0)]
    r = SearchResult("a red ball", hits, 1.0, costs=np.array([40.0]), video_ids=np.array(["w1"]))
    r.uncertainty = QueryUncertainty(p_first=0.3, p_first_k=0.6, first_k=5, answered=answered, risk=risk)
    return r


def test_the_threshold_is_the_grids_value_and_the_held_out_count_is_given() -> None:
    grid_value = float(np.linspace(1.0, 0.0, 201)[163])  # the 0.185 of the default grid, as linspace makes it
    assert grid_value != 0.185
    risk = RiskThreshold(grid_value, 0.8, 0.05, answered=101, errors=60, queries=416, test="wsr", videos=30)
    got = uncertainty_payload(_result(risk, True))["risk"]
    assert got["threshold"] == 0.185 and '"threshold": 0.185,' in json.dumps(got)
    assert got["held_out"] == {"queries": 416, "videos": 30}
    none = RiskThreshold(None, 0.2, 0.05, 0, 0, queries=416, test="wsr", videos=30)
    assert uncertainty_payload(_result(none, False))["risk"]["threshold"] is None
