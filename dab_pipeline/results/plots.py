"""The report's plots: risk-coverage curves and the rank histogram, as PNG files.

matplotlib's object API on an Agg canvas (no display, no global pyplot state); each file is written to a
temporary name and renamed into place.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..core.fsutil import atomic_write_bytes

__all__ = ["plot_risk_coverage", "plot_rank_hist", "plot_reliability"]


def _new_figure(width: float = 6.0, height: float = 4.0) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save_png(fig: Any, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


def plot_risk_coverage(curves: dict[str, Any], path: Path) -> None:
    coverage = np.asarray(curves["coverage"], dtype=np.float64)  # (Q,)
    fig = _new_figure()
    ax = fig.add_subplot(1, 1, 1)
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for i, (key, risk) in enumerate(curves.get("risk", {}).items()):
        risk = np.asarray(risk, dtype=np.float64)
        colour = colours[i % len(colours)]
        area = float(np.mean(risk))
        ax.plot(coverage, risk, color=colour, label=f"{key}, by confidence (AURC {area:.3f})")
        rand = curves.get("random", {}).get(key)
        if rand is not None:
            ax.axhline(
                float(rand),
                color=colour,
                linestyle="--",
                label=f"{key}, random order (AURC {rand:.3f})",
            )
    ax.set_xlabel("coverage")
    ax.set_ylabel("risk (1 - accuracy)")
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(bottom=0.0)
    ax.set_title("Risk-coverage")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    _save_png(fig, path)


def plot_rank_hist(ranks: np.ndarray, path: Path) -> None:
    r = np.asarray(ranks, dtype=np.int64).reshape(-1)  # (Q,)
    fig = _new_figure()
    ax = fig.add_subplot(1, 1, 1)
    top = int(r.max()) if r.size else 1
    # Ranks are heavy-tailed (most at 1, a long tail up to V): log-spaced bins
    # on a log axis once the range spans more than a decade.
    if top > 20:
        edges = np.unique(np.round(np.logspace(0, math.log10(top + 1), 40)))
        edges = np.r_[edges, edges[-1] + 1] if edges[-1] <= top else edges
        ax.hist(r, bins=edges - 0.5, color="tab:blue")
        ax.set_xscale("log")
    else:
        ax.hist(r, bins=np.arange(0.5, top + 1.5), color="tab:blue")
    ax.set_xlabel("text-to-video rank of the ground truth")
    ax.set_ylabel("queries per bin" + (" (log-spaced bins)" if top > 20 else ""))
    ax.set_title(f"Rank histogram ({r.size} queries)")
    _save_png(fig, path)


def plot_reliability(bins: dict[str, dict[str, list]], path: Path) -> None:
    """The reliability diagram of P(the first hit is a match): per probability, each bin's accuracy against its
    mean probability (marker area: the bin's queries); the diagonal is perfect calibration."""
    fig = _new_figure(5.0, 5.0)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", label="perfectly calibrated")
    for i, (name, b) in enumerate(bins.items()):
        count = np.asarray(b["count"], np.float64)
        size = 20.0 + 200.0 * count / max(float(count.sum()), 1.0)
        colour = ["tab:blue", "tab:orange", "tab:green", "tab:red"][i % 4]
        mean = b.get("mean_probability", b.get("confidence"))  # confidence: metrics.json's former key
        ax.plot(mean, b["accuracy"], color=colour, marker=None, linewidth=1)
        ax.scatter(mean, b["accuracy"], s=size, color=colour, label=name, alpha=0.7)
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("predicted P(the first hit is a match)")
    ax.set_ylabel("share of queries whose first hit is a match")
    ax.set_title("Reliability (test split, 15 equal-width bins)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    _save_png(fig, path)
