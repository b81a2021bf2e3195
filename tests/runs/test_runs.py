"""RunFolder: the run-folder layout that train, distill, evaluate and search share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dab_pipeline.core.errors import ConfigError, StoreError
from dab_pipeline.runs.run_folder import RunFolder
from dab_pipeline.stages.train import TrainConfig


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
