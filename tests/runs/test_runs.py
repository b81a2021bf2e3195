"""RunFolder: the run-folder layout that train, distill, evaluate and search share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dab_pipeline.core.errors import ConfigError, StoreError
from dab_pipeline.runs.config import TrainConfig
from dab_pipeline.runs.run_folder import RunFolder


def test_status_round_trips_and_a_torn_status_reads_as_unknown(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    assert run.read_status() == {} and run.state == "unknown" and not run.is_run()
    run.write_status(state="running", features=Path("s.h5"))
    assert json.loads((tmp_path / "status.json").read_text()) == {"state": "running", "features": "s.h5"}
    assert run.state == "running"
    (tmp_path / "status.json").write_text('{"state": "comp')  # a torn file is not a crash for the reader
    assert run.read_status() == {} and run.state == "unknown"


def test_config_and_checkpoints_round_trip(tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "run")
    with pytest.raises(ConfigError, match="not a run folder"):
        run.load_config(TrainConfig)
    run.path.mkdir()
    cfg = TrainConfig(features=Path("store.h5"), out=run.path, epochs=3)
    run.save_config(cfg)
    assert run.is_run() and run.load_config(TrainConfig) == cfg
    assert run.load_checkpoint(RunFolder.LAST) is None
    run.checkpoint_dir.mkdir()
    run.save_checkpoint(RunFolder.LAST, {"epoch": 2, "w": torch.ones(3)})
    ck = run.load_checkpoint(RunFolder.LAST)
    assert ck["epoch"] == 2 and torch.equal(ck["w"], torch.ones(3))
    assert run.checkpoint() == run.path / "checkpoints" / "best.pt"


def test_metrics_log_appends_and_clear_start_removes_only_the_start_files(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    run.append_metrics({"epoch": 1})
    run.append_metrics({"epoch": 2})
    assert [json.loads(x)["epoch"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    for name in ("config.json", "status.json", "store_manifest.json", "precision.json"):
        (tmp_path / name).write_text("{}")
    run.clear_start()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precision.json"]


def test_find_costs_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a folder"):
        RunFolder(tmp_path / "nope").find_costs()
    run = RunFolder(tmp_path)
    run.write_status(state="failed")
    with pytest.raises(StoreError, match="no cost file.*'failed'"):
        run.find_costs()
    (tmp_path / "costs_test.zarr").mkdir()
    (tmp_path / "costs_notes.txt").write_text("not a cost file")
    assert run.find_costs() == tmp_path / "costs_test.zarr" == run.costs_path("test", "zarr")


def test_config_records_the_store_absolute_and_an_old_config_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run = RunFolder("run")
    run.path.mkdir()
    cfg = TrainConfig(features=Path("store.h5"), out=run.path)
    run.save_config(cfg)
    saved = json.loads(run.config_path.read_text())
    assert saved["features"] == "store.h5" and saved["features_abs"] == str(tmp_path.resolve() / "store.h5")
    assert run.load_config(TrainConfig) == cfg  # no store anywhere: the path as recorded
    del saved["features_abs"]  # a config.json of an older dab
    run.config_path.write_text(json.dumps(saved))
    assert run.load_config(TrainConfig) == cfg


def test_the_store_is_found_relative_to_the_cwd_then_the_run_then_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "made").mkdir()
    monkeypatch.chdir(tmp_path / "made")
    run = RunFolder("run")
    run.path.mkdir()
    run.save_config(TrainConfig(features=Path("store.h5"), out=run.path))
    absolute = tmp_path.resolve() / "made" / "store.h5"
    absolute.write_text("the store")
    assert run.load_config(TrainConfig).features == Path("store.h5")  # from where it was made: as recorded
    monkeypatch.chdir(tmp_path)
    run = RunFolder(tmp_path / "made" / "run")
    assert run.load_config(TrainConfig).features == absolute  # elsewhere: the absolute path
    inside = run.path / "store.h5"  # before it: a store travelling inside the run folder
    inside.write_text("a store inside the run")
    assert run.load_config(TrainConfig).features == inside
    (tmp_path / "store.h5").write_text("a store where the path points from here")  # first: the cwd
    assert run.load_config(TrainConfig).features == Path("store.h5")


def test_enclosing_run_is_the_nearest_run_folder_above(tmp_path: Path) -> None:
    from dab_pipeline.runs.run_folder import check_not_inside_run, enclosing_run

    outer = RunFolder(tmp_path / "runs" / "a")
    outer.path.mkdir(parents=True)
    outer.save_config(TrainConfig(features=Path("s.h5"), out=outer.path))
    outer.write_status(state="running")
    assert enclosing_run(tmp_path / "runs" / "b") is None and enclosing_run(outer.path) is None
    assert enclosing_run(outer.path / "sub" / "deeper") == outer.path
    with pytest.raises(ConfigError, match="inside the run folder"):
        check_not_inside_run(outer.path / "sub")
    (tmp_path / "config.json").write_text("{}")  # a config.json alone (another tool's) is no run folder
    assert enclosing_run(tmp_path / "x") is None
