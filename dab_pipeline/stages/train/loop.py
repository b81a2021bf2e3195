"""The trainer: restore, fit (epochs of steps), validate, test, finish; one code path for one process and many.
:func:`~.run.run_train` drives it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ...core.errors import TrainingError
from ...core.events import Event
from ...core.overrides import to_dict
from ...metrics import t2v_metrics
from ...model import DABModel
from ...model.losses import loss_of
from ...runs.checkpoint import rng_state, set_rng_state
from ...runs.costfile import CostMatrix, write_costs
from ...runs.inputs import TrainHeads
from ...runs.run_folder import RunFolder
from ...runs.schedule import epoch_length, epoch_order, epoch_views, lr_lambda
from .config import LOG_MAX_LOGIT_SCALE, TrainResult, optimizer_groups, seed_everything
from .inputs import batch_inputs
from .scoring import score_split
from .session import RunData, TrainRun
from .step import TrainStep, distributed_batch_loss


class Trainer:
    """The model, its optimiser and the position in the run; each step of training a method."""

    def __init__(self, run: TrainRun, data: RunData) -> None:
        self.run, self.data, self.cfg = run, data, run.cfg
        cfg, ctx = self.cfg, run.ctx
        seed_everything(cfg.seed)
        self.model = DABModel(cfg.model).to(ctx.device)
        self.heads = None
        if cfg.trainable_blocks is not None:
            # Rank 0 first: it fills the CLIP weights cache that the others then read.
            self.heads = ctx.main_first(lambda: TrainHeads(data.manifest, cfg.trainable_blocks, ctx.device)).to(
                ctx.device
            )
        groups = optimizer_groups(self.model, self.heads, cfg)
        self.clamp_scale = next((g["params"][0] for g in groups if g["name"] == "logit_scale"), None)
        self.optim = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        self.steps_per_epoch = epoch_length(data.train.caption_video.numpy(), cfg.epoch) // cfg.batch_size
        if cfg.max_steps_per_epoch:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg.max_steps_per_epoch)
        self.total = self.steps_per_epoch * cfg.epochs
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.optim, lr_lambda(self.total, cfg.warmup_ratio))
        self.start_epoch, self.start_step, self.best_value, self.best_epoch = 0, 0, None, None
        self.test_scoring: Optional[dict] = None  # seconds and pairs/s of the test pass (test())
        self.resumed_loss: tuple[float, int] = (0.0, 0)  # running loss sum and count of a partly done epoch
        self.val_metrics: Optional[dict] = None
        self.step_module = None
        self.global_step = 0

    def restore(self) -> None:
        """Continue from last.pt (--resume), or seed this rank's own dropout stream; wrap for DDP."""
        run, ctx, cfg = self.run, self.run.ctx, self.cfg
        ck = run.load(RunFolder.LAST) if run.resume else None
        if ck is not None:
            saved_world = int(ck.get("world_size") or 1)
            if saved_world != ctx.world_size:
                raise run.shared(
                    TrainingError(
                        f"--resume: {run.dir} was trained with {saved_world} process(es), this run has "
                        f"{ctx.world_size}; resume it with {saved_world} (the per-process random streams are saved for "
                        "that many)"
                    )
                )
            self._load_state(ck)
            # every rank's own streams (older one-process checkpoints kept only "rng")
            set_rng_state(ck["rng_ranks"][ctx.rank] if "rng_ranks" in ck else ck["rng"], ctx.device)
            run.progress(
                Event("info", message=f"resuming {run.dir} at epoch {self.start_epoch + 1}, step {self.start_step}")
            )
        elif ctx.rank > 0:
            # Own dropout noise per rank (identical streams would correlate the masks of the
            # ranks' pairs); rank 0 keeps the single-process stream.
            torch.manual_seed(cfg.seed + 1_000_003 * ctx.rank)
        self.global_step = self.start_epoch * self.steps_per_epoch + self.start_step
        self.step_module = ctx.wrap(TrainStep(self.model, self.heads, ctx))  # DDP on several ranks
        if ctx.world_size > 1:
            run.progress(
                Event(
                    "info",
                    message=f"distributed training: {ctx.world_size} processes, "
                    f"{cfg.batch_size // ctx.world_size} of each global batch of "
                    f"{cfg.batch_size} per process",
                )
            )

    def _load_state(self, ck: dict) -> None:
        self.model.load_state_dict(ck["model"])
        if self.heads is not None:
            self.heads.load_state_dict(ck["heads"])
        self.optim.load_state_dict(ck["optim"])
        self.sched.load_state_dict(ck["sched"])
        self.start_epoch, self.start_step = ck["epoch"], ck["step_in_epoch"]
        self.best_value, self.best_epoch = ck.get("best_value"), ck.get("best_epoch")
        self.resumed_loss = tuple(ck.get("epoch_loss", (0.0, 0)))

    def checkpoint(self, epoch: int, step_in_epoch: int, name: str, epoch_loss: tuple[float, int] = (0.0, 0)) -> None:
        """checkpoints/<name>: every rank's random streams (for an exact resume), saved by rank 0 with the
        training state."""
        run, ctx = self.run, self.run.ctx
        rngs = ctx.all_gather_object(rng_state(ctx.device))
        if not ctx.is_main:
            return
        state = {
            "model": self.model.state_dict(),
            "heads": self.heads.state_dict() if self.heads is not None else None,
            "optim": self.optim.state_dict(),
            "sched": self.sched.state_dict(),
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "best_value": self.best_value,
            "best_epoch": self.best_epoch,
            "rng": rngs[0],
            "config": to_dict(self.cfg),
            "epoch_loss": epoch_loss,
            "world_size": ctx.world_size,
        }
        state["rng_ranks"] = rngs
        run.folder.save_checkpoint(name, state)

    def fit(self) -> None:
        """Every remaining epoch: train, validate, checkpoint."""
        self.run.progress(Event("start", task="train", total=self.total - self.global_step))
        for epoch in range(self.start_epoch, self.cfg.epochs):
            t0 = time.time()
            loss = self.train_epoch(epoch)
            self.end_epoch(epoch, loss, time.time() - t0)
        self.run.progress(Event("end", task="train", message=f"best epoch {self.best_epoch}"))

    def train_epoch(self, epoch: int) -> tuple[float, int]:
        """One epoch's steps (from where a resumed run stopped); returns (loss sum, steps)."""
        cfg, train = self.cfg, self.data.train
        # The order of an epoch depends only on (seed, epoch): resuming mid-run replays it
        # exactly, and every rank of a distributed run draws the same order.
        order = epoch_order(train.caption_video.numpy(), cfg.epoch, cfg.seed, epoch)
        views = epoch_views(train.num_videos, train.num_views, cfg.seed, epoch) if train.num_views else None
        first = self.start_step if epoch == self.start_epoch else 0
        self.model.train()
        if self.heads is not None:
            self.heads.train()
        loss_sum, n = self.resumed_loss if (epoch == self.start_epoch and first > 0) else (0.0, 0)
        for step in range(first, self.steps_per_epoch):
            q = order[step * cfg.batch_size : (step + 1) * cfg.batch_size]  # (B,) caption indices
            loss = self.step(q, views, epoch, step)
            loss_sum += float(loss.item())
            n += 1
            self.run.progress(
                Event(
                    "advance",
                    task="train",
                    n=1,
                    data={"unit": "it"},
                    message=f"epoch {epoch + 1}/{cfg.epochs} loss {loss_sum / n:.4f}",
                )
            )
            if (
                cfg.checkpoint_every
                and self.global_step % cfg.checkpoint_every == 0
                and step + 1 < self.steps_per_epoch
            ):
                self.checkpoint(epoch, step + 1, RunFolder.LAST, (loss_sum, n))
        return loss_sum, n

    def batch_loss(self, q: torch.Tensor, views: Optional[torch.Tensor]) -> torch.Tensor:
        """The loss of the global batch ``q``: this rank's slice against every video of it."""
        ctx, train, device = self.run.ctx, self.data.train, self.run.ctx.device
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=self.cfg.amp == "bf16"):
            local_b = self.cfg.batch_size // ctx.world_size
            q_local = q[ctx.rank * local_b : (ctx.rank + 1) * local_b]  # (b,) this rank's slice (one rank: all)
            text_in, lengths, video_in, mask = batch_inputs(train, q_local, self.heads, device, views)
            return distributed_batch_loss(
                self.step_module, self.model, text_in, lengths, video_in, mask, loss_of(self.model.cfg.spec), ctx
            )

    def step(self, q: torch.Tensor, views: Optional[torch.Tensor], epoch: int, step: int) -> torch.Tensor:
        """One optimiser step on batch ``q``; a non-finite loss stops the run (every rank alike)."""
        run, cfg = self.run, self.cfg
        loss = self.batch_loss(q, views)
        if not torch.isfinite(loss):
            # Every rank holds the same (gathered) loss, so all stop here together.
            if run.ctx.is_main:
                run.folder.write_status(state="failed", error=f"non-finite loss at epoch {epoch + 1} step {step + 1}")
            raise run.shared(
                TrainingError(
                    f"loss became {loss.item()} at epoch {epoch + 1}, step {step + 1} (global step "
                    f"{self.global_step + 1}); the last good checkpoint is {run.folder.checkpoint('last.pt')}. "
                    "Try a lower --set lr=..."
                )
            )
        self.optim.zero_grad(set_to_none=True)
        loss.backward()  # distributed: DDP has averaged the gradients across ranks when this returns
        if cfg.grad_clip:
            params = [p for g in self.optim.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        self.optim.step()
        if self.clamp_scale is not None:
            with torch.no_grad():
                self.clamp_scale.clamp_(max=LOG_MAX_LOGIT_SCALE)  # CLIP's and X-Pool's cap of 100
        self.sched.step()
        self.global_step += 1
        return loss

    def end_epoch(self, epoch: int, loss: tuple[float, int], seconds: float) -> None:
        """Validate, select (never on test), log the epoch and write last.pt / best.pt."""
        run, cfg, val = self.run, self.cfg, self.data.val
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "step": self.global_step,
            "train_loss": loss[0] / max(1, loss[1]),
            "lr": self.sched.get_last_lr()[0],
            "epoch_seconds": round(seconds, 3),
        }
        improved = True
        if val is not None:
            res = score_split(self.model, self.heads, val, cfg, run.ctx.device, dist=run.ctx)
            self.val_metrics = t2v_metrics(res.cost, val.caption_video.numpy())
            record["val"] = self.val_metrics
        if val is not None and cfg.select_metric != "last":
            value = float(self.val_metrics[cfg.select_metric])
            higher_better = cfg.select_metric not in ("MnR", "MdR")
            improved = self.best_value is None or (
                value > self.best_value if higher_better else value < self.best_value
            )
            if improved:
                self.best_value, self.best_epoch = value, epoch + 1
        else:
            self.best_epoch = epoch + 1
        if run.ctx.is_main:
            run.folder.append_metrics(record)
        self.checkpoint(epoch + 1, 0, RunFolder.LAST)
        if improved:
            self.checkpoint(epoch + 1, 0, RunFolder.BEST)
        msg = f"epoch {epoch + 1}: loss {record['train_loss']:.4f}"
        if self.val_metrics is not None:
            m = self.val_metrics
            msg += f"  val R@1 {m['R@1']:.1f} R@5 {m['R@5']:.1f} MnR {m['MnR']:.1f}"
        run.progress(Event("metrics", message=msg, data=record))

    def test(self) -> tuple[Optional[dict], Optional[Path]]:
        """Score the test split with best.pt and write the cost file; (t2v metrics, its path) or Nones."""
        run, cfg, test = self.run, self.cfg, self.data.test
        if test is None:
            return None, None
        best = run.load(RunFolder.BEST)
        self.model.load_state_dict(best["model"])
        if self.heads is not None:
            self.heads.load_state_dict(best["heads"])
        t0 = time.perf_counter()
        res = score_split(
            self.model,
            self.heads,
            test,
            cfg,
            run.ctx.device,
            progress=run.progress,
            with_diagnostics=True,
            dist=run.ctx,
        )
        seconds = time.perf_counter() - t0
        pairs = int(test.num_queries) * int(test.num_videos)
        # what a sweep's table reports as scoring speed (the test pass, its diagnostics included)
        self.test_scoring = {"seconds": round(seconds, 3), "pairs": pairs, "pairs_per_s": round(pairs / seconds, 1)}
        gt = test.caption_video.numpy()
        extras = {
            k: np.asarray(getattr(res, k))
            for k in ("text_var", "bridged_var", "video_var")
            if getattr(res, k, None) is not None
        }
        fmt = cfg.cost_format
        if fmt == "auto":
            fmt = "zarr" if str(cfg.features).rstrip("/").endswith(".zarr") else "h5"
        costs_path = run.folder.costs_path(cfg.test_split, fmt)
        if run.ctx.is_main:
            write_costs(
                costs_path,
                CostMatrix(
                    cost=np.asarray(res.cost, dtype=np.float32),
                    query_ids=np.asarray(test.caption_ids),
                    video_ids=np.asarray(test.video_ids),
                    gt=gt.astype(np.int64),
                    kind="cost",
                    extras=extras,
                    attrs={
                        "config": json.dumps(to_dict(cfg)),
                        "split": cfg.test_split,
                        "best_epoch": self.best_epoch,
                        "variant": cfg.model.variant,
                        "store": str(cfg.features),
                    },
                ),
            )
        return t2v_metrics(res.cost, gt), costs_path

    def finish(self, test_metrics: Optional[dict], costs_path: Optional[Path]) -> TrainResult:
        """Mark the run complete; nobody leaves before rank 0 has written everything."""
        run, cfg = self.run, self.cfg
        if run.ctx.is_main:
            run.folder.write_status(
                state="complete",
                epochs=cfg.epochs,
                best_epoch=self.best_epoch,
                best_value=self.best_value,
                select_metric=cfg.select_metric,
                val=self.val_metrics,
                test_t2v=test_metrics,
                costs=str(costs_path) if costs_path else None,
                test_scoring=self.test_scoring,
            )
        run.ctx.barrier()
        return TrainResult(
            run_dir=run.dir,
            epochs_done=cfg.epochs,
            best_epoch=self.best_epoch,
            best_value=self.best_value,
            val_metrics=self.val_metrics,
            test_metrics=test_metrics,
            costs_path=costs_path,
        )
