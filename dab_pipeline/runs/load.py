"""Loading a trained run: its config.json and a checkpoint into an eval-mode model (and a fine-tuned run's CLIP
heads). It lives beside the run format so that every stage that reads a run (evaluate, search, serve, index,
distill) imports it from the library, never from another stage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..core.errors import ConfigError, TrainingError
from ..model import DABModel
from ..runtime.devices import resolve_device
from ..store import open_store
from .config import TrainConfig
from .inputs import TrainHeads
from .run_folder import RunFolder

__all__ = ["LoadedRun", "load_run"]


@dataclass
class LoadedRun:
    """A run folder's configuration and its model with the checkpoint's weights (eval mode)."""

    run_dir: Path
    config: TrainConfig
    model: DABModel
    checkpoint: Path
    heads: Optional[torch.nn.Module] = None  # the fine-tuned CLIP blocks (load_run(..., heads=True))


def load_run(
    run_dir: str | Path, device: str | torch.device = "cpu", checkpoint: str = "best.pt", heads: bool = False
) -> LoadedRun:
    """Read ``run_dir/config.json`` and ``run_dir/checkpoints/<checkpoint>`` into an eval-mode model.

    ``heads``: also load a fine-tuned run's CLIP blocks (its store's CLIP weights must be
    available); without it a fine-tuned run is refused.
    Raises :class:`ConfigError` for a folder that is not a run or a fine-tuned run,
    :class:`TrainingError` when the checkpoint is missing or does not fit the config.
    """
    device = resolve_device(device)  # "bogus" or a missing GPU: one line before anything is read
    folder = RunFolder(run_dir)
    run = folder.path
    cfg = folder.load_config(TrainConfig)
    ck_path = folder.checkpoint(checkpoint)
    ck = folder.load_checkpoint(checkpoint)
    if ck is None:
        raise TrainingError(
            f"{ck_path} does not exist: the run has no {checkpoint} checkpoint yet (did it finish an epoch?)"
        )
    tuned = cfg.trainable_blocks is not None or ck.get("heads") is not None
    if tuned and not heads:
        raise ConfigError(
            f"{run} fine-tunes the last {cfg.trainable_blocks} CLIP blocks; dab search supports runs on frozen "
            "CLIP features only (the query would need the run's fine-tuned text head and the frames its vision head)"
        )
    model = DABModel(cfg.model)
    try:
        model.load_state_dict(ck["model"])
    except (KeyError, RuntimeError) as exc:
        raise TrainingError(f"{ck_path} does not fit the run's model config: {str(exc).splitlines()[0]}") from None
    model.eval()
    model.to(device)
    loaded = LoadedRun(run_dir=run, config=cfg, model=model, checkpoint=ck_path)
    if tuned:
        with open_store(cfg.features) as st:
            manifest = st.manifest
        loaded.heads = TrainHeads(manifest, cfg.trainable_blocks, torch.device(device))
        loaded.heads.load_state_dict(ck["heads"])
        loaded.heads.to(device).eval()
    return loaded
