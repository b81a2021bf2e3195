"""Building an ExtractConfig from typed values: what `dab extract` (and a Python caller) asks for, resolved once.

The sibling of :func:`~dab_pipeline.stages.train.build_train_config`: the CLI parses its
options and hands them here; the defaults that depend on other values (the pretrained tag
of a model, what ``trainable_blocks="all"`` means) are decided here, not in the CLI. A
resumed store is checked against this config by the stage itself
(:func:`~dab_pipeline.stages.extract.check_resumable`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ...clip_models import full_depth
from ...clip_models.bundle import OUR_MODELS
from ...core.errors import ConfigError
from ...core.location import location
from ...core.overrides import apply_overrides
from .config import ExtractConfig

__all__ = ["build_extract_config", "default_pretrained"]


def default_pretrained(model: str, pretrained: Optional[str]) -> Optional[str]:
    """The weights tag a model gets: dab's own models carry their weights, an open_clip architecture
    takes OpenAI's unless another tag (or a file) is given; ``"none"`` asks for random weights."""
    if pretrained is None:
        return None if model in OUR_MODELS else "openai"
    return None if pretrained.strip().lower() in ("none", "") else pretrained


def _blocks(raw: Any, model: str) -> Optional[int]:
    if raw is None or isinstance(raw, int):
        return raw
    if str(raw).strip().lower() == "all":
        return full_depth(model)
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"trainable_blocks: expected a number of blocks or 'all', got {raw!r}") from None


def build_extract_config(
    dataset: str, out: Path, *, options: Optional[Mapping[str, Any]] = None, overrides: Sequence[str] = ()
) -> ExtractConfig:
    """The ExtractConfig of one `dab extract` call.

    ``options``: ExtractConfig values by name, None meaning "not given" (``{"model": "ViT-B-32",
    "pretrained": None, "trainable_blocks": "all", "frames": 12}``); ``overrides``: ``--set key=value``
    strings, applied last.
    """
    given = {k: v for k, v in (options or {}).items() if v is not None}
    model = given.get("model", ExtractConfig.__dataclass_fields__["model"].default)
    given["pretrained"] = default_pretrained(model, given.get("pretrained"))
    if "trainable_blocks" in given:
        given["trainable_blocks"] = _blocks(given["trainable_blocks"], model)
    try:
        cfg = ExtractConfig(dataset=dataset, out=location(out), **given)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return apply_overrides(cfg, overrides)
