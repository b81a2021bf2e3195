"""Several evaluated runs side by side (``dab compare``, the paper's ablation tables): their metrics.json read
back, one row a run. No click or rich here: :func:`compare_table` hands the CLI plain strings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, StoreError
from ..runs.run_folder import RunFolder
from .report import MISSING, TABLE_COLUMNS, format_metric, md_table, postprocess_label

__all__ = ["compare_table", "compare_markdown", "load_metrics"]


def compare_table(
    runs: list[tuple[str, dict[str, Any]]], *, direction: str = "t2v"
) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted rows comparing several runs (the ablation tables).

    Each run is ``(name, metrics_json_dict)``; the ``direction`` section is
    read (``"t2v"`` or ``"v2t"``), or the dict itself when it is already a
    flat metrics dict.  A post-processed run gets its label after its name so
    it cannot be mistaken for a plain one.  Missing values print as "–".
    """
    if direction not in ("t2v", "v2t"):
        raise ConfigError(f"direction must be 't2v' or 'v2t', got {direction!r}")
    headers = ["Method", *TABLE_COLUMNS]
    # bridge runs (metrics.json "bridge"): the pair-dependent share and the constant control's R@1
    bridged = direction == "t2v" and any(isinstance(d, dict) and isinstance(d.get("bridge"), dict) for _, d in runs)
    if bridged:
        headers += ["pair-dep. mu", "pair-dep. logvar", "const. R@1"]
    rows: list[list[str]] = []
    for name, data in runs:
        if not isinstance(data, dict):
            raise ConfigError(f"run {name!r}: metrics must be a dict, got {type(data).__name__}")
        section = data.get(direction, data if "R@1" in data else None)
        label = postprocess_label(data)
        shown = name if label == "none" else f"{name} [{label}]"
        if not isinstance(section, dict):
            rows.append([shown] + [MISSING] * (len(headers) - 1))
            continue
        row = [shown] + [format_metric(c, section.get(c)) for c in TABLE_COLUMNS]
        if bridged:
            row += _bridge_cells(data.get("bridge"))
        rows.append(row)
    return headers, rows


def _bridge_cells(bridge: Any) -> list[str]:
    if not isinstance(bridge, dict):
        return [MISSING] * 3
    share = bridge.get("pair_dependent_share", {})
    pct = lambda v: MISSING if v is None else f"{v * 100:.1f} %"
    ctrl = bridge.get("constant_control") or {}
    return [pct(share.get("mu")), pct(share.get("logvar")), format_metric("R@1", ctrl.get("R@1"))]


def load_metrics(target: str | Path) -> tuple[str, dict[str, Any]]:
    """``(run name, metrics.json)`` of an evaluated run folder, or of a metrics.json given by path.

    StoreError when it is missing or damaged (truncated, not JSON, not an object: e.g. a copy cut short),
    naming the file and the command that writes it again.
    """
    target = Path(target)
    run = target if target.is_dir() else target.parent
    path = run / RunFolder.METRICS if target.is_dir() else target
    remake = f"`dab evaluate --run {run}`"
    if not path.exists():
        raise StoreError(f"{target}: no metrics.json; run {remake} first")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:  # bad JSON, or bytes that are not UTF-8
        raise StoreError(f"{path} is damaged ({str(exc).splitlines()[0]}); remake it with {remake}") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path} is damaged (a JSON {type(data).__name__}, not an object); remake it with {remake}")
    return run.name, data


def compare_markdown(runs: list[tuple[str, dict[str, Any]]], *, direction: str = "t2v") -> str:
    """:func:`compare_table` rendered as a markdown table."""
    headers, rows = compare_table(runs, direction=direction)
    return md_table(headers, rows) + "\n"
