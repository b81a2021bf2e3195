"""run_distill: the S-step student of a bridge run, trained against its frozen teacher into a run folder."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from ...core.errors import ConfigError, TrainingError
from ...core.events import Event, ProgressCallback, null_progress
from ...core.fsutil import sha256_file
from ...core.overrides import differences, from_dict, to_dict
from ...metrics import t2v_metrics
from ...model import DABModel
from ...model.losses import distill_loss
from ...runs.costfile import run_costs, write_costs
from ...runs.inputs import SplitArrays
from ...runs.load import load_run
from ...runs.run_folder import RunFolder, check_not_inside_run
from ...runs.schedule import epoch_length, lr_lambda
from ...runtime.devices import resolve_device
from ...runtime.distributed import LocalContext
from ...scoring import score_all
from ...store import open_store
from ...training import Loop, LoopSettings
from .build import saved_distill
from .config import DistillConfig, DistillResult, inherit_from_teacher


def pair_outputs(model, text: torch.Tensor, frames: torch.Tensor, mask: torch.Tensor):
    """The batch's (B, B) cost and every pair's bridged state ([mu, logvar] or [x], each (B, B, D))."""
    terms = model.pair_terms(model.encode_text(text), model.encode_video(frames, mask), grid=True)
    state = [terms.bridged_mu] + ([terms.bridged_logvar] if terms.bridged_logvar is not None else [])
    return terms.cost, state


def build_student(teacher, steps: int):
    """The teacher's model with ``steps`` bridge steps, every weight copied; only the bridge trains."""
    cfg = dataclasses.replace(teacher.cfg, steps=steps)
    student = DABModel(cfg)
    student.load_state_dict(teacher.state_dict())
    for name, p in student.named_parameters():
        p.requires_grad_(name.startswith("bridge."))
    return student


def run_distill(cfg: DistillConfig, progress: ProgressCallback = null_progress, resume: bool = False) -> DistillResult:
    """Train the S-step student of ``cfg.teacher`` into the run folder ``cfg.out``."""
    device = resolve_device(cfg.device)
    teacher_run = _load_teacher(cfg, device)
    teacher, tcfg = teacher_run.model, teacher_run.config
    out = Path(cfg.out)
    folder = RunFolder(out)
    if folder.is_run() and not resume:
        raise TrainingError(f"{out} already holds a run; use --resume to continue it, or choose another --out")
    if not resume:
        check_not_inside_run(out)  # a student inside another run's folder would be taken for part of it
    cfg, taken = inherit_from_teacher(cfg, tcfg, _batch_used(teacher_run.run_dir))
    if taken:
        progress(Event("info", message=_inherited_line(taken)))
    train, val, test = _splits(tcfg, device)
    student = build_student(teacher, cfg.student_steps).to(device)
    # what an epoch visits is the teacher's (its epoch mode), so a student's updates count like its teacher's;
    # the bridge, the one part that trains, trains at lr (a bridge_lr of the teacher's no longer applies)
    run_cfg = dataclasses.replace(
        tcfg,
        out=out,
        model=student.cfg,
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        bridge_lr=None,
        seed=cfg.seed,
        recipe=None,
        weight_decay=cfg.weight_decay,
        warmup_ratio=cfg.warmup_ratio,
    )
    folder.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    with folder.writer_lock("dab distill" + (" --resume" if resume else "")):
        return _distill(cfg, folder, teacher_run, run_cfg, student, (train, val, test), resume, device, progress)


def _batch_used(run_dir: Path) -> Optional[int]:
    """The batch a run's training really ran where `dab train` lowered the one its config.json asks for (to fit a
    small training split; precision.json records it); None where it ran as asked, or the record is not readable
    (the config's batch is then inherited, and refused by the epoch's length if it does not fit)."""
    try:
        used = json.loads((Path(run_dir) / RunFolder.PRECISION).read_text())["batch_size"]["used"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return used if isinstance(used, int) and not isinstance(used, bool) and used >= 2 else None


def _inherited_line(taken: Mapping[str, Any]) -> str:
    return "inherited from the teacher: " + ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in taken.items()
    )


