"""A sweep's table: one row per combination, mean ± std over seeds, and each row against the baseline.

The difference of a row's R@1 to the baseline's comes with a paired bootstrap 95 % interval over
queries (:func:`dab_pipeline.metrics.stats.paired_bootstrap`: both rows answered the same test
queries; the seeds both rows finished are pooled per query), and a mark where it excludes 0.
Written as sweep.json (every number, per seed too), sweep.md and sweep.png.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..core.fsutil import atomic_write_text
from ..metrics import paired_bootstrap, t2v_ranks
from ..runs.costfile import read_costs
from ..runs.run_folder import RunFolder

__all__ = ["SWEEP_FILES", "COLUMNS", "collect_run", "mean_std", "sweep_table", "sweep_markdown", "write_sweep"]

SWEEP_FILES = ("sweep.json", "sweep.md", "sweep.png")
# (column, where it comes from, decimals); "train s" and "pairs/s" from the run folder, the rest from metrics.json
COLUMNS = (
    ("R@1", ("t2v", "R@1"), 1),
    ("R@5", ("t2v", "R@5"), 1),
    ("R@10", ("t2v", "R@10"), 1),
    ("MdR", ("t2v", "MdR"), 1),
    ("MnR", ("t2v", "MnR"), 1),
    ("v2t R@1", ("v2t", "R@1"), 1),
    ("AURC", ("selective", "R@1", "aurc"), 3),
    ("train s", ("train_seconds",), 0),
    ("pairs/s", ("pairs_per_s",), 0),
)


def _dig(d: Any, path: tuple[str, ...]) -> Optional[float]:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return None if d is None else float(d)


def collect_run(run_dir: Path) -> Optional[dict[str, Any]]:
    """A finished, evaluated run's numbers and per-query R@1 hits (Q,); None when it is not finished."""
    folder = RunFolder(run_dir)
    status = folder.read_status()
    metrics_path = folder.path / "metrics.json"
    if status.get("state") != "complete" or not metrics_path.is_file():
        return None
    metrics = json.loads(metrics_path.read_text())
    cm = read_costs(folder.find_costs())
    hits = (t2v_ranks(cm.cost, cm.gt) == 1).astype(np.float64)  # (Q,)
    log = [json.loads(line) for line in (folder.path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    scoring = status.get("test_scoring") or {}
    metrics["train_seconds"] = sum(float(r.get("epoch_seconds") or 0.0) for r in log)
    metrics["pairs_per_s"] = scoring.get("pairs_per_s")
    model = json.loads(folder.config_path.read_text()).get("model", {})
    # what sets the scoring cost: the variant, and T' where there is a bridge
    scorer = model.get("variant", "?") + (
        f" T'={model.get('steps')}" if model.get("variant") in ("bridge", "dab") else ""
    )
    return {"metrics": metrics, "hits": hits, "query_ids": list(map(str, cm.query_ids)), "scorer": scorer}


def mean_std(values: list[float]) -> dict[str, Any]:
    return {
        "mean": statistics.mean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "values": values,
    }


def _row(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    cols = {}
    for name, path, _ in COLUMNS:
        vals = [v for v in (_dig(r["metrics"], path) for r in runs.values()) if v is not None and math.isfinite(v)]
        cols[name] = mean_std(vals) if vals else None
    interval = None
    if runs and len({len(r["hits"]) for r in runs.values()}) == 1:
        hits = np.stack([runs[s]["hits"] for s in sorted(runs)]) * 100  # (S, Q)
        boot = paired_bootstrap(hits, np.zeros_like(hits))  # the row's own mean R@1, over queries, seeds pooled
        interval = {"low": boot["low"], "high": boot["high"]}
    scorers = sorted({r.get("scorer", "") for r in runs.values()})
    return {"seeds": sorted(runs), "columns": cols, "r1_interval": interval, "scorer": ", ".join(scorers)}


def _against(runs: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]]) -> Optional[dict[str, Any]]:
    seeds = sorted(set(runs) & set(base))
    if not seeds:
        return None
    a = np.stack([runs[s]["hits"] for s in seeds]) * 100  # (S, Q), R@1 in points
    b = np.stack([base[s]["hits"] for s in seeds]) * 100
    if a.shape != b.shape or any(runs[s]["query_ids"] != base[s]["query_ids"] for s in seeds):
        return None  # rows scored on different queries (another store or split): not paired
    boot = paired_bootstrap(a, b)
    return {**boot, "seeds": seeds}


def sweep_table(
    rows: dict[str, dict[int, dict[str, Any]]],
    baseline: str,
    notes: tuple | list = (),
    failed: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """The table of a sweep from each row's finished runs ``{row: {seed: collect_run(...)}}``."""
    out_rows = {}
    base = rows.get(baseline, {})
    for name, runs in rows.items():
        row = _row(runs)
        row["vs_baseline"] = None if name == baseline or not runs or not base else _against(runs, base)
        out_rows[name] = row
    return {
        "baseline": baseline,
        "rows": out_rows,
        "notes": list(notes),
        "failed": dict(failed or {}),
        "columns": [c for c, _, _ in COLUMNS],
    }


def _cell(col: Optional[dict], digits: int) -> str:
    if col is None:
        return "-"
    m, s = col["mean"], col["std"]
    return f"{m:.{digits}f}" if len(col["values"]) == 1 else f"{m:.{digits}f} ± {s:.{digits}f}"


def _diff_cell(v: Optional[dict]) -> str:
    if v is None:
        return "-"
    mark = " *" if v["excludes_zero"] else ""
    return f"{v['diff']:+.1f} [{v['low']:+.1f}, {v['high']:+.1f}]{mark}"


def sweep_markdown(table: dict[str, Any]) -> str:
    """sweep.md: the table, what the interval is, the collapsed rows and the failed runs."""
    base = table["baseline"]
    head = ["row", "seeds"] + table["columns"] + [f"R@1 - {base}"]
    lines = ["| " + " | ".join(head) + " |", "| --- | ---: |" + " ---: |" * (len(head) - 2)]
    for name, row in table["rows"].items():
        cells = [_cell(row["columns"][c], d) for c, _, d in COLUMNS]
        lines.append(
            f"| {name} | {len(row['seeds'])} | " + " | ".join(cells) + f" | {_diff_cell(row['vs_baseline'])} |"
        )
    text = "\n".join(lines)
    text += (
        f"\n\nMean ± std over seeds. R@1 - {base}: the difference of means with a paired bootstrap 95 % "
        "interval over test queries (seeds both rows finished, pooled per query); * = the interval excludes 0. "
        "AURC: area under the risk-coverage curve of R@1 by the KL (or cost) margin, lower is better."
    )
    for note in table.get("notes", []):
        text += f"\n\n- {note}"
    if table.get("failed"):
        text += "\n\nFailed runs:\n" + "\n".join(f"- {k}: {v}" for k, v in table["failed"].items())
    return text + "\n"


def write_sweep(out: Path, table: dict[str, Any]) -> None:
    """sweep.json, sweep.md and sweep.png in ``out`` (each written whole, then renamed into place)."""
    atomic_write_text(out / "sweep.json", json.dumps(table, indent=2, default=float) + "\n")
    atomic_write_text(out / "sweep.md", sweep_markdown(table))
    _plot(out / "sweep.png", table)


def _plot(path: Path, table: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {n: r for n, r in table["rows"].items() if r["columns"]["R@1"] is not None and r.get("r1_interval")}
    if not rows:
        return
    names = list(rows)
    mean = np.array([rows[n]["columns"]["R@1"]["mean"] for n in names])
    err = np.array(
        [(m - rows[n]["r1_interval"]["low"], rows[n]["r1_interval"]["high"] - m) for n, m in zip(names, mean)]
    ).T  # (2, rows)
    speed = [rows[n]["columns"]["pairs/s"] for n in names]
    cost_axis = all(s is not None for s in speed) and len({rows[n]["scorer"] for n in names}) > 1
    fig, axes = plt.subplots(1, 2 if cost_axis else 1, figsize=(10 if cost_axis else 6, 3.6), squeeze=False)
    ax = axes[0][0]
    ax.errorbar(range(len(names)), mean, yerr=err, fmt="o", capsize=4)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("t2v R@1")
    ax.set_title("R@1, mean over seeds (bars: bootstrap 95 % interval over queries)", fontsize=9)
    if cost_axis:
        ax2 = axes[0][1]
        us = [statistics.mean(1e6 / v for v in s["values"]) for s in speed]  # microseconds of scoring per pair
        ax2.errorbar(us, mean, yerr=err, fmt="o", capsize=4)
        for x, y, n in zip(us, mean, names):
            ax2.annotate(n, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax2.set_xlabel("scoring cost (µs per pair, measured on the test pass)")
        ax2.set_ylabel("t2v R@1")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
