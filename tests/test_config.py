from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import pytest

from dab_pipeline.config import apply_overrides, from_dict, load_config, save_config, to_dict
from dab_pipeline.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Inner:
    dropout: float = 0.3
    steps: int = 32
    variant: str = "dab"

    def __post_init__(self) -> None:
        if self.steps <= 0:
            raise ValueError(f"steps must be positive, got {self.steps}")


@dataclasses.dataclass(frozen=True)
class Outer:
    model: Inner = Inner()
    lr: float = 1e-4
    quiet: bool = False
    limit: Optional[int] = None
    out: Path = Path("runs/x")
    frames: tuple[int, ...] = (1, 2)


def test_overrides_nested_and_types() -> None:
    cfg = apply_overrides(Outer(), ["model.dropout=0.4", "lr=3e-5", "quiet=yes", "limit=7", "frames=3,4,5"])
    assert cfg.model.dropout == 0.4 and cfg.model.steps == 32
    assert cfg.lr == 3e-5 and cfg.quiet is True and cfg.limit == 7 and cfg.frames == (3, 4, 5)
    assert apply_overrides(cfg, ["limit=none"]).limit is None


def test_unknown_key_lists_valid_ones() -> None:
    with pytest.raises(ConfigError, match="unknown key 'dropuot'.*dropout"):
        apply_overrides(Outer(), ["model.dropuot=0.1"])


def test_bad_value_and_validation_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="model.steps=abc"):
        apply_overrides(Outer(), ["model.steps=abc"])
    with pytest.raises(ConfigError, match="steps must be positive"):
        apply_overrides(Outer(), ["model.steps=0"])
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(Outer(), ["lr"])


def test_json_round_trip(tmp_path: Path) -> None:
    cfg = apply_overrides(Outer(), ["model.variant=xpool", "frames=9"])
    save_config(cfg, tmp_path / "config.json")
    assert load_config(Outer, tmp_path / "config.json") == cfg
    assert from_dict(Outer, to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match="unknown Outer keys"):
        from_dict(Outer, {**to_dict(cfg), "bogus": 1})
