from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import pytest

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.core.overrides import apply_overrides, from_dict, load_config, save_config, to_dict


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


# Numeric fields for which 0 or -1 is a meaningful value (every other 0 / -1 must be refused when built)
MEANINGFUL = {
    ("TrainConfig", "weight_decay", 0),
    ("TrainConfig", "seed", 0),
    ("TrainConfig", "checkpoint_every", 0),
    ("TrainConfig", "warmup_ratio", 0),
    ("TrainConfig", "trainable_blocks", 0),
    ("ModelConfig", "dropout", 0),
    ("ModelConfig", "drift_init", 0),
    ("ModelConfig", "logvar_init", 0),
    ("ModelConfig", "logvar_init", -1),
    ("ModelConfig", "logvar_max", 0),
    ("ModelConfig", "logvar_max", -1),
}


def _numeric_fields(cls) -> list[str]:
    import typing

    hints = typing.get_type_hints(cls)
    numeric = (int, float, Optional[int], Optional[float])
    return [f.name for f in dataclasses.fields(cls) if hints[f.name] in numeric]


@pytest.mark.parametrize("section", ["TrainConfig", "ModelConfig"])
def test_every_numeric_field_is_checked_when_the_config_is_built(section: str) -> None:
    """A walk over every numeric field with 0 and -1: refused with the field's name and its range, unless the
    value means something (MEANINGFUL); never accepted to fail an epoch later."""
    from dab_pipeline.model import ModelConfig
    from dab_pipeline.runs.config import TrainConfig

    base = TrainConfig(features=Path("s.h5"), out=Path("r"))
    fields = _numeric_fields(TrainConfig if section == "TrainConfig" else ModelConfig)
    assert len(fields) >= 10
    for name in fields:
        for value in (0, -1):
            key = name if section == "TrainConfig" else f"model.{name}"
            if (section, name, value) in MEANINGFUL:
                apply_overrides(base, [f"{key}={value}"])
                continue
            with pytest.raises(ConfigError, match=name) as err:
                apply_overrides(base, [f"{key}={value}"])
            assert "valid" in str(err.value) or "must" in str(err.value), str(err.value)
