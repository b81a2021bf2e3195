"""benchmarks/quality.py end to end on the tiny world (the --quick path, smaller still)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ..helpers.benchmarks import load_benchmark


def _quality():
    return load_benchmark("quality")


@pytest.mark.slow
def test_quality_benchmark_runs_every_kind_of_row(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    q = _quality()
    out = tmp_path / "report"
    res = q.main(
        [
            "--world",
            "tiny",
            "--seeds",
            "1",
            "--variants",
            "zero-shot",
            "xpool",
            "dab-T1",
            "dab-ft2",
            "dab-const",
            "prob-fixvar",
            "--reference",
            "dab-T1",
            "--epochs",
            "1",
            "--data-dir",
            str(tmp_path / "data"),
            "--out",
            str(out),
        ]
    )
    (world,) = res["worlds"]
    table = world["table"]
    assert set(table) == {"zero-shot", "xpool", "dab-T1", "dab-ft2", "dab-const", "prob-fixvar"}
    for name, row in table.items():
        assert 0 <= row["t2v R@1"]["mean"] <= 100 and row["t2v MnR"]["mean"] >= 1, name
        assert row["AURC"]["mean"] <= row["AURC random"]["mean"] + 0.2, name
    assert table["dab-T1"]["var text"] is not None and table["xpool"]["var text"] is None
    assert table["prob-fixvar"]["var text"]["mean"] == pytest.approx(math.exp(-2.0), rel=1e-5)  # frozen at init
    assert table["dab-const"]["pair-dep mu"]["mean"] == 0.0 and table["dab-T1"]["pair-dep mu"]["mean"] > 0.0
    assert world["oracle"]["R@1"] == pytest.approx(100.0)  # every tiny-world query is true of one test video
    # the claim-aware table: every caption of every test video, relevance from the claims
    claims = world["claims"]
    assert claims["split"] == "test" and claims["queries"] > 16
    for name, row in claims["rows"].items():
        assert 0 < row["AP"]["mean"] <= 100 and row["AP"]["mean"] >= row["P@1"]["mean"] / 5, name
    assert "var calibration" in claims["rows"]["dab-T1"] and "var calibration" not in claims["rows"]["xpool"]
    assert set(claims["bootstrap"]) == set(table) - {"dab-T1"}
    assert claims["bootstrap"]["dab-const"]["AP"]["low"] <= claims["bootstrap"]["dab-const"]["AP"]["high"]
    md = (out / "quality.md").read_text()
    assert "| oracle (claims) |" in md and "| dab-ft2 |" in md and "Differences to `dab-T1`" in md
    saved = json.loads((out / "quality.json").read_text())
    assert saved["recipe"]["lr"] == q.RECIPE["lr"] and saved["machine"]["cores"] >= 1
    # a rerun reuses the finished runs (and their claim-aware results) instead of training again
    again = q.main(
        [
            "--world",
            "tiny",
            "--seeds",
            "1",
            "--variants",
            "xpool",
            "--epochs",
            "1",
            "--data-dir",
            str(tmp_path / "data"),
        ]
    )
    assert again["worlds"][0]["table"]["xpool"]["t2v R@1"] == table["xpool"]["t2v R@1"]
    assert again["worlds"][0]["claims"]["rows"]["xpool"]["AP"] == claims["rows"]["xpool"]["AP"]
    assert "oracle" in capsys.readouterr().err


def test_world_overrides_name_their_folders() -> None:
    q = _quality()
    label, cfg = q.world_of("quick", ["ambiguity=0"])
    assert label == "quick-ambiguity0" and cfg.ambiguity == 0.0 and cfg.train == 400
    label, cfg = q.world_of("quick", ["ambiguity=0.5", "partial=0.2"])
    assert label == "quick-ambiguity0p5-partial0p2" and cfg.partial == 0.2
