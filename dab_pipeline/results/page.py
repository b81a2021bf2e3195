"""Result pages a person opens: retrieved videos as thumbnails, in one self-contained HTML file.

For a sample of queries (chosen across the KL margin's range, failures included) a page shows
the caption, the ground-truth video and its rank, the top-k videos with their thumbnails,
costs and captions, the KL margin, and a Figure 5-style plot of the query's costs
over every video (sorted, ground truth and top-k marked); for a calibrated search (``dab search --html``) its
calibrated answer as ``dab serve``'s page shows it (templates/_uncertainty.html.j2). Images are inline (data URIs): no
network, no server. Rendered with jinja2 (``templates/examples.html.j2``), plots with matplotlib.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from ..core.fsutil import atomic_write_text
from ..metrics import kl_margin, t2v_ranks

__all__ = [
    "ExampleHit",
    "ExampleQuery",
    "select_queries",
    "build_queries",
    "render_page",
    "cost_plot",
    "set_marks",
]

TEMPLATE = "examples.html.j2"


@dataclass
class ExampleHit:
    rank: int
    video: str
    cost: float
    is_gt: bool = False
    thumb: Optional[str] = None  # data URI
    caption: Optional[str] = None
    in_set: bool = False  # the query's conformal set holds this video (a calibrated search asked for one)


@dataclass
class ExampleQuery:
    text: str
    margin: Optional[float]
    hits: list[ExampleHit] = field(default_factory=list)
    gt_video: Optional[str] = None
    gt_rank: Optional[int] = None
    gt_cost: Optional[float] = None
    gt_thumb: Optional[str] = None
    plot: Optional[str] = None  # data URI
    unknown_words: tuple[str, ...] = ()  # words of a free-text query the model has no embedding for
    # a calibrated search's answer as JSON (dab_pipeline.search.uncertainty_payload), drawn as dab serve's page
    # draws it (templates/_uncertainty.html.j2): set by :meth:`add_uncertainty`
    uncertainty: Optional[dict] = None
    set_rest: list[str] = field(default_factory=list)  # the set's videos beyond the hits shown, best first

    def add_uncertainty(self, u: Optional[dict]) -> None:
        """Show ``u`` (an uncertainty payload, or None) on this query: its hits in the set marked, the rest listed."""
        self.uncertainty = u
        in_set, self.set_rest = set_marks(u, [h.video for h in self.hits])
        for h in self.hits:
            h.in_set = h.video in in_set


def select_queries(cost: np.ndarray, gt: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """``n`` query indices spread over the KL-margin quantiles, a quarter of them failures when there are any.

    Deterministic in ``seed``; returned most confident first.
    """
    q = cost.shape[0]
    n = min(int(n), q)
    if n <= 0:
        return np.zeros(0, np.int64)
    rng = np.random.default_rng(seed)
    margin = kl_margin(cost) if cost.shape[1] >= 2 else np.zeros(q)
    failures = np.flatnonzero(t2v_ranks(cost, gt) > 1)
    n_fail = min(len(failures), n // 4)
    picked = list(_spread(failures, margin, n_fail, rng))
    rest = np.setdiff1d(np.arange(q), picked)
    picked += list(_spread(rest, margin, n - len(picked), rng))
    picked = np.asarray(picked, np.int64)
    return picked[np.argsort(-margin[picked], kind="stable")]


def _spread(candidates: np.ndarray, margin: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` of ``candidates``, one from each of k equal bins of their margin order."""
    if k <= 0 or len(candidates) == 0:
        return np.zeros(0, np.int64)
    ordered = candidates[np.argsort(margin[candidates], kind="stable")]
    bins = np.array_split(ordered, k)
    return np.array([int(b[rng.integers(len(b))]) for b in bins if len(b)], np.int64)


def set_marks(u: Optional[dict], shown: Sequence[str]) -> tuple[set[str], list[str]]:
    """(the ids of ``shown`` that the conformal set of ``u`` (an uncertainty payload) holds, the set's other ids best
    first): what a page marks on its hits and lists under them; nothing where ``u`` has no set (none asked for, or
    none built for this query)."""
    members = [h["video_id"] for h in ((u or {}).get("set") or [])]
    seen = set(shown)
    return seen.intersection(members), [v for v in members if v not in seen]


def data_uri(data: Optional[bytes], mime: str = "image/jpeg") -> Optional[str]:
    return None if not data else f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def cost_plot(row: np.ndarray, gt: Optional[int], top: Sequence[int]) -> str:
    """A query's costs over every video, sorted (Figure 5 style), ground truth and top-k marked -> PNG data URI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = np.argsort(row, kind="stable")
    pos = np.empty_like(order)
    pos[order] = np.arange(len(order))
    fig, ax = plt.subplots(figsize=(4.2, 1.8), dpi=90)
    ax.plot(np.arange(len(row)), row[order], color="#555", lw=1)
    ax.scatter(pos[list(top)], row[list(top)], s=14, color="#1f6feb", zorder=3, label=f"top {len(top)}")
    if gt is not None:
        ax.scatter([pos[gt]], [row[gt]], s=36, marker="*", color="#1b7f3b", zorder=4, label="ground truth")
    ax.set_xlabel("videos, by cost")
    ax.set_ylabel("cost")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return data_uri(buf.getvalue(), "image/png")


def build_queries(
    cost: np.ndarray,
    picks: Sequence[int],
    texts: Sequence[str],
    video_ids: Sequence[str],
    gt: Optional[np.ndarray] = None,
    thumbs: Optional[Mapping[str, Optional[bytes]]] = None,
    captions: Optional[Mapping[str, str]] = None,
    k: int = 5,
    plots: bool = True,
) -> list[ExampleQuery]:
    """The blocks of the page for the queries ``picks`` (rows of ``cost`` (Q, V), lower is better)."""
    thumbs, captions = thumbs or {}, captions or {}
    picks = np.asarray(picks, np.int64)
    margins = kl_margin(cost[picks]) if cost.shape[1] >= 2 else np.full(len(picks), np.nan)
    ranks = t2v_ranks(cost[picks], gt[picks]) if gt is not None else None
    out = []
    for j, qi in enumerate(picks):
        row = np.asarray(cost[qi], np.float64)
        top = np.argsort(row, kind="stable")[: min(k, len(row))]
        g = int(gt[qi]) if gt is not None else None
        hits = [
            ExampleHit(
                rank=r + 1,
                video=str(video_ids[v]),
                cost=float(row[v]),
                is_gt=(g == int(v)),
                thumb=data_uri(thumbs.get(str(video_ids[v]))),
                caption=captions.get(str(video_ids[v])),
            )
            for r, v in enumerate(top)
        ]
        eq = ExampleQuery(text=str(texts[qi]), margin=None if np.isnan(margins[j]) else float(margins[j]), hits=hits)
        if g is not None:
            eq.gt_video, eq.gt_rank, eq.gt_cost = str(video_ids[g]), int(ranks[j]), float(row[g])
            eq.gt_thumb = data_uri(thumbs.get(str(video_ids[g])))
        if plots:
            eq.plot = cost_plot(row, g, [int(v) for v in top])
        out.append(eq)
    return out


def render_page(
    path: str | Path, title: str, summary: Sequence[tuple[str, str]], queries: Sequence[ExampleQuery]
) -> Path:
    """Write the self-contained page; returns its path."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dab_pipeline.results", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
    )
    html = env.get_template(TEMPLATE).render(title=title, summary=list(summary), queries=list(queries))
    path = Path(path)
    atomic_write_text(path, html)
    return path
