"""The training recipe the world's benchmark and demo use: the shipped ``world`` recipe (dab_pipeline/recipes)."""

from __future__ import annotations

from typing import Any

from ..recipes import load_recipe


def world_recipe() -> dict[str, Any]:
    """TrainConfig values (``key: value``) of the world recipe; its ``_doc`` says why each differs from the paper."""
    return load_recipe("world").resolved()
