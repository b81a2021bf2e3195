"""``run_serve``: what ``dab serve`` runs, for a Python caller too."""

from __future__ import annotations

from ...core.events import ProgressCallback, null_progress
from .backends import SERVE_BACKENDS
from .config import ServeConfig

__all__ = ["run_serve"]


def run_serve(cfg: ServeConfig, progress: ProgressCallback = null_progress) -> None:
    """Serve the search page (/) and the JSON API (/search, /healthz) over ``cfg``'s run, store and index with its
    backend (``local``: uvicorn in this process; ``ray``: Ray Serve), until Ctrl-C or SIGTERM.

    The address is taken first (a port in use: a one-line :class:`~dab_pipeline.core.errors.DabError` before anything
    loads), then the run, the store and the index; ``progress`` gets an ``info`` event when the server answers (its
    ``data``: the ``url`` and the ``videos`` served) and ``warning`` events (a dtype run in float32, HTTP parsed in
    pure Python)."""
    SERVE_BACKENDS.get(cfg.backend)(cfg, progress)()
