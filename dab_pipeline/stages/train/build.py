"""Building a TrainConfig from typed values: what `dab train` (and a Python caller) asks for, resolved once.

The CLI only parses its options and hands them here as values; a recipe applies a dict, not
``key=value`` strings; ``--set`` strings are the one thing parsed. Resuming reads the run's saved
config.json and refuses any value that would change it (the same check as `dab distill` and
`dab extract` use: :func:`~dab_pipeline.core.overrides.differences`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ...clip_models import full_depth
from ...core.errors import ConfigError
from ...core.location import location
from ...core.overrides import apply_overrides, differences, replace_values
from ...core.variants import VARIANT_KEY, canonical_key, canonical_values, expand_overrides, expand_variant
from ...recipes import load_recipe
from ...runs import RunFolder
from ...store import open_store
from .config import TrainConfig, resolve_train_config

__all__ = ["build_train_config", "store_depth"]


def build_train_config(
    features: Optional[Path] = None,
    out: Optional[Path] = None,
    *,
    recipe: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None,
    overrides: Sequence[str] = (),
    resume: bool = False,
) -> TrainConfig:
    """The TrainConfig of one `dab train` call.

    ``options``: TrainConfig values by (dotted) key, None meaning "not given"
    (``{"model.variant": "dab", "epochs": 5, "trainable_blocks": "all"}``); ``overrides``:
    ``--set key=value`` strings. Precedence: the recipe, then ``options``, then ``overrides``.
    ``trainable_blocks="all"`` is the store's CLIP depth. Without ``out``:
    ``runs/<store>-<variant>``. ``resume``: the saved configuration of ``out``, with
    ``out`` where it now is; a recipe or a value that differs from the saved ones is refused.
    ``variant``, ``cost`` and ``steps`` are the keys ``model.variant``, ``model.cost`` and ``model.steps``
    (`dab train`'s option names); a control's name as the variant (``dab-const``) stands for its variant and
    model values (:func:`~dab_pipeline.core.variants.expand_variant`): the config holds those, never the name.
    """
    given = canonical_values({k: v for k, v in (options or {}).items() if v is not None})
    if resume:
        return _resumed(out, recipe, given, overrides)
    chosen = load_recipe(recipe) if recipe else None  # an unknown name fails first, listing the valid ones
    if features is None:
        raise ConfigError("--features STORE is required")
    with open_store(features) as st:
        manifest = st.manifest
    # one dict, later sources winning: the recipe, the options, then --set (its strings parsed as --set parses)
    values: dict[str, Any] = canonical_values(chosen.resolved(manifest)) if chosen is not None else {}
    values.update(given)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        values[canonical_key(key)] = raw.strip()
    named = values.get(VARIANT_KEY)  # a control's name stays the default folder's name
    values = expand_variant(values)
    if str(values.get("trainable_blocks", "")).strip().lower() == "all":
        values["trainable_blocks"] = store_depth(manifest)
    cfg = TrainConfig(
        features=location(features),
        out=Path(out) if out else Path("runs"),
        recipe=chosen.name if chosen is not None else None,
    )
    cfg = replace_values(cfg, values)
    explicit = set(values)
    if out is None:
        shown = str(named).strip() if named is not None else cfg.model.variant
        cfg = dataclasses.replace(cfg, out=Path("runs") / f"{location(features).name.split('.')[0]}-{shown}")
    return resolve_train_config(cfg, manifest, explicit)


def _resumed(
    out: Optional[Path], recipe: Optional[str], given: Mapping[str, Any], overrides: Sequence[str]
) -> TrainConfig:
    if out is None:
        raise ConfigError("--resume needs --out RUN_FOLDER")
    folder = RunFolder(out)
    # a run folder is relocatable: a copied or moved run resumes where --out points, never where it was made
    saved = dataclasses.replace(folder.load_config(TrainConfig), out=Path(out))
    if recipe and recipe != saved.recipe:
        raise ConfigError(
            f"--resume continues {out} with its saved configuration (recipe {saved.recipe!r}); "
            f"drop --recipe {recipe}, or start a new run with another --out"
        )
    asked = apply_overrides(replace_values(saved, expand_variant(given), "option"), expand_overrides(overrides))
    diff = differences(saved, asked)
    if diff:
        raise ConfigError(
            f"--resume continues {out} with its saved configuration; these options differ from it: "
            f"{', '.join(diff)}. Drop them, or start a new run with another --out"
        )
    return saved


def store_depth(manifest: dict) -> int:
    """What ``trainable_blocks=all`` means for a store: its CLIP's depth (both towers alike)."""
    clip = manifest.get("clip", {})
    vision, text = clip.get("num_vision_layers"), clip.get("num_text_layers")
    if isinstance(vision, int) and vision == text:
        return vision
    return full_depth(str(manifest.get("model")))
