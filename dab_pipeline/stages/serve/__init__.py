"""``dab serve``: a search page and a JSON API over a run, a store and (optionally) an index.

:class:`ServeConfig` and :func:`run_serve` are what ``dab serve`` runs: a backend (:data:`SERVE_BACKENDS`:
``local``, uvicorn in this process; ``ray``, Ray Serve) over the app of :func:`create_app`. FastAPI is an optional
extra (``pip install 'dab-pipeline[serve]'``). Everything heavy is loaded once in a :class:`~dab_pipeline.search.Searcher`;
queries that arrive together are answered in one call (:class:`Batcher`: one worker gathers up to
``max_batch`` of them, waiting at most ``batch_wait_ms`` after the first, and runs
``Searcher.search_batch``: their texts encoded in one batch, their shortlists' pairs scored in one call),
each with its own result or error; ``max_batch=1`` answers one query at a time.

* ``GET /search?q=...&k=10`` -> JSON: the hits (rank, video id, cost, description), the
  ``margin`` (2nd minus 1st cost among the re-ranked videos; ``confidence``, its former key, for one release) and
  ``abstain`` (margin below the threshold the user set; with the run's test costs, the
  coverage and precision that threshold gave on the test split).
* ``GET /`` -> the search page (``?q=`` shows results): thumbnails from the store, the
  margin, and the re-ranked costs as a plot. Every user string is escaped (jinja2).
* ``GET /healthz`` -> what is loaded and what the batcher did (batches by size, time busy, time queries
  waited for their batch); 503 with ``ok: false`` and the reason once the store or index changed or a read
  of them failed.

Bad requests get a 4xx with a one-line message (empty, too long, non-printable or non-UTF-8
queries, k out of range, a parameter given twice or one the route does not read), never a 500 with a traceback. The store and index files are checked
before and after every batch (one ``stat`` each): a store truncated, deleted or copied over
under the server, or a read that fails, makes every later answer a 503 naming the file, logged
once, until the server is restarted.
"""

from .address import bind_socket, served_url  # noqa: F401
from .app import create_app  # noqa: F401
from .backends import SERVE_BACKENDS  # noqa: F401
from .batcher import Batcher  # noqa: F401
from .config import ServeConfig  # noqa: F401
from .health import Health, Unavailable  # noqa: F401
from .run import run_serve  # noqa: F401
from .search_page import cost_svg  # noqa: F401
from .settings import ServeSettings, abstain_report, check_query, check_query_string, use_threads  # noqa: F401

__all__ = [
    "ServeConfig",
    "run_serve",
    "SERVE_BACKENDS",
    "Batcher",
    "ServeSettings",
    "Health",
    "Unavailable",
    "abstain_report",
    "create_app",
    "cost_svg",
    "check_query",
    "check_query_string",
    "use_threads",
    "bind_socket",
    "served_url",
]
