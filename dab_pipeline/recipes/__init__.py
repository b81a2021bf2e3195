"""Training recipes as data: one JSON file per recipe, like open_clip's model configs.

A recipe is a set of TrainConfig values (``key: value``, dotted for the model, the same keys
as ``dab train --set``), optionally refined per dataset (``by_dataset``: keys ``"msvd"`` or
``"msrvtt:train_split=7k"``, matched against the store's manifest). ``dab train --recipe
NAME`` applies it first; explicit options and ``--set`` then override any of its values, and
config.json records the recipe's name beside the resolved values.

A recipe taken from a peer's code also says what it cannot set, keyed by dataset like ``by_dataset``: ``store``
(the extraction the peer's values go with, e.g. ``{"frames": 64}``: `dab extract --frames 64`) and ``peer`` (values
dab does not apply, e.g. the peer's ``max_words``; dab truncates at the text tower's context). ``_sources`` names
the file and line (or paper section) of every value: ``"lr"`` for ``set``, ``"lsmdc: lr"`` for the other maps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..core.errors import ConfigError, UnknownNameError

__all__ = ["Recipe", "RECIPE_DIR", "recipe_names", "load_recipe"]

RECIPE_DIR = Path(__file__).parent


@dataclass(frozen=True)
class Recipe:
    name: str
    doc: str
    source: str
    values: dict[str, Any]
    by_dataset: dict[str, dict[str, Any]] = field(default_factory=dict)
    store: dict[str, dict[str, Any]] = field(default_factory=dict)  # by dataset: the extraction it goes with
    peer: dict[str, dict[str, Any]] = field(default_factory=dict)  # by dataset: the peer's values dab cannot set
    sources: dict[str, str] = field(default_factory=dict)  # "key" / "dataset: key" -> where the value comes from

    def resolved(self, manifest: Optional[dict] = None) -> dict[str, Any]:
        """The recipe's values for a store with this manifest (its ``by_dataset`` entries that match applied)."""
        out = dict(self.values)
        for key, extra in self.by_dataset.items():
            if manifest is not None and _matches(key, manifest):
                out.update(extra)
        return out

    def store_values(self, manifest: dict) -> dict[str, Any]:
        """What the recipe expects of a store with this manifest (``{"frames": 64}``; {} when it says nothing)."""
        out: dict[str, Any] = {}
        for key, extra in self.store.items():
            if _matches(key, manifest):
                out.update(extra)
        return out

    def overrides(self, manifest: Optional[dict] = None) -> list[str]:
        """``["key=value", ...]`` for :func:`dab_pipeline.core.overrides.apply_overrides`."""
        return [f"{k}={v}" for k, v in self.resolved(manifest).items()]


def _matches(key: str, manifest: dict) -> bool:
    dataset, _, cond = key.partition(":")
    if manifest.get("dataset") != dataset:
        return False
    if not cond:
        return True
    opt, _, want = cond.partition("=")
    return str(manifest.get("dataset_options", {}).get(opt)) == want


def recipe_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in RECIPE_DIR.glob("*.json")))


def load_recipe(name: str) -> Recipe:
    """The shipped recipe ``name``; an unknown name lists the valid ones."""
    path = RECIPE_DIR / f"{name}.json"
    if not name or "/" in name or not path.is_file():
        raise UnknownNameError(f"unknown recipe {name!r}; valid: {', '.join(recipe_names())}")
    try:
        data = json.loads(path.read_text())
        return Recipe(
            name=name,
            doc=data.get("_doc", ""),
            source=data.get("_source", ""),
            values=dict(data["set"]),
            by_dataset=dict(data.get("by_dataset", {})),
            store=dict(data.get("store", {})),
            peer=dict(data.get("peer", {})),
            sources=dict(data.get("_sources", {})),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"recipe file {path} is malformed: {exc}") from None
