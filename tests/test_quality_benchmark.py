"""benchmarks/quality.py end to end on the tiny world (the --quick path, smaller still)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _quality():
    spec = importlib.util.spec_from_file_location("quality_benchmark", REPO / "benchmarks" / "quality.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quality_benchmark_runs_every_kind_of_row(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    q = _quality()
    out = tmp_path / "report"
    res = q.main(["--world", "tiny", "--seeds", "1", "--variants", "zero-shot", "xpool", "dab-T1", "dab-ft2",
                  "--epochs", "1", "--data-dir", str(tmp_path / "data"), "--out", str(out)])
    table = res["table"]
    assert set(table) == {"zero-shot", "xpool", "dab-T1", "dab-ft2"}
    for name, row in table.items():
        assert 0 <= row["t2v R@1"]["mean"] <= 100 and row["t2v MnR"]["mean"] >= 1, name
        assert row["AURC"]["mean"] <= row["AURC random"]["mean"] + 0.2, name
    assert table["dab-T1"]["var text"] is not None and table["xpool"]["var text"] is None
    assert res["oracle"]["R@1"] == pytest.approx(100.0)  # every tiny-world query is true of one test video
    md = (out / "quality.md").read_text()
    assert "| oracle (claims) |" in md and "| dab-ft2 |" in md
    saved = json.loads((out / "quality.json").read_text())
    assert saved["recipe"]["lr"] == q.RECIPE["lr"] and saved["machine"]["cores"] >= 1
    # a rerun reuses the finished runs instead of training again
    again = q.main(["--world", "tiny", "--seeds", "1", "--variants", "xpool", "--epochs", "1",
                    "--data-dir", str(tmp_path / "data")])
    assert again["table"]["xpool"]["t2v R@1"] == table["xpool"]["t2v R@1"]
    assert "oracle" in capsys.readouterr().err
