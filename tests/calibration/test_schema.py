"""calibration.json checked whole when read (issue 59, items 3 and 4): every damaged field is one line naming it,
never a traceback and never numbers used silently; dab never writes a NaN."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.calibration import calibrate_costs, read_calibration, write_calibration
from dab_pipeline.core.errors import ConfigError

from .synthetic import synthetic_costs

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def good() -> dict:
    cost, gt, tv = synthetic_costs(60, 20, seed=4)
    return calibrate_costs(cost, gt, 1.0, tv).to_dict()


def _write(tmp_path: Path, d: dict, text: str | None = None) -> Path:
    path = tmp_path / "calibration.json"
    path.write_text(text if text is not None else json.dumps(d))
    return path


def _set(d: dict, dotted: str, value) -> dict:
    d = copy.deepcopy(d)
    *parents, last = dotted.split(".")
    node = d
    for p in parents:
        node = node[p]
    node[last] = value
    return d


@pytest.mark.parametrize(
    "dotted, value, said",
    [
        ("maps.first.params.coef", "abc", "maps.first.params.coef must be a list of numbers"),
        ("maps.first.params.coef", [1.0], "maps.first.params.coef holds 1 values"),
        ("maps.first.kind", "spline", "maps.first.kind must be one of logistic, isotonic"),
        ("first_k", "five", "first_k must be a whole number"),
        ("conformal.aps", "abc", "conformal.aps must be a list"),
        ("conformal.aps", [0.5] * 2_000_000, "conformal.aps must be a list of 60 values"),
        ("risk.correct", ["yes"] * 30, "risk.correct must hold"),
        ("risk.confidence", [0.5], "risk.confidence holds 1 values"),
        ("weights", [1.0] * 60, "weights must be positive and add up"),
        ("held_out", [0] * 60, "held_out marks 0 queries"),
        ("risk.test", "t", "risk.test must be one of"),
        ("temperature", -1.0, "temperature must be a finite number"),
        ("queries", 61, "must equal queries 61"),
        ("risk.test", "binomial", "risk.test must be one of wsr, hb"),
        ("risk.fit.video", "mixed", "must hold whole numbers only or strings only"),
        ("provenance", {"index": "x"}, "provenance.index must be null or hold"),
        ("provenance", {"gallery": []}, "provenance.gallery must be an object"),
    ],
)
def test_a_damaged_field_is_one_line_naming_it(good: dict, tmp_path: Path, dotted: str, value, said: str) -> None:
    if value == "mixed":  # ints and strings in one list: not comparable
        value = [0, "v"] * (len(good["risk"]["fit"]["video"]) // 2) + [0] * (len(good["risk"]["fit"]["video"]) % 2)
    d = _set(good, dotted, value)
    with pytest.raises(ConfigError) as err:
        read_calibration(_write(tmp_path, d))
    msg = str(err.value)
    assert said in msg and "make it again with `dab calibrate`" in msg and "\n" not in msg, msg
    assert str(tmp_path / "calibration.json") in msg  # the file is named (an unknown map kind did not name it)


def test_a_nan_anywhere_is_refused_and_dab_writes_none(good: dict, tmp_path: Path) -> None:
    text = json.dumps(good).replace('"seed": 0', '"seed": 0, "x": NaN', 1)
    with pytest.raises(ConfigError, match="NaN, which is not JSON"):
        read_calibration(_write(tmp_path, good, text))
    scores = json.dumps(_set(good, "conformal.aps", [float("nan")] * 60))  # json.dumps writes a bare NaN
    with pytest.raises(ConfigError, match="NaN, which is not JSON"):
        read_calibration(_write(tmp_path, good, scores))
    # one-class held-out outcomes give an undefined AUROC: written as null, never NaN
    cost, gt, tv = synthetic_costs(30, 20, seed=1)
    cost[np.arange(30), gt] -= 100.0  # every first hit right
    cal = calibrate_costs(cost, gt, 1.0, tv)
    path = write_calibration(tmp_path / "one-class.json", cal)
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"dab wrote {c}"))
    assert read_calibration(path).report["first"]["calibrated"]["auroc"] is None


def test_a_directory_in_its_place_is_named(tmp_path: Path) -> None:
    (tmp_path / "calibration.json").mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a calibration file"):
        read_calibration(tmp_path / "calibration.json")
