"""Published zero-shot figures of CLIP on the field's benchmarks, beside a zero-shot run's own.

``published.json`` (next to this file) maps (dataset, model) to the text-to-video R@1/5/10 (and MdR) a paper
reports for CLIP with mean-pooled frame features, with the citation. `dab evaluate --zero-shot` on a store whose
manifest names such a dataset and model puts the figure beside its own in metrics.json, report.md and one console
line, so that a wrong frame sampling or preprocessing shows at once (a zero-shot run of the right weights on the
right videos lands within a point or two; docs/reproducing.md). Unknown pairs give nothing.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from ..core.errors import ConfigError

__all__ = ["PUBLISHED_FILE", "published_entries", "published_zero_shot", "published_line"]

PUBLISHED_FILE = Path(__file__).with_name("published.json")
COMPARED = ("R@1", "R@5", "R@10", "MdR")


@lru_cache(maxsize=1)
def published_entries() -> tuple[dict[str, Any], ...]:
    """The zero-shot entries of ``published.json``."""
    try:
        data = json.loads(PUBLISHED_FILE.read_text())
        return tuple(dict(e) for e in data["zero_shot"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{PUBLISHED_FILE} is unreadable or malformed: {exc}") from None


def _base_model(name: Any) -> str:
    """The architecture without its activation suffix: OpenAI's weights build ``ViT-B-32-quickgelu``."""
    text = str(name or "")
    return text[: -len("-quickgelu")] if text.endswith("-quickgelu") else text


def published_zero_shot(manifest: dict[str, Any], t2v: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The published figure for the store's (dataset, model), beside this run's ``t2v`` metrics, with what differs
    between the two protocols; None when nothing is published for the pair."""
    dataset, model = manifest.get("dataset"), _base_model(manifest.get("model"))
    entry = next((e for e in published_entries() if e["dataset"] == dataset and e["model"] == model), None)
    if entry is None:
        return None
    own = {k: t2v.get(k) for k in COMPARED}
    notes = [f"this store samples {manifest.get('frames')} frames per video; the published figure averages every frame"]
    clip = manifest.get("clip") or {}
    if manifest.get("pretrained") != entry["weights"] and clip.get("weights_format") != entry["weights"]:
        notes.append(f"published with {entry['weights']}'s weights; this store's are {manifest.get('pretrained')!r}")
    return {
        **{k: entry[k] for k in ("dataset", "model", "weights", "protocol", "t2v", "short", "citation", "checked")},
        "this_run": own,
        "difference": {k: round(float(own[k]) - v, 2) for k, v in entry["t2v"].items() if _number(own.get(k))},
        "notes": notes,
    }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def published_line(published: dict[str, Any]) -> str:
    """One console line: the published figure, its source, and this run's."""

    def figures(values: dict[str, Any]) -> str:
        return ", ".join(f"{k} {float(values[k]):.1f}" for k in ("R@1", "R@5", "R@10") if _number(values.get(k)))

    return (
        f"published zero-shot CLIP {published['model']} on {published['dataset']} ({published['short']}): "
        f"{figures(published['t2v'])}; this run: {figures(published['this_run'])}"
    )
