"""The training recipe the world's benchmark and demo use (``recipe.json``), as ``--set`` overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def world_recipe() -> dict[str, Any]:
    """TrainConfig overrides (``key: value``) of the world recipe; ``_doc`` says why each differs from the paper."""
    data = json.loads((Path(__file__).parent / "recipe.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def recipe_overrides(recipe: dict[str, Any]) -> list[str]:
    """``["key=value", ...]`` for :func:`dab_pipeline.config.apply_overrides` or ``dab train --set``."""
    return [f"{k}={v}" for k, v in recipe.items()]