def _distill(
    cfg: DistillConfig,
    folder: RunFolder,
    teacher_run,
    run_cfg,
    student,
    splits,
    resume: bool,
    device: torch.device,
    progress: ProgressCallback,
) -> DistillResult:
    """The distillation proper, with the folder's writer lock held."""
    teacher, tcfg = teacher_run.model, teacher_run.config
    train, val, test = splits
    out = folder.path
    _open_folder(folder, cfg, run_cfg, teacher_run, resume)
    optim, sched, updates = _optimiser(student, cfg, run_cfg, train, tcfg.epoch)
    torch.manual_seed(cfg.seed)
    settings = LoopSettings(
        task="distill",
        epochs=cfg.epochs,
        updates_per_epoch=updates,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        epoch_mode=tcfg.epoch,  # what an epoch visits is the teacher's
        config=to_dict(run_cfg),
        select_metric="R@1",
    )
    task = DistillTask(student, teacher, train, val, cfg, tcfg, device)
    loop = Loop(task, optim, sched, settings, train.caption_video.numpy(), folder, LocalContext(device), progress)
    loop.restore(folder.load_checkpoint(RunFolder.LAST) if resume else None)  # onto the CPU, as the RNG needs
    loop.fit()
    return _finish(student, test, run_cfg, out, loop.at.best_value, loop.at.best_epoch, loop.val_metrics, device)


class DistillTask:
    """The student's bridge against the frozen teacher, as a task of the shared training loop."""

    def __init__(self, student, teacher, train: SplitArrays, val, cfg: DistillConfig, tcfg, device: torch.device):
        self.student, self.teacher, self.train, self.val = student, teacher, train, val
        self.cfg, self.tcfg, self.device = cfg, tcfg, device
        self.temperature = teacher.temperature().detach()  # the loss's temperature

    def modules(self) -> dict[str, Optional[torch.nn.Module]]:
        return {"model": self.student, "heads": None}

    def begin_epoch(self, epoch: int) -> None:
        # eval mode for both: the student's copied pooling must see what the teacher's does (no dropout);
        # gradients still reach the bridge, the only part that trains
        self.student.eval()
        self.teacher.eval()

    def loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        train, device = self.train, self.device
        v = train.caption_video[batch]
        text, frames, mask = train.text[batch].to(device), train.frames[v].to(device), train.mask[v].to(device)
        with torch.no_grad():
            t_cost, t_state = pair_outputs(self.teacher, text, frames, mask)
        s_cost, s_state = pair_outputs(self.student, text, frames, mask)
        cfg = self.cfg
        return distill_loss(s_cost, s_state, t_cost, t_state, self.temperature, cfg.state_weight, cfg.rank_weight)

    def after_update(self) -> None:
        pass

    def validate(self) -> Optional[dict]:
        return _metrics(self.student, self.val, self.tcfg, self.device) if self.val is not None else None

    def record(self, epoch: int, means: dict[str, float], update: int, lr: float, seconds: float) -> dict[str, Any]:
        return {"epoch": epoch + 1, "loss": means, "epoch_seconds": seconds}


def _optimiser(student, cfg: DistillConfig, run_cfg, train: SplitArrays, epoch_mode: str) -> tuple[Any, Any, int]:
    """AdamW over the student's trainable weights, its warm-up schedule, and the optimiser updates an epoch."""
    wd, warmup = run_cfg.weight_decay, run_cfg.warmup_ratio
    optim = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=wd)
    per_epoch = epoch_length(train.caption_video.numpy(), epoch_mode)
    updates = per_epoch // cfg.batch_size
    if updates < 1:
        raise ConfigError(
            f"batch_size {cfg.batch_size} is larger than an epoch of the teacher's training split "
            f"({per_epoch}); pass a smaller one (--set batch_size=N)"
        )
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda(updates * cfg.epochs, warmup))
    return optim, sched, updates


