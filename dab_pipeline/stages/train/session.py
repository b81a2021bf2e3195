"""One training run's folder, data and checkpoint I/O (what every step of training shares)."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Optional

from ...core.errors import ConfigError, RunLockedError, StoreError, TrainingError
from ...core.events import Event, ProgressCallback
from ...core.location import location
from ...core.overrides import to_dict
from ...runs.config import TrainConfig
from ...runs.inputs import SplitArrays
from ...runs.run_folder import RunFolder, check_not_inside_run
from ...runs.schedule import epoch_length
from ...runtime.distributed import mark_shared
from ...store import open_store


@dataclass
class RunData:
    """The splits of one run, on its device, and the store's manifest."""

    train: SplitArrays
    val: Optional[SplitArrays]
    test: Optional[SplitArrays]
    manifest: dict


def _compared(cfg: TrainConfig) -> dict:
    """What --resume compares of a config: neither the folder's place nor the spelling of the store's path."""
    return to_dict(cfg) | {"out": None, "features": str(location(cfg.features).resolve())}


class TrainRun:
    """One run's folder, context and reporting: what every step of training shares."""

    def __init__(self, cfg: TrainConfig, ctx, progress: ProgressCallback, resume: bool) -> None:
        self.cfg, self.ctx, self.progress, self.resume = cfg, ctx, progress, resume
        self.folder = RunFolder(cfg.out)
        self.dir = self.folder.path
        self.locks = contextlib.ExitStack()  # the folder's writer lock, held until the run returns

    def shared(self, exc: Exception) -> Exception:
        """An error every rank raises at the same point: rank 0 alone reports it."""
        return mark_shared(exc)

    def check_folder(self) -> None:
        """Refuse a folder that holds another run or lies inside one; clear one that stopped before its first
        checkpoint."""
        cfg, run_dir, folder = self.cfg, self.dir, self.folder
        if self.resume:
            if not folder.is_run():
                raise TrainingError(f"--resume: {run_dir} is not a run folder (no config.json)")
            saved = folder.load_config(TrainConfig)  # its store where it is found from here
            # where the folder was made does not matter: a copied or moved run resumes in place, and its
            # store is the same whatever path names it
            mine, theirs = _compared(cfg), _compared(saved)
            if mine != theirs:
                diff = sorted(k for k, v in mine.items() if theirs.get(k) != v)
                raise TrainingError(
                    f"--resume: {run_dir} was started with another configuration ({', '.join(diff)} differ)"
                )
            return
        check_not_inside_run(run_dir)  # before anything of the new run is written
        if folder.is_run():
            status = folder.read_status()
            state = status.get("state", "unknown")
            holder = folder.lock_holder() if state == "running" else None
            if holder is not None:
                raise RunLockedError(
                    f"{run_dir} is being trained by another process ({holder}); wait for it to "
                    "finish, or choose another --out"
                )
            # "running" with nobody holding it: killed, or stopped where not even its status could be written
            # (a full disk)
            stopped = state in ("failed", "interrupted") or state == "running"
            if stopped and not folder.checkpoint(RunFolder.LAST).exists():
                # Nothing to resume: the run stopped before its first checkpoint, so start over.
                self.progress(
                    Event(
                        "info",
                        message=f"{run_dir}: the earlier run stopped ({state}) before its first "
                        f"checkpoint ({status.get('error', 'no reason recorded')}); "
                        "starting over",
                    )
                )
                folder.clear_start()
                return
            hint = "use --resume to continue it" if state != "complete" else "it is complete"
            raise TrainingError(f"{run_dir} already holds a run (state {state!r}); {hint}, or choose another --out")

    def load_data(self) -> RunData:
        """The train / val / test splits in RAM, checked against the batch size."""
        cfg, device = self.cfg, self.ctx.device
        with_states = cfg.trainable_blocks is not None
        store = open_store(cfg.features)
        try:
            store.require_complete("dab train")
            with_views = cfg.views and store.train_views > 0
            train = SplitArrays(
                store.load_split(cfg.train_split, with_states=with_states, with_views=with_views), device, with_states
            )
            val = None
            # no validation split at all (e.g. MSR-VTT with --option val_size=0): select the last epoch
            if cfg.val_split in store.splits():
                val_split = store.load_split(cfg.val_split, with_states=with_states)
                if len(val_split.caption_ids) > 0 and len(val_split.video_ids) > 0:
                    val = SplitArrays(val_split, device, with_states)
            test_split = store.load_split(cfg.test_split, with_states=with_states)
            test = SplitArrays(test_split, device, with_states) if len(test_split.caption_ids) > 0 else None
            manifest = store.manifest
        finally:
            store.close()
        self._check_sizes(train, val)
        return RunData(train, val, test, manifest)

    def _check_sizes(self, train: SplitArrays, val: Optional[SplitArrays]) -> None:
        cfg, world = self.cfg, self.ctx.world_size
        if train.num_queries < 2:
            raise self.shared(
                StoreError(
                    f"{cfg.features}: the {cfg.train_split!r} split has {train.num_queries} usable captions; need >= 2"
                )
            )
        if val is None and cfg.select_metric != "last":
            self.progress(
                Event(
                    "warning",
                    message=f"no {cfg.val_split!r} split in the store: best.pt is the last "
                    "epoch (--set select_metric=last says so on purpose)",
                )
            )
        per_epoch = epoch_length(train.caption_video.numpy(), cfg.epoch)
        if per_epoch // cfg.batch_size == 0:
            self._lower_batch(per_epoch)
        if self.cfg.batch_size % world:
            raise self.shared(
                ConfigError(
                    f"batch_size {self.cfg.batch_size} is the global batch and must split evenly over the {world} processes "
                    f"(e.g. {max(world, self.cfg.batch_size // world * world)})"
                )
            )

    def _lower_batch(self, per_epoch: int) -> None:
        """A batch larger than an epoch (a small folder of one's own) is lowered to the epoch, split evenly over the
        processes, with one warning line; precision.json records the batch that ran (run.py)."""
        cfg, world = self.cfg, self.ctx.world_size
        what = "training captions" if cfg.epoch == "captions" else "training videos (epoch=videos)"
        lowered = per_epoch // world * world
        if lowered < 2:
            raise self.shared(
                ConfigError(
                    f"{cfg.features}: the {per_epoch} {what} make no batch of 2 or more over {world} process(es); "
                    "extract more videos or train with fewer processes"
                )
            )
        self.progress(
            Event(
                "warning",
                message=f"batch_size {cfg.batch_size} exceeds the {per_epoch} {what} of {cfg.features}: "
                f"lowered to {lowered} (recorded in precision.json; --batch-size sets it)",
            )
        )
        self.cfg = dataclasses.replace(cfg, batch_size=lowered)

    def open_folder(self, asked: TrainConfig, precision: dict, manifest: dict, folder: dict) -> None:
        """Rank 0 takes the folder's writer lock, writes its config, precision and store manifest, and marks the
        run running. A folder another live process writes is refused before anything in it changes."""
        if not self.ctx.is_main:
            return
        run = self.folder
        run.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.locks.enter_context(run.writer_lock("dab train" + (" --resume" if self.resume else "")))
        if self.resume and run.state == "complete":  # finished by another process since this one looked
            raise TrainingError(
                f"{run.path} was completed by another process while this one started: nothing to resume"
            )
        folder["ready"] = True
        run.write_json(RunFolder.PRECISION, precision)
        if not self.resume:
            run.save_config(asked)
            run.write_json(RunFolder.STORE_MANIFEST, manifest)
        run.write_status(state="running", features=str(self.cfg.features))

    def load(self, name: str):
        """Checkpoint ``name`` of this run (or None): read by rank 0 and sent to the others, who need no access
        to the folder. Read onto the CPU: the state is sent as is, and load_state_dict moves it."""
        return self.ctx.run_on_main(lambda: self.folder.load_checkpoint(name))
