"""The training loop every trainer of dab shares: epochs of optimiser updates, validation and model selection,
checkpoints that resume exactly, and the progress events. What is trained and on which loss is a :class:`Task`;
`dab train` and `dab distill` are two tasks over this one loop."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

import numpy as np
import torch

from ..core.errors import TrainingError
from ..core.events import Event, ProgressCallback
from ..runs.checkpoint import rng_state, set_rng_state
from ..runs.run_folder import RunFolder
from ..runs.schedule import epoch_order

LOWER_IS_BETTER = ("MnR", "MdR")  # the validation metrics where smaller wins


class Task(Protocol):
    """What one kind of training brings to the loop: its modules, its loss and its validation."""

    def modules(self) -> dict[str, Optional[torch.nn.Module]]:
        """The checkpoint's keys and the modules saved under them (None: nothing under that key)."""
        ...

    def begin_epoch(self, epoch: int) -> None:
        """Before the first update of ``epoch``: train / eval modes, what the epoch draws besides its order."""
        ...

    def loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one batch of training captions (B,), and its parts to log (empty: the loss alone)."""
        ...

    def after_update(self) -> None:
        """After each optimiser update (a clamp of a parameter, say)."""
        ...

    def validate(self) -> Optional[dict]:
        """The validation split's t2v metrics, or None without one."""
        ...

    def record(self, epoch: int, means: dict[str, float], update: int, lr: float, seconds: float) -> dict[str, Any]:
        """One epoch's line of metrics.jsonl, before its validation metrics are added."""
        ...


@dataclass(frozen=True)
class LoopSettings:
    """How the loop runs; each task's stage fills it from its own config."""

    task: str  # the progress events' task: "train", "distill"
    epochs: int
    updates_per_epoch: int
    batch_size: int
    seed: int  # with the epoch, what each epoch's order is drawn from
    epoch_mode: str  # what an epoch visits: "captions" or "videos" (runs.schedule.epoch_order)
    config: Mapping[str, Any] = field(default_factory=dict)  # saved in every checkpoint
    select_metric: str = "R@1"  # best.pt's validation metric; "last": the last epoch
    grad_clip: Optional[float] = None  # the gradients' total norm, clipped before each update
    checkpoint_every: int = 0  # last.pt every this many updates within an epoch (0: at epoch ends only)


@dataclass
class Position:
    """Where the run stands: what a checkpoint saves besides the weights."""

    epoch: int = 0  # epochs done
    update_in_epoch: int = 0  # updates done in the epoch under way
    best_value: Optional[float] = None
    best_epoch: Optional[int] = None
    sums: dict[str, float] = field(default_factory=dict)  # the epoch under way's loss sums, over `count` updates
    count: int = 0


