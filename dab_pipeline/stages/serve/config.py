"""``ServeConfig``: one ``dab serve`` (what it searches, where it listens, what a query gets, which backend runs it),
checked when it is built, before the port is taken or anything loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ...core.choices import DEFAULT_SCORE_DTYPE
from ...core.errors import ConfigError
from ...core.location import StoreURL, location
from ...index import VideoIndex
from ...search import SearcherOptions
from .backends import SERVE_BACKENDS
from .settings import ServeSettings

__all__ = ["ServeConfig", "RAY_ONLY"]

RAY_ONLY = ("replicas", "shard_replicas", "ray_address")  # the ray backend's own options: the default elsewhere


@dataclass(frozen=True)
class ServeConfig:
    """One ``dab serve``: the fields are its options (``backend``: ``local``, uvicorn in this process, or ``ray``,
    Ray Serve over the index's shards with ``replicas`` re-rank replicas; ``dab serve --ray``). Paths may be given
    as strings; ``features`` may be an fsspec URL."""

    run: Path
    features: Path | StoreURL
    index: Optional[Path] = None
    split: str = "test"
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the one taken is in the "serving" event)
    k: int = 10  # videos a query returns unless it asks (the HTTP API's k)
    shortlist: Optional[int] = None  # videos re-ranked a query (with an index: 100; without: every video)
    abstain_below: Optional[float] = None  # answers whose margin is below this are flagged
    descriptions: Optional[Path] = None  # JSON {video_id: text} or CSV, shown beside each hit
    max_batch: int = 16
    batch_wait_ms: float = 5.0
    threads: int = 2
    device: str = "cpu"
    dtype: str = DEFAULT_SCORE_DTYPE
    backend: str = "local"
    replicas: int = 1
    shard_replicas: int = 1
    ray_address: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "run", Path(self.run))
        object.__setattr__(self, "features", location(self.features))
        for name in ("index", "descriptions"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        SERVE_BACKENDS.get(self.backend)  # an unknown name lists the valid ones
        for name in ("port", "threads", "replicas", "shard_replicas"):  # kept as ints: a "8000" from Python too
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
                raise ConfigError(f"{name} must be an integer, got {value!r}")
            object.__setattr__(self, name, int(value))
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be within 0..65535, got {self.port}")
        for name in ("threads", "replicas", "shard_replicas"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        given = [n for n in RAY_ONLY if getattr(self, n) != getattr(ServeConfig, n)]
        if given and self.backend != "ray":
            raise ConfigError(f"backend {self.backend!r} takes no {', '.join(given)} (the ray backend's options)")
        self.settings()  # k, the shortlist, the threshold and the batching, as the server checks them

    def settings(self, descriptions: Optional[dict] = None) -> ServeSettings:
        """What the server answers with; ``descriptions``: the file's texts, once read."""
        return ServeSettings(
            k=self.k,
            shortlist=self.shortlist,
            abstain_below=self.abstain_below,
            descriptions=descriptions or {},
            title=f"dab search: {self.run.name}",
            max_batch=self.max_batch,
            batch_wait_ms=self.batch_wait_ms,
        )

    def searcher_options(self, index: "Path | VideoIndex | None" = None) -> SearcherOptions:
        """The Searcher's options; ``index``: instead of ``self.index`` (the driver of the ray backend opens the
        shards as they describe themselves)."""
        index = self.index if index is None else index
        return SearcherOptions(self.run, self.features, self.split, index, self.device, self.dtype)
