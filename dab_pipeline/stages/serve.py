"""``dab serve``: a search page and a JSON API over a run, a store and (optionally) an index.

FastAPI (an optional extra, ``pip install 'dab-pipeline[serve]'``); the CLI runs the app
with uvicorn. Everything heavy is loaded once in a :class:`~dab_pipeline.search.Searcher`;
requests are served one at a time (its lock: the model runs thread-limited in inference
mode, and a second query would only slice the same cores).

* ``GET /search?q=...&k=10`` -> JSON: the hits (rank, video id, cost, description), the
  confidence (the KL margin: 2nd minus 1st cost among the re-ranked videos) and
  ``abstain`` (confidence below the threshold the user set; with the run's test costs, the
  coverage and precision that threshold gave on the test split).
* ``GET /`` -> the search page (``?q=`` shows results): thumbnails from the store, the
  confidence, and the re-ranked costs as a plot. Every user string is escaped (jinja2).
* ``GET /healthz`` -> what is loaded; 503 with ``ok: false`` and the reason once the store or index
  changed or a read of them failed.

Bad requests get a 4xx with a one-line message (empty, too long, non-printable or non-UTF-8
queries, k out of range), never a 500 with a traceback. The store and index files are checked
before and after every search (one ``stat`` each): a store truncated, deleted or copied over
under the server, or a read that fails, makes every later answer a 503 naming the file, logged
once, until the server is restarted.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import unicodedata
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from ..core.errors import ConfigError, DabError, StoreError
from ..core.filewatch import FileWatch
from ..metrics import kl_margin, threshold_outcome
from ..results.page import data_uri
from ..runs.costfile import read_costs
from ..runs.run_folder import RunFolder
from ..search import Searcher, SearchResult

if TYPE_CHECKING:
    from fastapi import Request
    from fastapi.responses import HTMLResponse

__all__ = ["ServeSettings", "Health", "Unavailable", "abstain_report", "create_app", "cost_svg", "check_query_string"]

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

    def __post_init__(self) -> None:
        if self.abstain_below is not None and not math.isfinite(self.abstain_below):
            raise ConfigError(f"abstain_below must be a finite confidence (a KL margin), got {self.abstain_below}")
        for name in ("k", "max_k", "max_query_chars"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")


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
    return {
        "threshold": threshold,
        "test": {
            "queries": int(ok.sum()),
            "coverage": coverage,
            "precision_at_1": None if math.isnan(precision) else precision,
            "precision_at_1_all": float(correct.mean()),
        },
    }


def check_query(q: Optional[str], max_chars: int) -> str:
    """The query text, or a :class:`ConfigError` saying what is wrong with it (the app answers 400)."""
    if q is None or not q.strip():
        raise ConfigError("the query q is empty: pass ?q=some+words")
    if len(q) > max_chars:
        raise ConfigError(f"the query is {len(q)} characters long; at most {max_chars} are accepted")
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn") for ch in q):
        raise ConfigError("the query holds control or unassigned characters; send plain text")
    return q.strip()


def check_query_string(raw: bytes) -> None:
    """A :class:`ConfigError` (400) for a query string that is not UTF-8 once percent-decoded (``q=%ff``), which
    the web framework would otherwise turn into U+FFFD characters and search for."""
    try:
        urllib.parse.parse_qsl(raw.decode("latin-1"), keep_blank_values=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise ConfigError("the query string is not valid UTF-8 (percent-encode the query's UTF-8 bytes)") from None


def printable(text: str) -> str:
    """``text`` without control and unassigned characters, to echo a refused query back into the page."""
    return "".join(ch for ch in text if unicodedata.category(ch) not in ("Cc", "Cs", "Co", "Cn"))


class Health:
    """Whether the server may still answer: its store and index files are the ones it opened, and reading them
    has not failed. Once either fails the server answers 503 until it is restarted (an open HDF5 file that was
    truncated, deleted or copied over still reads, as zeros or as the old data)."""

    def __init__(self, searcher: Searcher) -> None:
        self.watch = FileWatch(searcher.identity_files())
        searcher.store.refuse_changes_after(time.time_ns())  # Zarr chunks rewritten in place: refused when read
        self.problem: Optional[str] = None
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise :class:`Unavailable` when the files changed (now or before) or a read failed before."""
        if self.problem is None:
            change = self.watch.changed()
            if change is not None:
                self.fail(change)
        if self.problem is not None:
            raise Unavailable(self.problem)

    def fail(self, what: str) -> None:
        """Record the first problem (logged once) and raise :class:`Unavailable`."""
        with self._lock:
            if self.problem is None:
                self.problem = (
                    f"{what}; this server stops answering from it: restart `dab serve` (after "
                    "`dab index --overwrite ...` if the store's videos changed)"
                )
                log.error("%s", self.problem)
        raise Unavailable(self.problem)