def _load_teacher(cfg: DistillConfig, device: torch.device):
    """The teacher run, which must have a bridge to distill."""
    teacher_run = load_run(cfg.teacher, device)
    if teacher_run.model.bridge is None:
        raise ConfigError(
            f"{cfg.teacher} is a {teacher_run.model.cfg.variant!r} run: it has no bridge to distill "
            "(dab distill takes dab or bridge runs)"
        )
    if not teacher_run.model.cfg.runs_drift:
        raise ConfigError(f"{cfg.teacher} has a constant drift (model.drift=constant): it runs no steps to distill")
    return teacher_run


def _splits(tcfg, device: torch.device):
    """The teacher's train, val (None without one) and test splits, in RAM."""
    with open_store(tcfg.features) as st:
        st.require_complete("dab distill")
        train = SplitArrays(st.load_split(tcfg.train_split), device, False)
        val = SplitArrays(st.load_split(tcfg.val_split), device, False) if tcfg.val_split in st.splits() else None
        test = SplitArrays(st.load_split(tcfg.test_split), device, False)
    return train, val, test


def _open_folder(folder: RunFolder, cfg: DistillConfig, run_cfg, teacher_run, resume: bool) -> None:
    """The run folder as `dab train` lays it out, plus distill.json (the teacher and its checkpoint's sha256)."""
    folder.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        _check_resume(folder, cfg, teacher_run)
    else:
        folder.save_config(run_cfg)
        folder.write_json(
            "distill.json",
            {
                "teacher": str(cfg.teacher),
                "teacher_checkpoint_sha256": sha256_file(teacher_run.checkpoint),
                "teacher_steps": teacher_run.model.cfg.steps,
                "distill": to_dict(cfg),
            },
        )
    folder.write_status(state="running", features=str(run_cfg.features))


def _check_resume(folder: RunFolder, cfg: DistillConfig, teacher_run) -> None:
    """ConfigError unless --resume asks for the distillation the folder holds, from the same teacher weights."""
    saved = saved_distill(folder.path)
    # a folder written before the student inherited its training values holds Nones: the teacher's, as now
    before, _ = inherit_from_teacher(
        from_dict(DistillConfig, saved["distill"]), teacher_run.config, _batch_used(teacher_run.run_dir)
    )
    # the folders are relocatable: where the teacher and the student live now is not compared
    diff = differences(to_dict(before), to_dict(cfg), ignore=("teacher", "out"))
    if diff:
        raise ConfigError(
            f"--resume continues {folder.path} with its saved configuration; these options differ "
            f"from it: {', '.join(diff)}. Drop them, or start a new run with another --out"
        )
    if saved["teacher_checkpoint_sha256"] != sha256_file(teacher_run.checkpoint):
        raise ConfigError(
            f"--resume continues {folder.path} from a teacher whose checkpoint has changed since "
            f"(sha256 differs from distill.json); start a new run with another --out"
        )


def _metrics(model, feats, tcfg, device: torch.device) -> dict:
    res = score_all(
        model,
        feats.text,
        feats.frames,
        feats.mask,
        device=device,
        text_chunk=tcfg.text_chunk,
        video_chunk=tcfg.video_chunk,
    )
    return t2v_metrics(res.cost, feats.caption_video.numpy())


def _finish(student, test, run_cfg, out: Path, best, best_epoch, val_metrics, device) -> DistillResult:
    """Score the test split with best.pt, write its cost file and mark the run complete (as `dab train` does)."""
    folder = RunFolder(out)
    student.load_state_dict(folder.load_checkpoint(RunFolder.BEST, map_location=device)["model"])
    student.eval()
    res = score_all(student, test.text, test.frames, test.mask, device=device, gt=test.caption_video)
    path = folder.costs_path(run_cfg.test_split, "h5")
    write_costs(path, run_costs(res, test, run_cfg, best_epoch))
    gt = test.caption_video.numpy()
    test_metrics = t2v_metrics(res.cost, gt)
    folder.write_status(
        state="complete",
        epochs=run_cfg.epochs,
        best_epoch=best_epoch,
        best_value=best,
        select_metric="R@1",
        val=val_metrics,
        test_t2v=test_metrics,
        costs=str(path),
    )
    return DistillResult(
        run_dir=out, best_epoch=best_epoch, val_metrics=val_metrics, test_metrics=test_metrics, costs_path=path
    )
