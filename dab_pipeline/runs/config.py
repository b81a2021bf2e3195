"""TrainConfig: what a run folder's config.json holds, so that loading a run (``runs.load``) reads it in the
library; `dab train` builds and resolves one (``stages.train``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..core.choices import (
    AMP_MODES,
    COST_FORMATS,
    DEFAULT_SCORE_DTYPE,
    EPOCH_MODES,
    LOGIT_SCALE_GROUPS,
    SCORE_DTYPES,
    SELECT_METRICS,
)
from ..core.errors import ConfigError
from ..model import ModelConfig
from ..store.layout import ALL_SPLITS

__all__ = ["TrainConfig"]


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
    score_dtype: str = DEFAULT_SCORE_DTYPE
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
        for name in ("train_split", "val_split", "test_split"):
            if getattr(self, name) == ALL_SPLITS:  # search's every-video split: training on it trains on test
                raise ConfigError(f"{name} must name one split of the store, not {ALL_SPLITS!r} (that is for search)")
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
            raise ConfigError(
                f"logit_scale_group must be one of {', '.join(LOGIT_SCALE_GROUPS)}, got {self.logit_scale_group!r}"
            )
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
            (
                "trainable_blocks",
                self.trainable_blocks is None or self.trainable_blocks >= 0,
                "an integer >= 0 (0: the final LayerNorms and projections only), or none (CLIP frozen)",
            ),
            ("text_chunk", self.text_chunk >= 1, "an integer >= 1"),
            ("video_chunk", self.video_chunk >= 1, "an integer >= 1"),
            ("checkpoint_every", self.checkpoint_every >= 0, "an integer >= 0 (0: at the end of each epoch only)"),
            (
                "max_steps_per_epoch",
                self.max_steps_per_epoch is None or self.max_steps_per_epoch >= 1,
                "an integer >= 1, or none (whole epochs)",
            ),
        ]
        for name, ok, valid in checks:
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid; valid: {valid}")