class Unavailable(StoreError):
    """The server's store or index changed or is damaged: 503 with one line, until a restart."""


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
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="costs of the re-ranked videos">'
        f'<polyline fill="none" stroke="#555" stroke-width="1" points="{pts}"/>{dots}'
        f'<text x="30" y="{height - 4}" font-size="10" fill="#555">{len(c)} re-ranked videos, by cost '
        f"({lo:.4g} .. {hi:.4g})</text></svg>"
    )


def _payload(r: SearchResult, settings: ServeSettings, seconds: float) -> dict[str, Any]:
    conf = r.margin
    abstain = settings.abstain_below is not None and (conf is None or conf < settings.abstain_below)
    about = settings.descriptions
    return {
        "query": r.query,
        "confidence": conf,
        "abstain": bool(abstain),
        "shortlist": r.shortlist,
        "hits": [
            {
                "rank": h.rank,
                "video_id": h.video_id,
                "cost": h.cost,
                **({"description": about.get(h.video_id)} if about else {}),
            }
            for h in r.hits
        ],
        "ms": round(1000 * seconds, 2),
    }


def create_app(searcher: Searcher, settings: ServeSettings = ServeSettings(), abstain: Optional[dict] = None):
    """The FastAPI app over a loaded :class:`Searcher`."""
    try:
        import jinja2
        from fastapi import FastAPI, Query, Request
        from fastapi.responses import HTMLResponse, JSONResponse
    except ImportError:
        raise ConfigError("dab serve needs FastAPI: `pip install 'dab-pipeline[serve]'`") from None

    app = FastAPI(title=settings.title, docs_url=None, redoc_url=None)
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dab_pipeline.results", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    page = env.get_template("search.html.j2")
    _add_error_handlers(app, JSONResponse)
    captions = _first_captions(searcher)
    health = Health(searcher)
    run_query = _query_runner(searcher, settings, health)
    routes = (
        ("/search", _search_route(run_query, settings, abstain, Query)),
        ("/healthz", _healthz_route(searcher, health, JSONResponse)),
        ("/", _home_route(searcher, settings, abstain, run_query, page, captions, Query, HTMLResponse)),
    )
    for path, fn in routes:
        if "request" in fn.__annotations__:
            # this module's annotations are strings (`from __future__ import annotations`) and Request is
            # imported in create_app, not at the top (FastAPI is an extra): FastAPI could not resolve the name
            fn.__annotations__["request"] = Request
        app.api_route(path, methods=["GET", "HEAD"])(fn)  # HEAD: monitors and link checkers ask it
    app.state.health = health
    return app


