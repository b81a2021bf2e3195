"""TrainConfig's dataset-dependent resolution, the optimiser groups, the seed and the result of a run.

TrainConfig lives in :mod:`dab_pipeline.runs.config` (config.json is part of the run format, read by
:func:`dab_pipeline.runs.load.load_run`); it is imported here for the code and the users that name it
``stages.train.config.TrainConfig``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ...core.errors import ConfigError
from ...runs.config import TrainConfig


@dataclass
class TrainResult:
    run_dir: Path
    epochs_done: int
    best_epoch: Optional[int]
    best_value: Optional[float]
    val_metrics: Optional[dict]
    test_metrics: Optional[dict]
    costs_path: Optional[Path]


def resolve_train_config(cfg: TrainConfig, manifest: dict, explicit: set[str] = frozenset()) -> TrainConfig:
    """Fill dataset-dependent defaults once, at the edge, from the store manifest.

    ``explicit`` names the ``model.*`` keys the user set; only unset ones change.
    """
    model = cfg.model
    dim = manifest.get("clip", {}).get("embed_dim") or manifest.get("embed_dim")
    if dim is not None and model.embed_dim != int(dim):
        if "model.embed_dim" in explicit:
            raise ConfigError(f"model.embed_dim={model.embed_dim} but the store's features have D={dim}")
        model = dataclasses.replace(model, embed_dim=int(dim))
    # X-Pool starts its logit scale from CLIP's own (100 for OpenAI's weights); a store
    # records the scale of the CLIP that made it (dab-world: 16.9).
    clip_scale = manifest.get("clip", {}).get("logit_scale")
    if clip_scale and "model.logit_scale_init" not in explicit and not model.gaussian:
        model = dataclasses.replace(model, logit_scale_init=float(clip_scale))
    # Paper §4.1: dropout 0.3 for MSR-VTT/VATEX, 0.4 for MSVD.
    if manifest.get("dataset") == "msvd" and "model.dropout" not in explicit:
        model = dataclasses.replace(model, dropout=0.4)
    if cfg.trainable_blocks is not None:
        k_store = manifest.get("trainable_blocks")
        if k_store is None:
            raise ConfigError(
                f"--trainable-blocks {cfg.trainable_blocks} needs a store extracted with --trainable-blocks; "
                f"{cfg.features} holds projected features only (to train with CLIP frozen, also over a recipe "
                "that fine-tunes it: --trainable-blocks none)"
            )
        if int(k_store) != cfg.trainable_blocks:
            raise ConfigError(
                f"--trainable-blocks {cfg.trainable_blocks} does not match the store's {k_store} "
                "(the store keeps the states entering exactly its last K blocks)"
            )
    return dataclasses.replace(cfg, model=model)


LOG_MAX_LOGIT_SCALE = math.log(100.0)


def optimizer_groups(model: torch.nn.Module, heads: Optional[torch.nn.Module], cfg: TrainConfig) -> list[dict]:
    """AdamW parameter groups: the new modules at ``lr`` (the bridge at ``bridge_lr`` when set); CLIP's
    fine-tuned blocks at ``clip_lr``; with ``logit_scale_group="clip"`` the cosine variants' logit scale
    alone at ``clip_lr`` without weight decay (named ``logit_scale``: the caller clamps it after each step).
    Frozen parameters (``model.variance="fixed"``) are in no group."""
    scale = getattr(model, "log_logit_scale", None) if cfg.logit_scale_group == "clip" else None
    bridge = getattr(model, "bridge", None)
    own = {id(p) for p in bridge.parameters()} if bridge is not None and cfg.bridge_lr is not None else set()
    new = [p for p in model.parameters() if p.requires_grad and p is not scale and id(p) not in own]
    groups = [{"params": new, "lr": cfg.lr, "name": "new"}]
    if own:
        groups.append(
            {"params": [p for p in bridge.parameters() if p.requires_grad], "lr": cfg.bridge_lr, "name": "bridge"}
        )
    if heads is not None:
        groups.append({"params": list(heads.parameters()), "lr": cfg.clip_lr, "name": "clip"})
    if scale is not None:
        groups.append({"params": [scale], "lr": cfg.clip_lr, "weight_decay": 0.0, "name": "logit_scale"})
    return groups


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
