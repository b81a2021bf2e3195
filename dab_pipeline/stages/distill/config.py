"""DistillConfig, the training values a student inherits from its teacher, and DistillResult."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ...core.errors import ConfigError
from ...runs.config import TrainConfig


@dataclass(frozen=True)
class DistillConfig:
    teacher: Path  # a run folder of a dab or bridge run (its best.pt is the teacher)
    out: Path
    student_steps: int = 1
    epochs: int = 5
    # None: the teacher's (INHERITED; see the module docstring). A warm-up is followed by a cosine decay to
    # zero, as `dab train` schedules its lr
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    weight_decay: Optional[float] = None
    warmup_ratio: Optional[float] = None
    state_weight: float = 1.0
    rank_weight: float = 1.0
    seed: Optional[int] = None
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.student_steps < 1:
            raise ConfigError(f"student_steps must be >= 1, got {self.student_steps}")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size is not None and self.batch_size < 2:
            raise ConfigError(f"batch_size must be >= 2 or None (the teacher's), got {self.batch_size}")
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"lr must be > 0 or None (the teacher's), got {self.lr}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be an integer >= 0 or None (the teacher's), got {self.seed}")
        if self.state_weight < 0 or self.rank_weight < 0 or self.state_weight + self.rank_weight == 0:
            raise ConfigError("state_weight and rank_weight must be >= 0, not both 0")
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0 or None (the teacher's), got {self.weight_decay}")
        if self.warmup_ratio is not None and not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"warmup_ratio must be in [0, 1) or None (the teacher's), got {self.warmup_ratio}")


# The DistillConfig fields whose None means "the teacher's", in the order the stage reports them.
INHERITED = ("batch_size", "lr", "weight_decay", "warmup_ratio", "seed")


def inherit_from_teacher(
    cfg: DistillConfig, tcfg: TrainConfig, batch_used: Optional[int] = None
) -> tuple[DistillConfig, dict[str, Any]]:
    """``cfg`` with each None of :data:`INHERITED` set to the teacher's value (``tcfg``: the teacher's
    config.json), and ``{field: value}`` of what was taken. ``batch_used``: the batch the teacher's training really
    ran (its precision.json), where `dab train` lowered the one config.json asks for to a small training split."""
    teacher = {
        "batch_size": batch_used if batch_used is not None else tcfg.batch_size,
        "lr": tcfg.bridge_lr if tcfg.bridge_lr is not None else tcfg.lr,
        "weight_decay": tcfg.weight_decay,
        "warmup_ratio": tcfg.warmup_ratio,
        "seed": tcfg.seed,
    }
    taken = {k: teacher[k] for k in INHERITED if getattr(cfg, k) is None}
    return dataclasses.replace(cfg, **taken), taken


@dataclass
class DistillResult:
    run_dir: Path
    best_epoch: Optional[int]
    val_metrics: Optional[dict]
    test_metrics: Optional[dict]
    costs_path: Optional[Path]
