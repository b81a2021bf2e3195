"""build_distill_config: a DistillConfig from typed values (the sibling of ``build_train_config``), and the
distill.json a resume reads it from."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ...core.errors import ConfigError
from ...core.overrides import apply_overrides, from_dict, replace_values
from .config import DistillConfig


def build_distill_config(
    teacher: Path,
    out: Path,
    *,
    options: Optional[Mapping[str, Any]] = None,
    overrides: Sequence[str] = (),
    resume: bool = False,
) -> DistillConfig:
    """The DistillConfig of one `dab distill` call (the sibling of ``build_train_config``): ``options`` by name,
    None meaning "not given", then ``--set`` strings.

    ``resume``: the configuration saved in ``out``'s distill.json with only the given values applied, so what
    was not given is never a change; the stage refuses a given value that differs from the saved one.
    """
    given = {k: v for k, v in (options or {}).items() if v is not None}
    if resume:
        saved = dataclasses.replace(
            from_dict(DistillConfig, saved_distill(Path(out))["distill"]), teacher=Path(teacher), out=Path(out)
        )  # folders are relocatable
        return apply_overrides(replace_values(saved, given, "option"), overrides)
    return apply_overrides(DistillConfig(teacher=Path(teacher), out=Path(out), **given), overrides)


def saved_distill(out: Path) -> dict:
    """``out``'s distill.json (ConfigError when the folder holds no distillation)."""
    path = out / "distill.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--resume: {out} holds no distillation to continue (no distill.json)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--resume: {path} is not valid JSON: {exc}") from None
