"""One run of a sweep, as any worker runs it: what state its folder is in, and train-then-evaluate."""

from __future__ import annotations

import dataclasses
import shutil
import time
import traceback
from typing import Any

from ...core.errors import ConfigError, DabError
from ...core.events import ProgressCallback, null_progress
from ...core.fsutil import atomic_write_text
from ...core.overrides import differences, from_dict
from ...runs import RunFolder
from ...runs.config import TrainConfig
from ..evaluate import EvaluateConfig, run_evaluate
from ..train import run_train
from .plan import PlannedRun

__all__ = ["run_state", "execute_run"]


def run_state(run: PlannedRun, replace: bool = False) -> str:
    """ "done" (complete, evaluated, same config), "evaluate" (complete, not evaluated), "resume", "start".

    Raises ConfigError when the folder holds a run of another configuration: a sweep never trains
    over a run it did not plan (``replace``: a cache's folder, emptied instead, and the run starts).
    """
    folder = RunFolder(run.config.out)
    if not folder.is_run():
        return "start"
    saved = dataclasses.replace(folder.load_config(TrainConfig), out=run.config.out)
    diff = differences(saved, run.config)
    if diff and replace:
        shutil.rmtree(folder.path)
        return "start"
    if diff:
        raise ConfigError(
            f"{folder.path} holds a run of another configuration ({', '.join(diff[:3])}); move it "
            "away, or choose another --out"
        )
    status = folder.read_status()
    if status.get("state") == "complete":
        return "done" if (folder.path / "metrics.json").is_file() else "evaluate"
    return "resume" if folder.checkpoint(RunFolder.LAST).exists() else "start"


def execute_run(
    config: dict[str, Any], examples: int = 0, progress: ProgressCallback = null_progress, replace: bool = False
) -> dict[str, Any]:
    """Train (or resume) and evaluate one run: ``{"ok", "seconds", "error"}``. Never raises for a run's failure,
    so a worker process or a Ray task reports it instead of dying (a KeyboardInterrupt still stops it)."""
    cfg = from_dict(TrainConfig, config)
    t0 = time.perf_counter()
    try:
        state = run_state(PlannedRun("", cfg.seed, cfg), replace=replace)
        if state in ("start", "resume"):
            run_train(cfg, progress=progress, resume=state == "resume")
        if state != "done":
            run_evaluate(EvaluateConfig(run=cfg.out, plots=False, examples=examples))
        return {"ok": True, "seconds": time.perf_counter() - t0, "error": None}
    except DabError as exc:
        return {"ok": False, "seconds": time.perf_counter() - t0, "error": str(exc).splitlines()[0]}
    except Exception as exc:  # a bug or a full disk in one run: the others go on, the traceback is kept
        try:
            atomic_write_text(cfg.out / "sweep_error.txt", traceback.format_exc())
        except DabError:  # a full disk: the run's error is the one to report
            pass
        return {
            "ok": False,
            "seconds": time.perf_counter() - t0,
            "error": f"{type(exc).__name__}: {exc} (traceback in {cfg.out / 'sweep_error.txt'})",
        }
