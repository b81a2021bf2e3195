"""`dab evaluate` on a calibrated run prints a short calibration section in the terminal (report.md has the long one):
P(the first hit is a match) against its baselines and the conformal sets' coverage, within 120 columns in a log
(issue 61, item 4d)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from dab_pipeline.stages.calibrate import CalibrateConfig, run_calibrate

from ..helpers.models import hand_made_run, write_split_costs
from ..helpers.runner import invoke
from ..helpers.stores import CALIBRATION_CAPTIONS, CALIBRATION_SPLITS, SEARCH_CAPTIONS, text_store

pytest.importorskip("sklearn")

VAL, SPLITS = CALIBRATION_CAPTIONS, CALIBRATION_SPLITS


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hand-made dab run whose test costs are the validation captions' (40 queries, 40 videos), calibrated."""
    root = tmp_path_factory.mktemp("evaluate-calibration")
    store = text_store(root / "store.h5", SEARCH_CAPTIONS + VAL, frames=4, splits=SPLITS)
    run, model = hand_made_run(root / "run", store, "dab")
    write_split_costs(run, model, store, "val")
    run_calibrate(CalibrateConfig(run=run, device="cpu"))
    return run


def _lines(output: str) -> list[str]:
    lines = output.splitlines()
    assert all(len(line) <= 120 for line in lines), "\n".join(x for x in lines if len(x) > 120)
    assert not any("\ufffd" in line for line in lines), output
    return lines


def _row(lines: list[str], first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first`` (ASCII borders outside a terminal)."""
    for line in lines:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r}:\n" + "\n".join(lines))


def test_evaluate_prints_the_calibration_of_a_calibrated_run(calibrated: Path) -> None:
    out = invoke(["evaluate", "--run", calibrated, "--examples", "0", "--no-plots"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    lines = _lines(out.output)
    cal = json.loads((calibrated / "metrics.json").read_text())["calibration"]
    header = next(x for x in lines if x.startswith("calibration (dab calibrate"))
    assert f"fitted on {cal['calibrated_on']['queries']} queries of split 'val'" in header, out.output
    assert "P(the first hit is a match), on the test queries" in out.output
    assert cal["first_k"] == 5 and "P(a match in the first 5), reliability" in out.output, out.output  # the integer k
    tables = cal["probabilities"]
    assert set(tables) == {"first", "first_k"} and "{" not in out.output, out.output  # no dict printed as a k
    for name, r in tables["first"].items():  # each probability's figures, as metrics.json holds them
        cells = _row(lines, name)
        want = ["-" if r[k] is None else f"{r[k]:.3f}" for k in ("ece", "ece_mass", "brier", "log_loss", "auroc")]
        assert cells[1:6] == want, (name, cells)
    assert set(tables["first"]) == {"calibrated", "margin_sigmoid", "softmax"}
    assert "conformal sets on the test queries" in out.output
    rows = [(score, asked, s) for score, per in cal["sets"].items() for asked, s in per.items()]
    assert rows
    printed = [[c.strip() for c in x.split("|")[1:-1]] for x in lines]
    for score, asked, s in rows:  # every (score, coverage asked) row, its measured coverage and mean size
        want = [score, asked, f"{s['coverage']:.3f}", f"{s['standard_error']:.3f}", f"{s['size_mean']:.1f}"]
        assert any(cells[:5] == want for cells in printed), (want, out.output)
    # the section comes before the files written, after the retrieval table
    assert (
        out.output.index("text-to-video") < out.output.index("calibration (dab calibrate") < out.output.index("wrote ")
    )


def test_an_undefined_auroc_is_a_dash_and_a_run_without_calibration_prints_no_section(
    calibrated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AUROC of one-class outcomes is None in the results (report.md prints "-"): so does the terminal."""
    import dab_pipeline.stages.evaluate as evaluate_stage

    results = json.loads((calibrated / "metrics.json").read_text())
    one_class = copy.deepcopy(results)
    for r in one_class["calibration"]["probabilities"]["first"].values():
        r["auroc"] = None
    monkeypatch.setattr(evaluate_stage, "run_evaluate", lambda cfg, progress=None: one_class)
    out = invoke(["evaluate", "--run", calibrated, "--examples", "0", "--no-plots"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    lines = _lines(out.output)
    for name in one_class["calibration"]["probabilities"]["first"]:
        assert _row(lines, name)[5] == "-", out.output  # the AUROC column
    without = {k: v for k, v in results.items() if k != "calibration"}
    monkeypatch.setattr(evaluate_stage, "run_evaluate", lambda cfg, progress=None: without)
    out = invoke(["evaluate", "--run", calibrated, "--examples", "0", "--no-plots"], catch_exceptions=False)
    assert out.exit_code == 0 and "calibration (dab calibrate" not in out.output, out.output
    assert "P(the first hit" not in out.output and "conformal" not in out.output, out.output
