"""The FastAPI app over a loaded :class:`~dab_pipeline.search.Searcher`: /search, /healthz and the page."""

from __future__ import annotations

import contextlib
import inspect
import time
from typing import TYPE_CHECKING, Callable, Optional

from ...calibration import DEFAULT_CONFORMAL_SCORE, DEFAULT_DELTA, UncertaintyRequest
from ...core.errors import ConfigError, DabError, ServiceUnavailableError, StoreError
from ...search import Searcher, SearchResult
from .batch_runner import run_batch
from .batcher import Batcher
from .health import Health, Unavailable, log
from .search_page import first_captions, page_result, payload
from .settings import ServeSettings, check_query, check_query_string, printable

if TYPE_CHECKING:
    from fastapi import Request
    from fastapi.responses import HTMLResponse

__all__ = ["create_app", "status_of"]


def create_app(
    searcher: Searcher, settings: ServeSettings = ServeSettings(), abstain: Optional[dict] = None, answers=None
):
    """The FastAPI app over a loaded :class:`Searcher`. ``answers``: what answers a query instead of this process's
    :class:`Batcher` (``async answer(text, k)``, ``submit(text, k)``, ``stats()``, ``close()``): ``dab serve
    --ray``'s, whose batches go to the re-rank replicas; the page, the checks and the calibrated answers stay
    here."""
    try:
        import jinja2
        from fastapi import FastAPI, Query, Request
        from fastapi.responses import HTMLResponse, JSONResponse
    except ImportError:
        raise ConfigError("dab serve needs FastAPI: `pip install 'dab-pipeline[serve]'`") from None

    health = Health(searcher)
    batcher = answers or Batcher(
        lambda items: run_batch(searcher, health, items, settings.shortlist),
        max_batch=settings.max_batch,
        wait_s=settings.batch_wait_ms / 1000,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        batcher.close()  # the batch in flight finishes before the CLI closes the Searcher

    app = FastAPI(title=settings.title, docs_url=None, redoc_url=None, lifespan=lifespan)
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dab_pipeline.results", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    page = env.get_template("search.html.j2")
    _add_error_handlers(app, JSONResponse)
    captions = first_captions(searcher)
    run_query = _query_runner(searcher, batcher, settings)
    routes = (
        ("/search", _search_route(searcher, batcher, settings, abstain, Query, JSONResponse)),
        ("/healthz", _healthz_route(searcher, health, batcher, JSONResponse)),
        ("/", _home_route(searcher, settings, abstain, run_query, page, captions, Query, HTMLResponse)),
    )
    for path, fn in routes:
        if "request" in fn.__annotations__:
            # this module's annotations are strings (`from __future__ import annotations`) and Request is
            # imported in create_app, not at the top (FastAPI is an extra): FastAPI could not resolve the name
            fn.__annotations__["request"] = Request
        app.api_route(path, methods=["GET", "HEAD"])(fn)  # HEAD: monitors and link checkers ask it
    app.state.health, app.state.batcher = health, batcher
    return app


def _add_error_handlers(app, JSONResponse) -> None:
    """Every error is ``{"error": "one line"}``: library errors with their status, a parameter FastAPI refuses
    (``k=0``, ``k=abc``) 422 naming it, an unknown path 404; anything else a 500 with one line (the log keeps
    more)."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return JSONResponse({"error": invalid_parameters(exc.errors())}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(DabError)
    async def _dab_error(request: Request, exc: DabError):
        return JSONResponse({"error": str(exc)}, status_code=status_of(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("search failed")  # the server's log keeps the traceback; the client gets one line
        return JSONResponse({"error": f"internal error ({type(exc).__name__})"}, status_code=500)


def invalid_parameters(errors: list[dict]) -> str:
    """FastAPI's validation errors as one line: ``k: must be >= 1 (got '0')``."""
    said = []
    for e in errors:
        where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("query", "body", "path"))
        msg = str(e.get("msg", "invalid")).replace("Input should be", "must be")
        where = where or "request"
        said.append(f"{where}: {msg} (got {e['input']!r})" if "input" in e else f"{where}: {msg}")
    return "; ".join(said) or "invalid request"


def _query_runner(
    searcher: Searcher, batcher: Batcher, settings: ServeSettings
) -> Callable[..., tuple[SearchResult, float]]:
    """q, k, uncertainty -> (the checked query's result, seconds from its arrival to its answer), answered
    in a batch of the queries that arrived with it (the files checked before and after each batch:
    batch_runner.run_batch), then given its calibrated answer (``uncertainty``: a conformal set, a risk decision)."""

    def run_query(
        q: Optional[str], k: int, uncertainty: Optional[UncertaintyRequest] = None
    ) -> tuple[SearchResult, float]:
        text = check_query(q, settings.max_query_chars)  # its query string: checked by the page before
        searcher.check_request(uncertainty, served=True)  # a request the calibration cannot meet waits for no batch
        t0 = time.perf_counter()
        res = searcher.reassess(batcher.submit(text, k), uncertainty) if uncertainty else batcher.submit(text, k)
        return res, time.perf_counter() - t0

    return run_query


def _checked(request: Request, q: Optional[str], settings: ServeSettings) -> str:
    """The query text of a request whose query string passed :func:`_check_parameters`."""
    _check_parameters(request)
    return check_query(q, settings.max_query_chars)


