"""Where run folders go and where their store is found again: --out inside another run, copied runs, other cwds."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.runs.config import TrainConfig
from dab_pipeline.runs.run_folder import RunFolder
from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate
from dab_pipeline.stages.train import run_train
from dab_pipeline.testing import random_store

from ..helpers.runner import invoke
from ..helpers.training import interrupted_run, train_config


def _outer_run(path: Path, store: Path) -> Path:
    """A run folder as `dab train` starts one: config.json and status.json."""
    run = RunFolder(path)
    run.path.mkdir(parents=True)
    run.save_config(TrainConfig(features=store, out=path))
    run.write_status(state="complete")
    return path


def test_train_refuses_out_inside_another_run(tmp_path: Path) -> None:
    store = random_store(tmp_path / "store.h5")
    outer = _outer_run(tmp_path / "runs" / "a", store)
    with pytest.raises(ConfigError, match=re.escape(f"inside the run folder {outer}")):
        run_train(train_config(store, outer / "sub" / "deeper", "epochs=1"))
    assert not (outer / "sub").exists()  # refused before anything was written
    res = invoke(["train", "--features", str(store), "--out", str(outer / "sub"), "--quiet"])
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, text
    assert f"inside the run folder {outer}" in text
    assert not (outer / "sub").exists()


def test_train_next_to_a_run_is_accepted(tmp_path: Path) -> None:
    """A sibling of a run folder, and a folder under a stray config.json that is no run, are fine."""
    store = random_store(tmp_path / "store.h5")
    _outer_run(tmp_path / "runs" / "a", store)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "config.json").write_text("{}")  # another tool's config, not a dab run
    for out in (tmp_path / "runs" / "b", tmp_path / "project" / "runs" / "c"):
        run_train(train_config(store, out, "epochs=1"))
        assert RunFolder(out).state == "complete"


def _trained_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(where training ran, another working directory), with a store given by a relative path."""
    made, elsewhere = tmp_path / "made", tmp_path / "elsewhere"
    made.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(made)
    random_store(Path("store.h5"))
    return made, elsewhere


def test_a_copied_run_evaluated_from_another_directory_finds_its_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made, elsewhere = _trained_elsewhere(tmp_path, monkeypatch)
    run_train(train_config(Path("store.h5"), Path("run"), "model.variant=dab", "epochs=1"))
    saved = json.loads(Path("run/config.json").read_text())
    assert saved["features"] == "store.h5" and saved["features_abs"] == str((made / "store.h5").resolve())
    monkeypatch.chdir(elsewhere)
    shutil.copytree(made / "run", "copy")
    res = run_evaluate(EvaluateConfig(run=Path("copy"), plots=False, examples=0))
    assert "neighbourhood" in res and "bridge" in res  # the store diagnostics ran


@pytest.mark.parametrize("how", ["copied-elsewhere", "old-config-json"])
def test_a_run_with_a_relative_store_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The recorded absolute path finds the store from another cwd; a config.json without it (older dab) still
    resumes; neither looks like a changed configuration."""
    made, elsewhere = _trained_elsewhere(tmp_path, monkeypatch)
    interrupted_run(Path("store.h5"), Path("run"), monkeypatch)
    config = made / "run" / "config.json"
    if how == "old-config-json":
        data = json.loads(config.read_text())
        del data["features_abs"]
        config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        target = Path("run")
    else:
        monkeypatch.chdir(elsewhere)
        shutil.copytree(made / "run", "copy")
        target = Path("copy")
    before = (target / "config.json").read_text()
    res = invoke(["train", "--resume", "--out", str(target), "--quiet"])
    assert res.exit_code == 0, res.output
    assert RunFolder(target).state == "complete"
    assert (target / "config.json").read_text() == before  # a resume rewrites no configuration
