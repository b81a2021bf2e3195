"""Tables printed outside a terminal (a log, a pipe, CI, click's runner) are whole: no cell cut to fit 80 columns."""

from __future__ import annotations

import json
from pathlib import Path

from ..helpers.runner import invoke


def _metrics(i: int) -> dict:
    t2v = {
        "R@1": 1977.123 + i,
        "R@5": 2345.6,
        "R@10": 3456.7,
        "R@50": 4567.8,
        "MdR": 1234.5,
        "MnR": 98765.4,
        "RSum": 12345.6,
    }
    bridge = {"pair_dependent_share": {"mu": 0.123456, "logvar": 0.654321}, "constant_control": {"R@1": 1888.8}}
    return {"t2v": t2v, "v2t": dict(t2v), "bridge": bridge}


def test_compare_prints_a_wide_table_whole_outside_a_terminal(tmp_path: Path) -> None:
    runs = []
    for i in range(3):
        run = tmp_path / f"a-run-with-a-rather-long-descriptive-name-{i}"
        run.mkdir()
        (run / "metrics.json").write_text(json.dumps(_metrics(i)))
        runs.append(run)
    res = invoke(["compare", *runs], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "…" not in res.output, res.output
    width = max(len(line) for line in res.output.splitlines())
    assert width > 80, res.output  # wider than the 80 columns rich assumes without a terminal
    for i in range(3):
        assert f"a-run-with-a-rather-long-descriptive-name-{i}" in res.output and f"{1977.1 + i:.1f}" in res.output
    for cell in ("98765.4", "12345.6", "12.3 %", "65.4 %", "1888.8"):
        assert cell in res.output, cell
