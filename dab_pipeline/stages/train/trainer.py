"""`dab train` as a task of the shared training loop (:mod:`dab_pipeline.training`), then its test pass and the
finished folder; one code path for one process and many. :func:`~.run.run_train` drives it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import torch

from ...core.events import Event
from ...core.overrides import to_dict
from ...metrics import t2v_metrics
from ...model import DABModel
from ...model.losses import loss_of
from ...runs.costfile import run_costs, write_costs
from ...runs.inputs import TrainHeads
from ...runs.run_folder import RunFolder
from ...runs.schedule import epoch_length, epoch_views, lr_lambda
from ...training import Loop, LoopSettings
from .config import LOG_MAX_LOGIT_SCALE, TrainResult, optimizer_groups, seed_everything
from .inputs import batch_inputs
from .scoring import score_split
from .session import RunData, TrainRun
from .step import TrainStep, distributed_batch_loss


class Trainer:
    """`dab train` as a task of the shared training loop (:class:`dab_pipeline.training.Loop`): the model, the
    heads of a partly fine-tuned CLIP and the contrastive loss; then the test pass and the finished folder."""

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
        optim = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        updates = epoch_length(data.train.caption_video.numpy(), cfg.epoch) // cfg.batch_size
        if cfg.max_steps_per_epoch:
            updates = min(updates, cfg.max_steps_per_epoch)
        sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda(updates * cfg.epochs, cfg.warmup_ratio))
        settings = LoopSettings(
            task="train",
            epochs=cfg.epochs,
            updates_per_epoch=updates,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            epoch_mode=cfg.epoch,
            config=to_dict(cfg),
            select_metric=cfg.select_metric,
            grad_clip=cfg.grad_clip,
            checkpoint_every=cfg.checkpoint_every,
        )
        self.loop = Loop(
            self, optim, sched, settings, data.train.caption_video.numpy(), run.folder, ctx, run.progress, run.shared
        )
        self.test_scoring: Optional[dict] = None  # seconds and pairs/s of the test pass (test())
        self.views: Optional[torch.Tensor] = None  # (V,) each training video's augmented view this epoch
        self.step_module = None

    def restore(self) -> None:
        """Continue from last.pt (--resume), or seed this rank's own dropout stream; wrap for DDP."""
        run, ctx, cfg = self.run, self.run.ctx, self.cfg
        ck = run.load(RunFolder.LAST) if run.resume else None
        self.loop.restore(ck)
        if ck is None and ctx.rank > 0:
            # Own dropout noise per rank (identical streams would correlate the masks of the
            # ranks' pairs); rank 0 keeps the single-process stream.
            torch.manual_seed(cfg.seed + 1_000_003 * ctx.rank)
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

    def fit(self) -> None:
        """Every remaining epoch: train, validate, checkpoint (the shared loop)."""
        self.loop.fit()

    # ---- the task the loop runs

    def modules(self) -> dict[str, Optional[torch.nn.Module]]:
        return {"model": self.model, "heads": self.heads}

    def begin_epoch(self, epoch: int) -> None:
        train = self.data.train
        self.views = epoch_views(train.num_videos, train.num_views, self.cfg.seed, epoch) if train.num_views else None
        self.model.train()
        if self.heads is not None:
            self.heads.train()

    def loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of the global batch: this rank's slice against every video of it."""
        ctx, train, device = self.run.ctx, self.data.train, self.run.ctx.device
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=self.cfg.amp == "bf16"):
            local_b = self.cfg.batch_size // ctx.world_size
            q_local = batch[ctx.rank * local_b : (ctx.rank + 1) * local_b]  # (b,) this rank's slice (one rank: all)
            text_in, lengths, video_in, mask = batch_inputs(train, q_local, self.heads, device, self.views)
            loss = distributed_batch_loss(
                self.step_module, self.model, text_in, lengths, video_in, mask, loss_of(self.model.cfg.spec), ctx
            )
        return loss, {}

    def after_update(self) -> None:
        if self.clamp_scale is not None:
            with torch.no_grad():
                self.clamp_scale.clamp_(max=LOG_MAX_LOGIT_SCALE)  # CLIP's and X-Pool's cap of 100

    def validate(self) -> Optional[dict]:
        val = self.data.val
        if val is None:
            return None
        res = score_split(self.model, self.heads, val, self.cfg, self.run.ctx.device, dist=self.run.ctx)
        return t2v_metrics(res.cost, val.caption_video.numpy())

    def record(self, epoch: int, means: dict[str, float], update: int, lr: float, seconds: float) -> dict[str, Any]:
        return {
            "epoch": epoch + 1,
            "step": update,
            "train_loss": means.get("loss", 0.0),
            "lr": lr,
            "epoch_seconds": seconds,
        }

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
        fmt = cfg.cost_format
        if fmt == "auto":
            fmt = "zarr" if str(cfg.features).rstrip("/").endswith(".zarr") else "h5"
        costs_path = run.folder.costs_path(cfg.test_split, fmt)
        if run.ctx.is_main:
            write_costs(costs_path, run_costs(res, test, cfg, self.loop.at.best_epoch))
        return t2v_metrics(res.cost, test.caption_video.numpy()), costs_path

    def finish(self, test_metrics: Optional[dict], costs_path: Optional[Path]) -> TrainResult:
        """Mark the run complete; nobody leaves before rank 0 has written everything."""
        run, cfg = self.run, self.cfg
        if run.ctx.is_main:
            run.folder.write_status(
                state="complete",
                epochs=cfg.epochs,
                best_epoch=self.loop.at.best_epoch,
                best_value=self.loop.at.best_value,
                select_metric=cfg.select_metric,
                val=self.loop.val_metrics,
                test_t2v=test_metrics,
                costs=str(costs_path) if costs_path else None,
                test_scoring=self.test_scoring,
            )
        run.ctx.barrier()
        return TrainResult(
            run_dir=run.dir,
            epochs_done=cfg.epochs,
            best_epoch=self.loop.at.best_epoch,
            best_value=self.loop.at.best_value,
            val_metrics=self.loop.val_metrics,
            test_metrics=test_metrics,
            costs_path=costs_path,
        )
