"""run_train: one run from its config to its finished folder, one code path for one process and many; a stop on
an error or Ctrl-C recorded in status.json. The trainer that fits the model is :mod:`.trainer`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import torch

from ...core.errors import ConfigError, DabError, StoreError, WriteError
from ...core.events import Event, ProgressCallback, null_progress
from ...runs.config import TrainConfig
from ...runs.run_folder import RunFolder
from ...runtime.capabilities import capabilities, resolve_amp, resolve_score_dtype
from ...runtime.devices import resolve_device
from ...runtime.distributed import LocalContext
from .config import TrainResult
from .session import TrainRun
from .trainer import Trainer


def run_train(
    cfg: TrainConfig, progress: ProgressCallback = null_progress, resume: bool = False, dist=None
) -> TrainResult:
    """Train on ``cfg.features``; write the run folder ``cfg.out``. ``resume`` continues a stopped run.

    A run that stops on an error or Ctrl-C after its folder exists records that in
    status.json ("failed" / "interrupted", with the reason), so `dab evaluate` says
    so, and a rerun of the same command starts over when there is no checkpoint to
    resume from.
    """
    folder: dict[str, Any] = {}
    done = RunFolder(cfg.out).read_status() if resume else {}
    if done.get("state") == "complete":
        return _already_complete(cfg, done, progress)
    try:
        return _run_train(cfg, progress, resume, dist, folder)
    except BaseException as exc:
        if folder.get("ready"):  # the folder is this process's (it holds the lock): say why it stopped
            _record_stop(cfg, exc)
        if isinstance(exc, WriteError):
            raise WriteError(f"{exc}; {_after_write_error(cfg, resume)}") from exc
        raise
    finally:
        if "locks" in folder:
            folder["locks"].close()  # the folder's writer lock, last


def _record_stop(cfg: TrainConfig, exc: BaseException) -> None:
    """status.json says why the run stopped; on a full disk that write may fail too, and must not hide ``exc``."""
    state = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    folder = RunFolder(cfg.out)
    try:
        folder.write_status(
            state=state, error=reason, features=str(cfg.features), resumable=folder.checkpoint(RunFolder.LAST).exists()
        )
    except (DabError, OSError):
        pass  # the folder keeps status "running" with no live lock holder: a killed run, which reruns handle


def _after_write_error(cfg: TrainConfig, resume: bool) -> str:
    """What to do after a write the file system refused: the same command starts over, or --resume continues."""
    if RunFolder(cfg.out).checkpoint(RunFolder.LAST).exists():
        return f"free some space, then continue with `dab train --resume --out {cfg.out}`"
    return "free some space and run the same command again (the run starts over: it had no checkpoint)"


def _already_complete(cfg: TrainConfig, status: dict, progress: ProgressCallback) -> TrainResult:
    """--resume of a finished run: nothing to do, and nothing in its folder is rewritten."""
    run = RunFolder(cfg.out)
    progress(
        Event("info", message=f"{run.path} is complete (best epoch {status.get('best_epoch')}): nothing to resume")
    )
    try:
        costs: Optional[Path] = run.find_costs()
    except (ConfigError, StoreError):  # a complete run without test costs (no test split)
        costs = None
    return TrainResult(
        run_dir=run.path,
        epochs_done=int(status.get("epochs") or cfg.epochs),
        best_epoch=status.get("best_epoch"),
        best_value=status.get("best_value"),
        val_metrics=status.get("val"),
        test_metrics=status.get("test_t2v"),
        costs_path=costs,
    )


def _resolve_precision(
    cfg: TrainConfig, device: torch.device, progress: ProgressCallback
) -> tuple[TrainConfig, dict[str, Any]]:
    """``amp`` and ``score_dtype`` as this device runs them, and the record written as precision.json."""
    amp, score = resolve_amp(cfg.amp, device), resolve_score_dtype(cfg.score_dtype, device)
    for choice in (amp, score):
        if choice.warning:
            progress(Event("warning", message=choice.warning))
    record = {
        "amp": {"requested": amp.requested, "used": amp.dtype},
        "score_dtype": {"requested": score.requested, "used": score.dtype},
        "device": capabilities(device).as_dict(),
    }
    return dataclasses.replace(cfg, amp=amp.dtype, score_dtype=score.dtype), record


def _run_train(cfg: TrainConfig, progress: ProgressCallback, resume: bool, dist, folder: dict) -> TrainResult:
    """The body of :func:`run_train`; sets ``folder["ready"]`` once this process owns a run folder.

    ``dist`` (a :class:`dab_pipeline.runtime.distributed.DistContext` of a torchrun job
    with several processes): DistributedDataParallel training; ``batch_size``
    is the *global* batch, split evenly over the ranks, so a run gives the same
    updates whatever the number of processes (dropout noise aside). Only rank 0
    writes the run folder; every rank reads the store. One process runs the same
    code with a :class:`~dab_pipeline.runtime.distributed.LocalContext`.
    """
    ctx = dist if dist is not None and dist.world_size > 1 else LocalContext(resolve_device(cfg.device))
    if not ctx.is_main:
        progress = null_progress  # one progress display: rank 0's
    run = TrainRun(cfg, ctx, progress, resume)
    ctx.run_on_main(run.check_folder)  # the run folder is rank 0's
    asked = cfg  # what config.json records and --resume compares: the request, not this machine's answer
    cfg, precision = _resolve_precision(cfg, ctx.device, progress)
    run.cfg = cfg
    data = run.load_data()
    if run.cfg.batch_size != cfg.batch_size:  # lowered to the training split: precision.json records what ran
        # config.json keeps the request, so a rerun, a sweep's resume or run_train(resume=True) with the same
        # config compares equal, and lowers it again the same way (the same store)
        precision["batch_size"] = {"requested": cfg.batch_size, "used": run.cfg.batch_size}
        cfg = run.cfg
    folder["locks"] = run.locks  # released by run_train, after a failure is recorded
    ctx.run_on_main(lambda: run.open_folder(asked, precision, data.manifest, folder))
    trainer = Trainer(run, data)
    trainer.restore()
    trainer.fit()
    test_metrics, costs_path = trainer.test()
    return trainer.finish(test_metrics, costs_path)