class Loop:
    """Epochs of updates of ``task`` with ``optim`` and ``sched``; rank 0 of ``ctx`` writes ``folder``."""

    def __init__(
        self,
        task: Task,
        optim: torch.optim.Optimizer,
        sched: torch.optim.lr_scheduler.LRScheduler,
        settings: LoopSettings,
        train_captions: np.ndarray,
        folder: RunFolder,
        ctx,
        progress: ProgressCallback,
        shared: Callable[[Exception], Exception] = lambda exc: exc,
    ) -> None:
        self.task, self.optim, self.sched, self.settings = task, optim, sched, settings
        self.train_captions = train_captions  # (Q,) each training caption's video
        self.folder, self.ctx, self.progress, self.shared = folder, ctx, progress, shared
        self.at = Position()
        self.updates = 0  # optimiser updates done over the run
        self.val_metrics: Optional[dict] = None

    @property
    def total_updates(self) -> int:
        return self.settings.updates_per_epoch * self.settings.epochs

    # ---- restore and save

    def restore(self, ck: Optional[Mapping[str, Any]]) -> None:
        """Continue from checkpoint ``ck`` (None: a fresh start): weights, optimiser, schedule, position and
        this rank's random streams."""
        if ck is not None:
            saved_world = int(ck.get("world_size") or 1)
            if saved_world != self.ctx.world_size:
                raise self.shared(
                    TrainingError(
                        f"--resume: {self.folder.path} was trained with {saved_world} process(es), this run has "
                        f"{self.ctx.world_size}; resume it with {saved_world} (the per-process random streams are "
                        "saved for that many)"
                    )
                )
            self._load(ck)
            self.progress(
                Event(
                    "info",
                    message=f"resuming {self.folder.path} at epoch {self.at.epoch + 1}, "
                    f"update {self.at.update_in_epoch}",
                )
            )
        self.updates = self.at.epoch * self.settings.updates_per_epoch + self.at.update_in_epoch

    def _load(self, ck: Mapping[str, Any]) -> None:
        for key, module in self.task.modules().items():
            if module is not None:
                module.load_state_dict(ck[key])
        self.optim.load_state_dict(ck["optim"])
        if "sched" in ck:  # distilled students of before the schedule kept a constant lr
            self.sched.load_state_dict(ck["sched"])
        # checkpoints of older distillations were saved at epoch ends only, by one process
        loss_sum, count = ck.get("epoch_loss", (0.0, 0))
        self.at = Position(
            epoch=ck["epoch"],
            update_in_epoch=ck.get("step_in_epoch", 0),
            best_value=ck.get("best_value"),
            best_epoch=ck.get("best_epoch"),
            sums=dict(ck.get("epoch_sums") or {"loss": float(loss_sum)}),
            count=int(count),
        )
        # every rank's own streams (older one-process checkpoints kept only "rng")
        set_rng_state(ck["rng_ranks"][self.ctx.rank] if "rng_ranks" in ck else ck["rng"], self.ctx.device)

    def checkpoint(self, name: str, at: Position) -> None:
        """checkpoints/<name> at ``at``: every rank's random streams (for an exact resume), saved by rank 0 with
        the training state."""
        rngs = self.ctx.all_gather_object(rng_state(self.ctx.device))
        if not self.ctx.is_main:
            return
        state: dict[str, Any] = {
            key: (m.state_dict() if m is not None else None) for key, m in self.task.modules().items()
        }
        state |= {
            "optim": self.optim.state_dict(),
            "sched": self.sched.state_dict(),
            "epoch": at.epoch,
            "step_in_epoch": at.update_in_epoch,
            "best_value": at.best_value,
            "best_epoch": at.best_epoch,
            "rng": rngs[0],
            "config": dict(self.settings.config),
            "epoch_loss": (at.sums.get("loss", 0.0), at.count),
            "epoch_sums": dict(at.sums),
            "world_size": self.ctx.world_size,
            "rng_ranks": rngs,
        }
        self.folder.save_checkpoint(name, state)

    # ---- the epochs

    def fit(self) -> None:
        """Every remaining epoch: its updates, then validation, selection and the epoch's checkpoints."""
        s = self.settings
        self.progress(Event("start", task=s.task, total=self.total_updates - self.updates))
        for epoch in range(self.at.epoch, s.epochs):
            t0 = time.time()
            sums, count = self.run_epoch(epoch)
            self.end_epoch(epoch, sums, count, time.time() - t0)
        self.progress(Event("end", task=s.task, message=f"best epoch {self.at.best_epoch}"))

    def run_epoch(self, epoch: int) -> tuple[dict[str, float], int]:
        """One epoch's updates (from where a resumed run stopped); its loss sums and how many updates."""
        s = self.settings
        # The order of an epoch depends only on (seed, epoch): a resumed run replays it exactly, and every
        # rank of a distributed run draws the same order.
        order = epoch_order(self.train_captions, s.epoch_mode, s.seed, epoch)  # (Q,) or (V,) caption indices
        self.task.begin_epoch(epoch)
        resumed = epoch == self.at.epoch and self.at.update_in_epoch > 0
        first = self.at.update_in_epoch if resumed else 0
        sums, count = (dict(self.at.sums), self.at.count) if resumed else ({}, 0)
        for u in range(first, s.updates_per_epoch):
            batch = order[u * s.batch_size : (u + 1) * s.batch_size]  # (B,)
            loss, parts = self.update(batch, epoch, u)
            for key, value in {"loss": float(loss.item()), **parts}.items():
                sums[key] = sums.get(key, 0.0) + value
            count += 1
            self.progress(
                Event(
                    "advance",
                    task=s.task,
                    n=1,
                    data={"unit": "it"},
                    message=f"epoch {epoch + 1}/{s.epochs} loss {sums['loss'] / count:.4f}",
                )
            )
            if s.checkpoint_every and self.updates % s.checkpoint_every == 0 and u + 1 < s.updates_per_epoch:
                at = Position(epoch, u + 1, self.at.best_value, self.at.best_epoch, dict(sums), count)
                self.checkpoint(RunFolder.LAST, at)
        return sums, count

    def update(self, batch: torch.Tensor, epoch: int, u: int) -> tuple[torch.Tensor, dict[str, float]]:
        """One optimiser update on ``batch``; a non-finite loss stops the run (every rank alike)."""
        loss, parts = self.task.loss(batch)
        if not torch.isfinite(loss):
            # Every rank holds the same (gathered) loss, so all stop here together.
            if self.ctx.is_main:
                self.folder.write_status(state="failed", error=f"non-finite loss at epoch {epoch + 1} update {u + 1}")
            raise self.shared(
                TrainingError(
                    f"loss became {loss.item()} at epoch {epoch + 1}, update {u + 1} (update {self.updates + 1} of "
                    f"the run); the last good checkpoint is {self.folder.checkpoint(RunFolder.LAST)}. Try a lower "
                    "--set lr=..."
                )
            )
        self.optim.zero_grad(set_to_none=True)
        loss.backward()  # distributed: DDP has averaged the gradients across ranks when this returns
        if self.settings.grad_clip:
            params = [p for g in self.optim.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.settings.grad_clip)
        self.optim.step()
        self.task.after_update()
        self.sched.step()
        self.updates += 1
        return loss, parts

    def end_epoch(self, epoch: int, sums: dict[str, float], count: int, seconds: float) -> None:
        """Validate, select (never on test), log the epoch and write last.pt / best.pt."""
        means = {k: v / max(1, count) for k, v in sums.items()}
        record = self.task.record(epoch, means, self.updates, self.sched.get_last_lr()[0], round(seconds, 3))
        self.val_metrics = self.task.validate()
        if self.val_metrics is not None:
            record["val"] = self.val_metrics
        improved = self._select(epoch)
        if self.ctx.is_main:
            self.folder.append_metrics(record)
        self.at = Position(epoch + 1, 0, self.at.best_value, self.at.best_epoch)
        self.checkpoint(RunFolder.LAST, self.at)
        if improved:
            self.checkpoint(RunFolder.BEST, self.at)
        msg = f"epoch {epoch + 1}: loss {means.get('loss', 0.0):.4f}"
        if self.val_metrics is not None:
            m = self.val_metrics
            msg += f"  val R@1 {m['R@1']:.1f} R@5 {m['R@5']:.1f} MnR {m['MnR']:.1f}"
        self.progress(Event("metrics", message=msg, data=record))

    def _select(self, epoch: int) -> bool:
        """Whether ``epoch`` is the best so far (strictly better on validation; always, with no validation or
        select_metric "last"); updates the best."""
        metric = self.settings.select_metric
        if self.val_metrics is None or metric == "last":
            self.at.best_epoch = epoch + 1
            return True
        value = float(self.val_metrics[metric])
        best = self.at.best_value
        improved = best is None or (value < best if metric in LOWER_IS_BETTER else value > best)
        if improved:
            self.at.best_value, self.at.best_epoch = value, epoch + 1
        return improved
