"""What the search page shows of a result: the hits with thumbnails and captions, and the costs as a plot."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ...results.page import data_uri, set_marks
from ...search import Searcher, SearchResult, result_payload
from .settings import ServeSettings

__all__ = ["cost_svg", "payload", "page_result", "first_captions", "MAX_CAPTIONS_SHOWN"]


def cost_svg(costs: np.ndarray, top: int, width: int = 420, height: int = 120, shortlisted: bool = True) -> str:
    """The scored costs, ascending, as an inline SVG polyline (the top ``top`` marked); ``shortlisted``: the
    videos are a first stage's shortlist, re-ranked (else every video of the split was scored)."""
    c = np.sort(np.asarray(costs, np.float64)[np.isfinite(costs)])
    if len(c) < 2:
        return ""
    lo, hi = float(c[0]), float(c[-1])
    span = hi - lo or 1.0
    xs = np.linspace(30, width - 5, len(c))
    ys = 5 + (height - 25) * (c - lo) / span
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    what = "re-ranked" if shortlisted else "scored"  # "400 re-ranked videos" read wrong when every video was scored
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#1f6feb"/>' for x, y in zip(xs[:top], ys[:top]))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="costs of the {what} videos">'
        f'<polyline fill="none" stroke="#555" stroke-width="1" points="{pts}"/>{dots}'
        f'<text x="30" y="{height - 4}" font-size="10" fill="#555">{len(c)} {what} videos, by cost '
        f"({lo:.4g} .. {hi:.4g})</text></svg>"
    )


def payload(r: SearchResult, settings: ServeSettings, seconds: float) -> dict[str, Any]:
    margin = r.margin
    abstain = settings.abstain_below is not None and (margin is None or margin < settings.abstain_below)
    return {
        **result_payload(r, settings.descriptions),
        "confidence": margin,  # the margin's name in the API before issue 48: kept for one release (docs/search.md)
        "abstain": bool(abstain),
        "shortlist": r.shortlist,
        "ms": round(1000 * seconds, 2),
    }


MAX_CAPTIONS_SHOWN = 200_000  # above it the page shows no store captions (their texts would fill memory)


def first_captions(searcher: Searcher) -> Optional[Callable[[int], Optional[str]]]:
    """row -> the store's first caption of that video (the page's description when none was given); None for
    stores of more than MAX_CAPTIONS_SHOWN captions."""
    st = searcher.store
    if st.num_captions > MAX_CAPTIONS_SHOWN:
        return None
    first, texts = st.first_caption_rows(), st.caption_text

    def caption(row: int) -> Optional[str]:
        return str(texts[first[row]]) if first[row] >= 0 else None

    return caption


def page_result(
    searcher: Searcher,
    res: SearchResult,
    settings: ServeSettings,
    seconds: float,
    captions: Optional[Callable[[int], Optional[str]]],
) -> dict:
    rows = [int(searcher.rows[h.video_index]) for h in res.hits]  # video_index: the hit's place in the split
    thumbs = searcher.store.read_thumbnails(rows)  # in the order asked
    out = payload(res, settings, seconds)
    # the page marks the hits the conformal set holds and lists its other videos under them (none: no set)
    in_set, out["set_rest"] = set_marks(out.get("uncertainty"), [h["video_id"] for h in out["hits"]])
    for hit, thumb, row in zip(out["hits"], thumbs, rows):
        hit["thumb"] = data_uri(thumb)
        text = hit.get("description") or (captions(row) if captions else None)
        hit["description"] = text
        hit["in_set"] = hit["video_id"] in in_set
    out["plot"] = (
        cost_svg(res.costs, len(res.hits), shortlisted=res.shortlist is not None) if res.costs is not None else ""
    )
    return out