def _add_error_handlers(app, JSONResponse) -> None:
    """Library errors answer their status with one line; anything else a 500 with one line (the log keeps more)."""

    @app.exception_handler(DabError)
    async def _dab_error(request: Request, exc: DabError):
        return JSONResponse({"error": str(exc)}, status_code=_status(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("search failed")  # the server's log keeps the traceback; the client gets one line
        return JSONResponse({"error": f"internal error ({type(exc).__name__})"}, status_code=500)


def _query_runner(
    searcher: Searcher, settings: ServeSettings, health: Health
) -> Callable[[Request, Optional[str], int], tuple[SearchResult, float]]:
    """request, q, k -> (the checked query's result, seconds searching), the files checked before and after."""

    def run_query(request: Request, q: Optional[str], k: int) -> tuple[SearchResult, float]:
        check_query_string(request.scope.get("query_string", b""))
        text = check_query(q, settings.max_query_chars)
        t0 = time.perf_counter()
        with searcher.lock:
            health.check()
            res = _search_or_fail(searcher, health, text, k, settings.shortlist)
            health.check()  # changed while it was read: the answer may mix old and new bytes
        return res, time.perf_counter() - t0

    return run_query


def _search_route(run_query: Callable, settings: ServeSettings, abstain: Optional[dict], Query) -> Callable:
    """``GET /search``: the JSON answer to one query."""

    def search(
        request: Request,
        q: Optional[str] = Query(None, description="the query text"),
        k: int = Query(settings.k, ge=1, le=settings.max_k, description="videos returned"),
    ) -> dict:
        res, secs = run_query(request, q, k)
        return {**_payload(res, settings, secs), "k": k, "abstain_threshold": abstain}

    return search


def _healthz_route(searcher: Searcher, health: Health, JSONResponse) -> Callable:
    """``GET /healthz``: what is loaded, or 503 with the reason the server stopped answering."""

    def healthz():
        meta = searcher.index.meta if searcher.index is not None else None
        try:
            health.check()
        except Unavailable as exc:
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=503)
        return {
            "ok": True,
            "videos": searcher.num_videos,
            "split": searcher.split,
            "run": str(searcher.run.run_dir),
            "store": str(searcher.store_path),
            "index": None if meta is None else {"factory": meta.factory, "vector": meta.vector},
        }

    return healthz


def _home_route(
    searcher: Searcher,
    settings: ServeSettings,
    abstain: Optional[dict],
    run_query: Callable,
    page,
    captions: Optional[Callable[[int], Optional[str]]],
    Query,
    HTMLResponse,
) -> Callable:
    """``GET /``: the search page, with the results of ``?q=`` when given."""

    def home(
        request: Request, q: Optional[str] = Query(None), k: int = Query(settings.k, ge=1, le=settings.max_k)
    ) -> HTMLResponse:
        result, error, status = None, None, 200
        if q is not None:
            try:
                res, secs = run_query(request, q, k)
                result = _page_result(searcher, res, settings, secs, captions)
            except DabError as exc:  # the page says it, with the status the API gives the same request
                error, status = str(exc), _status(exc)
        html = page.render(
            title=settings.title,
            q=printable(q or ""),
            k=k,
            result=result,
            error=error,
            abstain=abstain,
            videos=searcher.num_videos,
            index=searcher.index is not None,
        )
        return HTMLResponse(html, status_code=status)

    return home


def _search_or_fail(searcher: Searcher, health: Health, text: str, k: int, shortlist: Optional[int]) -> SearchResult:
    """One query's result; a read of the store or index that fails twice (damage, not a passing hiccup of a
    network file system) stops the server from answering (:meth:`Health.fail`)."""
    for attempt in (1, 2):
        try:
            (res,) = searcher.search([text], topk=k, shortlist=shortlist)
            return res
        except (StoreError, OSError) as exc:  # the store's or the index's, not the query's
            if attempt == 2:
                health.fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            log.warning("a read failed, trying once more: %s", exc)
    raise AssertionError("unreachable")


def _status(exc: DabError) -> int:
    """The HTTP status of a library error: the request's fault (400), the data's (503), or a bug (500)."""
    if isinstance(exc, ConfigError):
        return 400
    return 503 if isinstance(exc, StoreError) else 500


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


def _page_result(
    searcher: Searcher,
    res: SearchResult,
    settings: ServeSettings,
    seconds: float,
    captions: Optional[Callable[[int], Optional[str]]],
) -> dict:
    rows = [int(searcher.rows[h.video_index]) for h in res.hits]  # video_index: the hit's place in the split
    thumbs = searcher.store.read_thumbnails(rows)  # in the order asked
    out = _payload(res, settings, seconds)
    for hit, thumb, row in zip(out["hits"], thumbs, rows):
        hit["thumb"] = data_uri(thumb)
        text = hit.get("description") or (captions(row) if captions else None)
        hit["description"] = text
    out["plot"] = cost_svg(res.costs, len(res.hits)) if res.costs is not None else ""
    return out
