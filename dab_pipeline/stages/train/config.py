"""TrainConfig, its dataset-dependent resolution, the optimiser groups and the schedules of a run."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
import numpy as np
import torch
from ...choices import AMP_MODES, COST_FORMATS, EPOCH_MODES, LOGIT_SCALE_GROUPS, SCORE_DTYPES, SELECT_METRICS
from ...errors import ConfigError
from ...model import ModelConfig



@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides what `dab train` does (paper §4.1 defaults)."""

    features: Path
    out: Path
    model: ModelConfig = field(default_factory=ModelConfig)
    epochs: int = 10
    batch_size: int = 32
    lr: float = 1e-4  # new modules (pooling, probabilistic heads, bridge)
    bridge_lr: Optional[float] = None  # the bridge alone at another lr (its training study, docs/model.md); None: lr
    clip_lr: float = 1e-6  # fine-tuned CLIP blocks, final LayerNorms and projections
    weight_decay: float = 0.02
    warmup_ratio: float = 0.1
    grad_clip: Optional[float] = 1.0
    seed: int = 24
    trainable_blocks: Optional[int] = None  # None: CLIP frozen; K: fine-tune the store's last K blocks
    train_split: str = "train"
    val_split: str = "val"
    test_split: str = "test"
    select_metric: str = "R@1"  # text-to-video metric on the validation split that picks best.pt, or "last"
    text_chunk: int = 128
    video_chunk: int = 512
    device: str = "auto"
    amp: str = "auto"  # auto: bf16 autocast on CUDA, none on CPU; or "bf16" | "none"
    checkpoint_every: int = 0  # steps; 0: at the end of each epoch only
    max_steps_per_epoch: Optional[int] = None  # cut epochs short (smoke runs)
    # "captions": an epoch visits every training caption once (X-Pool, CLIP4Clip);
    # "videos": one caption per training video, drawn anew each epoch (datasets with many
    # captions per video, where a caption epoch would repeat each video many times)
    epoch: str = "captions"
    cost_format: str = "auto"  # auto: same backend as the store (h5 / zarr)
    # precision of the bridge's products when scoring val / test (docs/performance.md):
    # "bfloat16" is several times faster on AMX / AVX512-BF16 CPUs and tensor-core GPUs and
    # runs as float32 (with a warning) elsewhere; "auto" picks it where it is native. float32
    # by default, so a run's metrics do not depend on the machine.
    score_dtype: str = "float32"
    # the cosine variants' logit scale: "new" (trained with the new modules, at lr, with weight
    # decay) or "clip" (X-Pool: CLIP's own parameter, at clip_lr, no weight decay, clamped at 100)
    logit_scale_group: str = "new"
    recipe: Optional[str] = None  # the shipped recipe these values started from (dab train --recipe)
    # a store made with --train-views N: each epoch trains every video on one of its N augmented
    # views, drawn from (seed, epoch); false: on the eval view, as without views. Val and test
    # always use the eval view.
    views: bool = True

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 2:
            raise ConfigError(f"batch_size must be >= 2 (contrastive loss), got {self.batch_size}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        self._check_ranges()
        if self.select_metric not in SELECT_METRICS:
            raise ConfigError(f"select_metric must be one of {', '.join(SELECT_METRICS)}, got {self.select_metric!r}")
        if self.amp not in AMP_MODES:
            raise ConfigError(f"amp must be one of {', '.join(AMP_MODES)}, got {self.amp!r}")
        if self.cost_format not in COST_FORMATS:
            raise ConfigError(f"cost_format must be one of {', '.join(COST_FORMATS)}, got {self.cost_format!r}")
        if self.epoch not in EPOCH_MODES:
            raise ConfigError(f"epoch must be one of {', '.join(EPOCH_MODES)}, got {self.epoch!r}")
        if self.logit_scale_group not in LOGIT_SCALE_GROUPS:
            raise ConfigError(f"logit_scale_group must be one of {', '.join(LOGIT_SCALE_GROUPS)}, "
                              f"got {self.logit_scale_group!r}")
        if self.bridge_lr is not None and not self.bridge_lr > 0:
            raise ConfigError(f"bridge_lr must be a positive float or None (the new modules' lr), got {self.bridge_lr}")
        if self.score_dtype not in SCORE_DTYPES:
            raise ConfigError(f"score_dtype must be one of {', '.join(SCORE_DTYPES)}, got {self.score_dtype!r}")


    def _check_ranges(self) -> None:
        """Every numeric field in its range when the config is built, never a traceback an epoch later."""
        checks = [  # (field, ok, the range in words)
            ("lr", self.lr > 0, "a float > 0"),
            ("clip_lr", self.clip_lr > 0, "a float > 0"),
            ("weight_decay", self.weight_decay >= 0, "a float >= 0"),
            ("grad_clip", self.grad_clip is None or self.grad_clip > 0, "a float > 0, or none (no clipping)"),
            ("seed", 0 <= self.seed < 2**63, "an integer >= 0"),
            ("trainable_blocks", self.trainable_blocks is None or self.trainable_blocks >= 0,
             "an integer >= 0 (0: the final LayerNorms and projections only), or none (CLIP frozen)"),
            ("text_chunk", self.text_chunk >= 1, "an integer >= 1"),
            ("video_chunk", self.video_chunk >= 1, "an integer >= 1"),
            ("checkpoint_every", self.checkpoint_every >= 0, "an integer >= 0 (0: at the end of each epoch only)"),
            ("max_steps_per_epoch", self.max_steps_per_epoch is None or self.max_steps_per_epoch >= 1,
             "an integer >= 1, or none (whole epochs)"),
        ]
        for name, ok, valid in checks:
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid; valid: {valid}")


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
    if clip_scale and "model.logit_scale_init" not in explicit and not model.probabilistic:
        model = dataclasses.replace(model, logit_scale_init=float(clip_scale))
    # Paper §4.1: dropout 0.3 for MSR-VTT/VATEX, 0.4 for MSVD.
    if manifest.get("dataset") == "msvd" and "model.dropout" not in explicit:
        model = dataclasses.replace(model, dropout=0.4)
    if cfg.trainable_blocks is not None:
        k_store = manifest.get("trainable_blocks")
        if k_store is None:
            raise ConfigError(
                f"--trainable-blocks {cfg.trainable_blocks} needs a store extracted with --trainable-blocks; "
                f"{cfg.features} holds projected features only"
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
        groups.append({"params": [p for p in bridge.parameters() if p.requires_grad], "lr": cfg.bridge_lr,
                       "name": "bridge"})
    if heads is not None:
        groups.append({"params": list(heads.parameters()), "lr": cfg.clip_lr, "name": "clip"})
    if scale is not None:
        groups.append({"params": [scale], "lr": cfg.clip_lr, "weight_decay": 0.0, "name": "logit_scale"})
    return groups


def _seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def epoch_order(caption_video: np.ndarray, mode: str, seed: int, epoch: int) -> torch.Tensor:
    """The training captions of one epoch, in order; a pure function of (seed, epoch).

    "captions": a permutation of every caption. "videos": one caption per video,
    uniformly at random, the videos in random order (the first caption of each
    video in a random permutation of all captions gives both at once).
    """
    gen = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(len(caption_video), generator=gen)  # (Q,)
    if mode == "captions":
        return perm
    _, first = np.unique(np.asarray(caption_video)[perm.numpy()], return_index=True)
    return perm[np.sort(first)]  # (V,)


def epoch_length(caption_video: np.ndarray, mode: str) -> int:
    return len(caption_video) if mode == "captions" else len(np.unique(np.asarray(caption_video)))


def lr_lambda(total_steps: int, warmup_ratio: float):
    """Linear warm-up over ``warmup_ratio`` of the steps, then cosine decay to zero."""
    warmup = int(round(total_steps * warmup_ratio))

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def epoch_views(num_videos: int, num_views: int, seed: int, epoch: int) -> torch.Tensor:
    """The augmented view (0..N-1) each training video uses in ``epoch``; a pure function of (seed, epoch)."""
    gen = torch.Generator().manual_seed(seed * 1000 + epoch + 500_000_000)  # apart from epoch_order's stream
    return torch.randint(0, num_views, (num_videos,), generator=gen)  # (V,)
