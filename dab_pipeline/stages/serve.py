"""``dab serve``: a search page and a JSON API over a run, a store and (optionally) an index.

FastAPI (an optional extra, ``pip install 'dab-pipeline[serve]'``); the CLI runs the app
with uvicorn. Everything heavy is loaded once in a :class:`~dab_pipeline.stages.search.Searcher`;
requests are served one at a time (its lock: the model runs thread-limited in inference
mode, and a second query would only slice the same cores).

* ``GET /search?q=...&k=10`` -> JSON: the hits (rank, video id, cost, description), the
  confidence (the KL margin: 2nd minus 1st cost among the re-ranked videos) and
  ``abstain`` (confidence below the threshold the user set; with the run's test costs, the
  coverage and precision that threshold gave on the test split).
* ``GET /`` -> the search page (``?q=`` shows results): thumbnails from the store, the
  confidence, and the re-ranked costs as a plot. Every user string is escaped (jinja2).
* ``GET /healthz`` -> what is loaded.

Bad requests get a 4xx with a one-line message (empty, too long or non-printable queries,
k out of range), never a 500 with a traceback.
"""

from __future__ import annotations

import logging
import math
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ..core.errors import ConfigError, DabError
from ..metrics import kl_margin, threshold_outcome
from ..results.page import data_uri
from ..runs.costfile import read_costs
from ..runs.run_folder import RunFolder
from .search import SearchResult, Searcher

__all__ = ["ServeSettings", "abstain_report", "create_app", "cost_svg"]

log = logging.getLogger("dab.serve")


@dataclass(frozen=True)
class ServeSettings:
    """What a server answers with: page defaults, limits, the abstain threshold."""

    k: int = 10
    max_k: int = 100
    shortlist: Optional[int] = None  # videos re-ranked a query (None: the Searcher's default)
    max_query_chars: int = 500
    abstain_below: Optional[float] = None  # confidence (margin) under which a query is flagged
    descriptions: dict = field(default_factory=dict)
    title: str = "dab search"


def abstain_report(run_dir: Path, threshold: Optional[float]) -> Optional[dict]:
    """What ``threshold`` on the margin did on the run's test split: coverage and precision (R@1) there.

    None without a threshold or without the run's test costs (``costs_test.*``)."""
    if threshold is None:
        return None
    folder = RunFolder(run_dir)
    path = next((p for p in sorted(folder.path.glob("costs_test.*"))), None)
    if path is None:
        return {"threshold": threshold, "test": None, "note": f"no test costs in {run_dir}"}
    cm = read_costs(path)
    cost = cm.to_cost()  # (Q, V)
    ok = cm.gt >= 0
    if not ok.any() or cost.shape[1] < 2:
        return {"threshold": threshold, "test": None, "note": f"{path} has no queries with a known ground truth"}
    margin = kl_margin(cost[ok])
    correct = np.argmin(cost[ok], axis=1) == cm.gt[ok]
    coverage, precision = threshold_outcome(margin, correct, threshold)
    return {"threshold": threshold, "test": {"queries": int(ok.sum()), "coverage": coverage,
                                             "precision_at_1": None if math.isnan(precision) else precision,
                                             "precision_at_1_all": float(correct.mean())}}


def check_query(q: Optional[str], max_chars: int) -> str:
    """The query text, or a :class:`ConfigError` saying what is wrong with it (the app answers 400)."""
    if q is None or not q.strip():
        raise ConfigError("the query q is empty: pass ?q=some+words")
    if len(q) > max_chars:
        raise ConfigError(f"the query is {len(q)} characters long; at most {max_chars} are accepted")
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn") for ch in q):
        raise ConfigError("the query holds control or unassigned characters; send plain text")
    return q.strip()


def cost_svg(costs: np.ndarray, top: int, width: int = 420, height: int = 120) -> str:
    """The re-ranked costs, ascending, as an inline SVG polyline (the top ``top`` marked)."""
    c = np.sort(np.asarray(costs, np.float64)[np.isfinite(costs)])
    if len(c) < 2:
        return ""
    lo, hi = float(c[0]), float(c[-1])
    span = hi - lo or 1.0
    xs = np.linspace(30, width - 5, len(c))
    ys = 5 + (height - 25) * (c - lo) / span
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#1f6feb"/>' for x, y in zip(xs[:top], ys[:top]))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="costs of the re-ranked videos">'
            f'<polyline fill="none" stroke="#555" stroke-width="1" points="{pts}"/>{dots}'
            f'<text x="30" y="{height - 4}" font-size="10" fill="#555">{len(c)} re-ranked videos, by cost '
            f'({lo:.4g} .. {hi:.4g})</text></svg>')


