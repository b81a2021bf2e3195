"""`dab evaluate`'s calibration section is measured where the calibration promises something: a run calibrated
with `--gallery all` gets its test queries scored against every video (the gallery calibrated on), not against the
test split's own videos (issue 61: the demo's report measured on a gallery it then warned against)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.stages.calibrate import CalibrateConfig, run_calibrate

from ..helpers.models import hand_made_run, write_split_costs
from ..helpers.stores import CALIBRATION_CAPTIONS, CALIBRATION_SPLITS, SEARCH_CAPTIONS, text_store

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def calibrated_on_all(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a hand-made dab run whose test costs rank the 6 test videos, calibrated on its validation captions against
    every video of the store (48), its store)."""
    root = tmp_path_factory.mktemp("evaluate-gallery")
    store = text_store(root / "store.h5", SEARCH_CAPTIONS + CALIBRATION_CAPTIONS, frames=4, splits=CALIBRATION_SPLITS)
    run, model = hand_made_run(root / "run", store, "dab")
    write_split_costs(run, model, store, "test")
    run_calibrate(CalibrateConfig(run=run, gallery="all", device="cpu"))
    return run, store


def _first_right_on_all(run: Path, store: Path) -> np.ndarray:
    """(Q,) whether each test query's first hit among every video of the store is its own: the plain reference."""
    from dab_pipeline.runs.load import load_run
    from dab_pipeline.scoring import score_all
    from dab_pipeline.store import open_store

    model = load_run(run, "cpu").model
    with open_store(store) as st:
        test, every = st.load_split("test"), st.load_split("all")
    cost = score_all(model, test.text, every.frames, every.frame_mask).cost  # (Q, V)
    pos = {str(v): i for i, v in enumerate(every.video_ids)}
    gt = np.array([pos[str(v)] for v in test.video_ids[test.caption_video]])
    return cost.argmin(axis=1) == gt


def test_the_section_is_measured_against_the_gallery_calibrated_on(calibrated_on_all: tuple[Path, Path]) -> None:
    from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate

    run, store = calibrated_on_all
    cal = run_evaluate(EvaluateConfig(run=run, examples=0, plots=False))["calibration"]
    assert cal["test"] == {"queries": 6, "split": "all", "videos": 48, "scored_here": True, "why_not": None}
    assert cal["same_gallery"] is True
    right = _first_right_on_all(run, store)
    for name, row in cal["probabilities"]["first"].items():  # accuracy: the first hit right among all 48 videos
        assert row["accuracy"] == pytest.approx(right.mean()), name
    report = (run / "report.md").read_text()
    assert "48 videos of split 'all', the gallery calibrated on" in report, report
    assert "not* guaranteed here" not in report
    # the retrieval metrics stay the test split's own (6 videos): only the calibration section moved
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["calibration"]["test"]["videos"] == 48


def test_a_store_gone_measures_on_the_test_videos_and_says_why(
    calibrated_on_all: tuple[Path, Path], tmp_path: Path
) -> None:
    from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate

    run, store = calibrated_on_all
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    moved = store.with_name("moved.h5")
    store.rename(moved)
    warnings: list[str] = []
    try:
        cal = run_evaluate(
            EvaluateConfig(run=copy, examples=0, plots=False),
            progress=lambda e: warnings.append(e.message) if e.kind == "warning" else None,
        )["calibration"]
    finally:
        moved.rename(store)
    assert cal["test"]["scored_here"] is False and cal["test"]["videos"] == 6 and cal["same_gallery"] is False
    assert "holds the gallery calibrated on" in cal["test"]["why_not"], cal["test"]
    assert any("calibration section on the test split's own videos" in w for w in warnings), warnings
    assert "Not measured on the gallery calibrated on: no store at" in (copy / "report.md").read_text()


def test_the_gallery_is_found_from_another_directory_through_the_store_evaluate_reads(
    calibrated_on_all: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """calibration.json records the store's absolute path, and evaluate tries the store it reads first (--features):
    a run and store moved together are measured on the gallery calibrated on from any working directory."""
    from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate

    run, store = calibrated_on_all
    assert json.loads((run / "calibration.json").read_text())["provenance"]["gallery"]["store"] == str(store.resolve())
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copytree(run, moved / "run")
    shutil.copy(store, moved / "store.h5")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    store.rename(store.with_name("hidden.h5"))  # the recorded path no longer holds it
    try:
        cal = run_evaluate(
            EvaluateConfig(run=Path("../moved/run"), features=Path("../moved/store.h5"), examples=0, plots=False)
        )["calibration"]
    finally:
        store.with_name("hidden.h5").rename(store)
    assert cal["test"]["scored_here"] is True and cal["test"]["videos"] == 48, cal["test"]


def test_a_run_calibrated_on_its_validation_split_is_measured_on_the_test_videos_without_a_new_warning(
    tmp_path: Path,
) -> None:
    """The default calibration (gallery: the validation split) cannot hold the test queries: nothing is scored, no
    warning beyond the section's own note that the gallery is another."""
    from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate

    store = text_store(
        tmp_path / "store.h5", SEARCH_CAPTIONS + CALIBRATION_CAPTIONS, frames=4, splits=CALIBRATION_SPLITS
    )
    run, model = hand_made_run(tmp_path / "run", store, "dab")
    write_split_costs(run, model, store, "test")
    run_calibrate(CalibrateConfig(run=run, device="cpu"))
    events: list = []
    cal = run_evaluate(EvaluateConfig(run=run, examples=0, plots=False), progress=events.append)["calibration"]
    assert cal["test"] == {"queries": 6, "split": None, "videos": 6, "scored_here": False, "why_not": None}
    assert cal["same_gallery"] is False
    assert not [e for e in events if e.kind == "warning" and "calibration section" in (e.message or "")], events