def _check_parameters(request: Request) -> None:
    # the route's parameters are its endpoint's (request aside): each may be given once, and no other one (an
    # ignored max-risk= would answer without the risk decision asked for)
    if "endpoint" not in request.scope:
        return
    route = [p for p in inspect.signature(request.scope["endpoint"]).parameters if p != "request"]
    check_query_string(request.scope.get("query_string", b""), once=route, known=route)


def _search_route(
    searcher: Searcher, batcher: Batcher, settings: ServeSettings, abstain: Optional[dict], Query, JSONResponse
) -> Callable:
    """``GET /search``: the JSON answer to one query. Async: a query waits for its batch on the event loop, not in
    a thread of the pool, and the answer is sent as it is (no response model to validate it against)."""

    async def search(
        request: Request,
        q: Optional[str] = Query(None, description="the query text"),
        k: int = Query(settings.k, ge=1, le=settings.max_k, description="videos returned"),
        coverage: Optional[float] = Query(None, description="a conformal set of this coverage (dab calibrate)"),
        score: str = Query(DEFAULT_CONFORMAL_SCORE, description="the conformal score: lac, aps, raps, normalized"),
        max_risk: Optional[float] = Query(None, description="answer under this risk of a wrong first hit"),
        delta: float = Query(DEFAULT_DELTA, description="the risk guarantee's failure probability"),
    ):
        text = _checked(request, q, settings)
        wanted = UncertaintyRequest(coverage, score, max_risk, delta)  # outside (0, 1): a 400 naming it
        searcher.check_request(wanted, served=True)  # a refusal says how to restart the server, not `dab search`
        t0 = time.perf_counter()
        res = await batcher.answer(text, k)
        if wanted.active:
            res = searcher.reassess(res, wanted)
        secs = time.perf_counter() - t0
        return JSONResponse({**payload(res, settings, secs), "k": k, "abstain_threshold": abstain})

    return search


def _healthz_route(searcher: Searcher, health: Health, batcher: Batcher, JSONResponse) -> Callable:
    """``GET /healthz``: what is loaded and how queries were batched, or 503 with the reason the server stopped
    answering."""

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
            # what coverage= and max_risk= read (dab calibrate), or why they cannot be asked for
            "calibration": _calibration_status(searcher),
            "batching": batcher.stats(),
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
        request: Request,
        q: Optional[str] = Query(None),
        k: Optional[str] = Query(None),
        coverage: Optional[str] = Query(None),
        max_risk: Optional[str] = Query(None),
    ) -> HTMLResponse:
        # k is read here, not by FastAPI, so that a bad one is said on the page (the API answers it as JSON)
        result, error, status = None, page_k_error(k, settings.max_k), 200
        k = int(k) if k is not None and k.strip() and error is None else settings.k
        if error is not None:
            status = 422
        else:
            try:  # the page says it, with the status the API gives the same request
                _check_parameters(request)  # given twice, or not the page's: also without a query
                if q is not None:
                    res, secs = run_query(q, k, page_uncertainty(coverage, max_risk))
                    result = page_result(searcher, res, settings, secs, captions)
            except DabError as exc:
                error, status = str(exc), status_of(exc)
        html = page.render(
            title=settings.title,
            q=printable(q or ""),
            k=k,
            result=result,
            error=error,
            abstain=abstain,
            coverage=coverage or "",
            max_risk=max_risk or "",
            calibrated=searcher.calibration is not None,
            videos=searcher.num_videos,
            index=searcher.index is not None,
        )
        return HTMLResponse(html, status_code=status)

    return home


def _calibration_status(searcher: Searcher) -> Optional[dict]:
    cal = searcher.calibration
    if cal is None:
        return {"error": searcher.calibration_problem} if searcher.calibration_problem else None
    g = cal.gallery
    return {
        "queries": cal.queries,
        "method": cal.method,
        "gallery": {"split": g.get("split"), "videos": g.get("videos")},
    }


def page_k_error(k: Optional[str], max_k: int) -> Optional[str]:
    """Why the page's ``k`` cannot be used, as the API would say it; None when it can (or is not given)."""
    if k is None or not k.strip():  # an emptied number field: the default
        return None
    try:
        value = int(k)
    except ValueError:
        return f"k: must be a whole number from 1 to {max_k} (got {k!r})"
    return None if 1 <= value <= max_k else f"k: must be from 1 to {max_k} (got {value})"


def page_uncertainty(coverage: Optional[str], max_risk: Optional[str]) -> Optional[UncertaintyRequest]:
    """The page's coverage and max-risk fields (empty: not asked) as a request; a ConfigError naming a bad one."""
    values = []
    for name, raw in (("coverage", coverage), ("max-risk", max_risk)):
        if raw is None or not raw.strip():
            values.append(None)
            continue
        try:
            values.append(float(raw))
        except ValueError:
            raise ConfigError(f"{name} must be a number in (0, 1), got {raw!r}") from None
    wanted = UncertaintyRequest(coverage=values[0], max_risk=values[1])
    return wanted if wanted.active else None


def status_of(exc: DabError) -> int:
    """The HTTP status of a library error: the request's fault (400), the data's (503), or a bug (500)."""
    if isinstance(exc, ConfigError):
        return 400
    return 503 if isinstance(exc, (StoreError, ServiceUnavailableError)) else 500
