"""Tables printed outside a terminal (a log, a pipe, CI, click's runner) fit 120 columns, in ASCII, and are whole: no
number cut, a long name folded onto more lines rather than cut (issue 61, item 5)."""

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


def _first_cells(output: str) -> list[str]:
    """The first column's text of each row of an ASCII table, a row's folded lines joined (a continuation line has
    nothing in its other cells)."""
    rows: list[str] = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) < 2 or set(cells[0]) <= {"-", "+"}:
            continue
        if any(cells[1:]) or not rows:
            rows.append(cells[0])
        else:
            rows[-1] += cells[0]
    return rows


def test_compare_fits_a_wide_table_into_120_columns_outside_a_terminal(tmp_path: Path) -> None:
    runs = []
    for i in range(3):
        run = tmp_path / f"a-run-with-a-rather-long-descriptive-name-{i}"
        run.mkdir()
        (run / "metrics.json").write_text(json.dumps(_metrics(i)))
        runs.append(run)
    res = invoke(["compare", *runs], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "…" not in res.output, res.output
    lines = res.output.splitlines()
    assert max(len(line) for line in lines) <= 120, res.output
    assert all(line.isascii() for line in lines), res.output  # the borders too: no box characters in a log
    names = _first_cells(res.output)
    for i in range(3):  # each name whole, folded across lines
        assert f"a-run-with-a-rather-long-descriptive-name-{i}" in names, names
        assert f"{1977.1 + i:.1f}" in res.output
    for cell in ("98765.4", "12345.6", "12.3 %", "65.4 %", "1888.8"):
        assert cell in res.output, cell


def test_evaluate_names_the_first_k_of_a_calibrated_run_in_any_spelling() -> None:
    """metrics.json's calibration section writes first_k (issue 62; "k" before): the terminal names it either way."""
    from rich.console import Console

    from dab_pipeline.cli.commands import evaluating

    for key in ("first_k", "k"):
        con = Console(record=True, width=120)
        evaluating._print_calibration(con, {key: 5, "method": "auto", "probabilities": {"first": {}}})
        assert "P(a match in the first 5)" in con.export_text()
    # a file of before the tables were nested ("first" at the top, "k" the integer): its table still printed
    row = {"ece": 0.123, "ece_mass": 0.2, "brier": 0.3, "log_loss": 0.4, "auroc": 0.5, "mean_probability": 0.2}
    row["accuracy"] = 0.25
    old = {"k": 5, "method": "auto", "first": {"softmax": row}, "first_k": {"softmax": row}}
    con = Console(record=True, width=120)
    evaluating._print_calibration(con, old)
    text = con.export_text()
    assert "0.123" in text and "P(a match in the first 5)" in text, text
    from dab_pipeline.results.calibration_md import md_calibration

    md = "\n".join(md_calibration({"calibration": old}))
    assert "**P(a match in the first 5)**" in md and md.count("| softmax | 0.123") == 2, md
    # a file written while the table took the name first_k (and lost the integer): no table printed as a k
    con = Console(record=True, width=120)
    evaluating._print_calibration(con, {"method": "auto", "first": {}, "first_k": {"softmax": {"ece": 0.1}}})
    assert "P(a match in the first k)" in con.export_text() and "{" not in con.export_text()