def _payload(r: SearchResult, settings: ServeSettings, seconds: float) -> dict[str, Any]:
    conf = r.margin
    abstain = (settings.abstain_below is not None and (conf is None or conf < settings.abstain_below))
    about = settings.descriptions
    return {"query": r.query, "confidence": conf, "abstain": bool(abstain), "shortlist": r.shortlist,
            "hits": [{"rank": h.rank, "video_id": h.video_id, "cost": h.cost,
                      **({"description": about.get(h.video_id)} if about else {})} for h in r.hits],
            "ms": round(1000 * seconds, 2)}


def create_app(searcher: Searcher, settings: ServeSettings = ServeSettings(), abstain: Optional[dict] = None):
    """The FastAPI app over a loaded :class:`Searcher`."""
    try:
        import jinja2
        from fastapi import FastAPI, Query, Request
        from fastapi.responses import HTMLResponse, JSONResponse
    except ImportError:
        raise ConfigError("dab serve needs FastAPI: `pip install 'dab-pipeline[serve]'`") from None

    app = FastAPI(title=settings.title, docs_url=None, redoc_url=None)
    env = jinja2.Environment(loader=jinja2.PackageLoader("dab_pipeline.results", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    page = env.get_template("search.html.j2")

    @app.exception_handler(DabError)
    async def _dab_error(request: Request, exc: DabError):
        return JSONResponse({"error": str(exc)}, status_code=400 if isinstance(exc, ConfigError) else 500)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("search failed")  # the server's log keeps the traceback; the client gets one line
        return JSONResponse({"error": f"internal error ({type(exc).__name__})"}, status_code=500)

    captions = _first_captions(searcher)

    def run_query(q: str, k: int) -> tuple[SearchResult, float]:
        t0 = time.perf_counter()
        with searcher.lock:
            (res,) = searcher.search([q], topk=k, shortlist=settings.shortlist)
        return res, time.perf_counter() - t0

    @app.get("/search")
    def search(q: Optional[str] = Query(None, description="the query text"),
               k: int = Query(settings.k, ge=1, le=settings.max_k, description="videos returned")) -> dict:
        res, secs = run_query(check_query(q, settings.max_query_chars), k)
        return {**_payload(res, settings, secs), "k": k, "abstain_threshold": abstain}

    @app.get("/healthz")
    def healthz() -> dict:
        meta = searcher.index.meta if searcher.index is not None else None
        return {"ok": True, "videos": searcher.num_videos, "split": searcher.split,
                "run": str(searcher.run.run_dir), "store": str(searcher.store_path),
                "index": None if meta is None else {"factory": meta.factory, "vector": meta.vector}}

    @app.get("/", response_class=HTMLResponse)
    def home(q: Optional[str] = Query(None), k: int = Query(settings.k, ge=1, le=settings.max_k)) -> str:
        result, error = None, None
        if q is not None:
            try:
                res, secs = run_query(check_query(q, settings.max_query_chars), k)
                result = _page_result(searcher, res, settings, secs, captions)
            except ConfigError as exc:
                error = str(exc)
        return page.render(title=settings.title, q=q or "", k=k, result=result, error=error, abstain=abstain,
                           videos=searcher.num_videos, index=searcher.index is not None)

    return app


MAX_CAPTIONS_SHOWN = 200_000  # above it the page shows no store captions (their texts would fill memory)


def _first_captions(searcher: Searcher) -> Optional[Callable[[int], Optional[str]]]:
    """row -> the store's first caption of that video (the page's description when none was given); None for
    stores of more than MAX_CAPTIONS_SHOWN captions."""
    st = searcher.store
    if st.num_captions > MAX_CAPTIONS_SHOWN:
        return None
    first, texts = st.first_caption_rows(), st.caption_text

    def caption(row: int) -> Optional[str]:
        return str(texts[first[row]]) if first[row] >= 0 else None

    return caption


def _page_result(searcher: Searcher, res: SearchResult, settings: ServeSettings, seconds: float,
                 captions: Optional[Callable[[int], Optional[str]]]) -> dict:
    rows = [int(searcher.rows[h.video_index]) for h in res.hits]  # video_index: the hit's place in the split
    thumbs = searcher.store.read_thumbnails(rows)  # in the order asked
    out = _payload(res, settings, seconds)
    for hit, thumb, row in zip(out["hits"], thumbs, rows):
        hit["thumb"] = data_uri(thumb)
        text = hit.get("description") or (captions(row) if captions else None)
        hit["description"] = text
    out["plot"] = cost_svg(res.costs, len(res.hits)) if res.costs is not None else ""
    return out
