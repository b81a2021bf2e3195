"""What runs ``dab serve``: a backend chosen by name (:data:`SERVE_BACKENDS`) over the same worker, the app of
:func:`~.app.create_app` over a loaded Searcher whose queries are gathered into batches.

* ``local``: uvicorn, one worker, in this process (:class:`LocalBackend`);
* ``ray``: Ray Serve (the ray extra), the index's shards and the re-rank replicas as deployments, the app in the
  ingress (:class:`RayBackend`, :mod:`.on_ray`).

A backend is built from the config and a progress callback and called once; the call serves until Ctrl-C (or
SIGTERM) and returns. Each takes the address first and loads after, so a port in use is one line at once.
"""

from __future__ import annotations

import importlib.util
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from ...core.errors import DabError
from ...core.events import Event, ProgressCallback
from ...core.registry import Registry
from ...search import Searcher, load_descriptions, open_searcher
from . import on_ray
from .address import bind_socket, served_url
from .app import create_app
from .settings import ServeSettings, abstain_report, use_threads

if TYPE_CHECKING:
    from ...index import VideoIndex
    from .config import ServeConfig

__all__ = ["SERVE_BACKENDS", "LocalBackend", "RayBackend", "load_searcher", "has_httptools"]

SERVE_BACKENDS: Registry[Callable[..., Callable[[], None]]] = Registry("serve backend")


def load_searcher(
    cfg: "ServeConfig",
    progress: ProgressCallback,
    threads: int,
    index: "Path | VideoIndex | None" = None,
    encoder: bool = True,
) -> Searcher:
    """The config's Searcher (minutes for a large index) on ``threads`` CPU threads; its warnings as events."""
    use_threads(threads)
    return open_searcher(
        cfg.searcher_options(index), warn=lambda message: progress(Event("warning", message=message)), encoder=encoder
    )


def served_settings(cfg: "ServeConfig") -> ServeSettings:
    """The server's settings, the descriptions file read (one line if it cannot be)."""
    return cfg.settings(load_descriptions(cfg.descriptions) if cfg.descriptions else {})


def has_httptools() -> bool:
    """Whether uvicorn can parse HTTP with httptools (else h11, in pure Python)."""
    return importlib.util.find_spec("httptools") is not None


@SERVE_BACKENDS.register("local")
class LocalBackend:
    """``dab serve``: uvicorn, one worker, in this process."""

    def __init__(self, cfg: "ServeConfig", progress: ProgressCallback) -> None:
        self.cfg, self.progress = cfg, progress

    def __call__(self) -> None:
        cfg = self.cfg
        try:
            import uvicorn
        except ImportError:
            raise DabError("dab serve needs uvicorn and FastAPI: pip install 'dab-pipeline[serve]'") from None
        # the address first: a port in use or not ours is one line at once, not after the run and the index
        sock = bind_socket(cfg.host, cfg.port)
        try:
            settings = served_settings(cfg)
            searcher = load_searcher(cfg, self.progress, cfg.threads)
        except BaseException:
            sock.close()
            raise
        try:
            app = create_app(searcher, settings, abstain_report(cfg.run, cfg.abstain_below))
            sock.listen(2048)
            self._serving(searcher.num_videos, served_url(cfg.host, sock.getsockname()[1]))
            server = uvicorn.Server(uvicorn.Config(app, workers=1, log_level="warning"))
            server.run(sockets=[sock])
        finally:
            sock.close()
            searcher.close()

    def _serving(self, videos: int, url: str) -> None:
        what = f"serving {videos:,} videos of {self.cfg.features} on {url} (Ctrl-C stops)"
        self.progress(Event("info", message=what, data={"url": url, "videos": videos}))
        if not has_httptools():
            self.progress(
                Event(
                    "warning",
                    message="uvicorn parses HTTP in pure Python here (h11): a few hundred requests a second on 2 "
                    "cores; httptools (in the serve extra: pip install 'dab-pipeline[serve]') serves ~6x that",
                )
            )


@SERVE_BACKENDS.register("ray")
class RayBackend:
    """``dab serve --ray``: checked here (one line for a bad run, store or index, before any replica starts),
    deployed, served until Ctrl-C or SIGTERM, then Serve and the Ray this started shut down."""

    def __init__(self, cfg: "ServeConfig", progress: ProgressCallback) -> None:
        self.cfg, self.progress = cfg, progress

    def __call__(self) -> None:
        cfg = self.cfg
        on_ray.require_ray()
        with bind_socket(cfg.host, cfg.port) as sock:  # the address is free (Ray's proxy binds it): one line now if not
            port = sock.getsockname()[1]
        ray_cfg, videos, shards = self._checked()
        what = f"starting Ray Serve: {cfg.replicas} re-rank replica(s), {shards} shard deployment(s)"
        self.progress(Event("info", message=what))
        stop = signal.getsignal(signal.SIGTERM)
        try:
            # SIGTERM as Ctrl-C (the application deleted, the Ray started stopped), set once Ray has set its own
            url = on_ray.deploy(ray_cfg, cfg.host, port, cfg.ray_address, lambda: signal.signal(signal.SIGTERM, _stop))
            what = f"serving {videos:,} videos of {cfg.features} on {url} with Ray Serve (Ctrl-C stops)"
            self.progress(Event("info", message=what, data={"url": url, "videos": videos}))
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            on_ray.shutdown()
            signal.signal(signal.SIGTERM, stop)

    def _checked(self) -> tuple[on_ray.RayServeConfig, int, int]:
        """What every replica loads, the videos served and the shard deployments: the run, the store and the index's
        shards checked against each other as every replica will, without loading the FAISS indexes (the shard
        replicas do) or the CLIP (the re-rank replicas do)."""
        cfg = self.cfg
        described = on_ray.described_index(cfg.index) if cfg.index is not None else None
        settings = served_settings(cfg)
        with load_searcher(cfg, self.progress, 1, index=described, encoder=False) as searcher:
            videos = searcher.num_videos
        ray_cfg = on_ray.RayServeConfig(
            run_dir=str(cfg.run.resolve()),  # paths as every machine of the cluster reads them
            features=str(cfg.features.resolve()),
            index_dir=_resolved(cfg.index),
            split=cfg.split,
            device=cfg.device,
            dtype=cfg.dtype,
            settings=settings,
            abstain=abstain_report(cfg.run, cfg.abstain_below),
            replicas=cfg.replicas,
            shard_replicas=cfg.shard_replicas,
            threads=cfg.threads,
        )
        return ray_cfg, videos, len(described.shards) if described is not None else 0


def _resolved(path: Optional[Path]) -> Optional[str]:
    return str(path.resolve()) if path is not None else None


def _stop(signum, frame) -> None:
    raise KeyboardInterrupt
