"""benchmarks/risk_videos.py (issue 61, item 1) on a synthetic calibration.json: shares within [0, 1]; a
calibration whose confident answers are all right, over many drawn videos, answers; one always wrong never does;
a size below 2 videos is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ..helpers.benchmarks import load_benchmark


def _calibration(path: Path, right: bool) -> Path:
    """A calibration.json's risk part: 20 videos a half, 3 captions each, the first caption of each confident."""
    video = np.repeat(np.arange(20), 3)
    confidence = np.where(np.arange(60) % 3 == 0, 0.95, 0.1)
    correct = (confidence > 0.5) if right else np.zeros(60, bool)
    half = {"confidence": confidence.tolist(), "correct": correct.tolist(), "video": [f"v{v}" for v in video]}
    path.write_text(json.dumps({"risk": {**half, "fit": half}}))
    return path


def test_a_confident_right_calibration_answers_with_many_videos_and_a_wrong_one_never(tmp_path: Path) -> None:
    bench = load_benchmark("risk_videos")
    fit, held = bench.halves(_calibration(tmp_path / "right.json", True))
    many = bench.answered(fit, held, 400, 0.2, 0.05, draws=3)
    assert many[0] == 1.0 and 0 < many[1] <= 1 and 1 <= many[2] <= 20, many  # a third of queries are confident
    few = bench.answered(fit, held, 4, 0.2, 0.05, draws=3)
    assert 0 <= few[0] <= 1 and 0 <= few[1] <= 1
    fit, held = bench.halves(_calibration(tmp_path / "wrong.json", False))
    assert bench.answered(fit, held, 400, 0.2, 0.05, draws=3) == (0.0, 0.0, 0.0)


def test_a_size_below_two_videos_is_refused(tmp_path: Path) -> None:
    bench = load_benchmark("risk_videos")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--calibration", str(_calibration(tmp_path / "c.json", True)), "--videos", "1"])
    assert exc.value.code == 2
