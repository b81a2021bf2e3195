"""Per-video descriptions shown beside search hits (``dab search --descriptions``, ``dab serve --descriptions``)."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import ConfigError

__all__ = ["load_descriptions"]


def load_descriptions(path: str | Path) -> dict[str, str]:
    """Per-video descriptions to show beside search hits: JSON ``{video_id: text}`` or a CSV with
    columns ``video_id`` and ``description``."""
    import csv
    import json

    p = Path(path)
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(p.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ConfigError(f"{p}: expected a JSON object {{video_id: description}}")
            return {str(k): str(v) for k, v in data.items()}
        with open(p, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read descriptions {p}: {exc}") from None
    if rows and not {"video_id", "description"} <= set(rows[0]):
        raise ConfigError(f"{p}: a descriptions CSV needs the columns video_id and description")
    return {r["video_id"]: r["description"] for r in rows}
