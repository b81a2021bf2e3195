"""``dab serve --ray``: the same HTTP API and page, served by Ray Serve over an index's shards.

Three deployments make one Serve application (``dab``):

* ``shard-000`` ... : one deployment a shard of the index (``dab index --shards N``; a one-folder index is one
  shard), each holding its FAISS index and answering a batch of queries with its candidates and their exact scores
  (:class:`~dab_pipeline.index.served.ShardService`);
* ``rerank``: ``--replicas`` replicas, each with the run, the store and the store's CLIP, answering a batch of
  queries a request: encoded, short-listed (every shard asked at once, merged as one index merges them) and
  re-ranked in one call;
* ``ingress``: the FastAPI app of ``dab serve`` (the same routes, checks, page and calibrated answers), whose
  queries are gathered into batches as ``dab serve`` gathers them (``--max-batch``, ``--batch-wait-ms``; one
  worker a re-rank replica) and sent to ``rerank``, a batch a request: Ray's cost a request (milliseconds of CPU
  on the proxy, the ingress and the replica) is paid once a batch. Why not ``serve.batch``: :class:`RayAnswers`.

A query whose replica dies before it answers (a node lost, a replica killed) is asked again, of another replica,
at most :data:`RETRIES` times with a wait that doubles from :data:`RETRY_WAIT_S` (a search reads and writes
nothing, so asking again is safe); Ray Serve starts a replacement. Ray is an optional extra:
``pip install 'dab-pipeline[ray]'``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from ...core.errors import ConfigError, ServiceUnavailableError
from ...index.served import ServedShardedIndex, ShardService, describe_folders, shard_folders, shard_identity
from ...index.shards import read_plan
from ...search import Searcher, SearcherOptions, open_searcher
from .address import served_url
from .app import create_app
from .batch_runner import run_batch
from .batcher import Batcher
from .health import Health, log
from .settings import ServeSettings, use_threads

__all__ = ["RayServeConfig", "deploy", "described_index", "shutdown", "RETRIES", "RETRY_WAIT_S", "APP_NAME"]

RETRIES = 3  # a query lost with its replica is asked again this many times
RETRY_WAIT_S = 0.2  # before the first retry; doubled before each next one
APP_NAME = "dab"
_OURS: dict = {}  # what deploy started in this process
# a replica that cannot start (a file it cannot read) fails the deployment after this many tries, not Serve's 20
CONSTRUCTOR_RETRIES = 2


@dataclasses.dataclass(frozen=True)
class RayServeConfig:
    """What every replica loads (paths as the cluster's machines read them) and how many of each there are."""

    run_dir: str
    features: str
    index_dir: Optional[str] = None
    split: str = "test"
    device: str = "cpu"
    dtype: str = "float32"
    settings: ServeSettings = ServeSettings()
    abstain: Optional[dict] = None
    replicas: int = 1
    shard_replicas: int = 1
    threads: int = 1
    plan: Optional[dict] = None  # shards.json's, read by the driver: a replica need not see the index folder
    shards: tuple = ()  # each shard's identity as the driver read it: a replica over other files refuses to start

    def __post_init__(self) -> None:
        for name in ("replicas", "shard_replicas", "threads"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")

    def searcher_options(self, index: Optional[ServedShardedIndex]) -> SearcherOptions:
        """A replica's Searcher: its index the shard deployments (None without an index)."""
        return SearcherOptions(self.run_dir, self.features, self.split, index, self.device, self.dtype)


def require_ray():
    """(ray, ray.serve), or a one-line ConfigError naming the extra."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ConfigError("dab serve --ray needs Ray Serve: pip install 'dab-pipeline[ray]'") from None
    if not _late_ingress(serve):
        raise ConfigError(
            f"dab serve --ray needs Ray 2.60 or newer (this is {ray.__version__}): pip install -U 'ray[serve]'"
        )
    return ray, serve


def _late_ingress(serve) -> bool:
    """Whether ``serve.ingress()`` takes the app from the replica (``__serve_build_asgi_app__``), as the ingress
    needs: its app is built over what the replica loaded."""
    import inspect

    try:
        return "__serve_build_asgi_app__" in inspect.getsource(serve.ingress)
    except (OSError, TypeError):  # no source shipped: let the deployment say
        return True


def described_index(index_dir: str | Path) -> ServedShardedIndex:
    """The index as its shards describe themselves, read without their FAISS files: what the driver checks the run
    and the store against (a Searcher over it) before any replica starts; it answers no search."""

    def no_call(method: str, args: dict) -> dict:
        raise AssertionError(f"the driver's checks asked a shard {method!r}")

    return ServedShardedIndex(index_dir, describe_folders(index_dir), no_call)


def _lost() -> tuple[type, ...]:
    """The errors of a request whose replica died or cannot be reached: asked again."""
    from ray.exceptions import RayActorError

    try:
        from ray.serve.exceptions import ReplicaUnavailableError
    except ImportError:  # an older Serve reports a lost replica as RayActorError only
        return (RayActorError,)
    return (RayActorError, ReplicaUnavailableError)


def _cause(exc: BaseException) -> BaseException:
    """A replica's own error as it was raised there (Ray wraps it with the remote traceback in its message)."""
    from ray.exceptions import RayTaskError

    return exc.cause if isinstance(exc, RayTaskError) and isinstance(exc.cause, Exception) else exc


def _asked(call: Callable[[], Any], counter: Optional[Counter] = None) -> Any:
    """``call()`` (a handle's request and its result), asked again where its replica was lost."""
    for attempt in range(RETRIES + 1):
        try:
            return call()
        except _lost() as exc:
            if attempt == RETRIES:
                # not a StoreError: nothing is damaged, and a re-rank replica must not mark itself unhealthy for it
                raise ServiceUnavailableError(
                    f"a replica was lost {RETRIES + 1} times answering ({type(exc).__name__}); try again"
                ) from None
            log.warning("a replica was lost (%s); asking again", type(exc).__name__)
            if counter is not None:
                counter["retried"] += 1
            time.sleep(RETRY_WAIT_S * 2**attempt)
        except Exception as exc:
            raise _cause(exc) from None
    raise AssertionError("unreachable")


def shard_call(handles: list) -> Callable[[str, dict[int, tuple]], dict[int, Any]]:
    """:data:`~dab_pipeline.index.served.ShardCall` over the shard deployments' handles: every shard asked at once."""

    def call(method: str, args: dict[int, tuple]) -> dict[int, Any]:
        sent: dict[int, Any] = {}
        for i, a in args.items():  # every shard asked before any answer is awaited
            try:
                sent[i] = getattr(handles[i], method).remote(*a)
            except _lost():
                sent[i] = None  # asked again below
        out = {}
        for i, response in sent.items():
            first = [response] if response is not None else []  # the request in flight, then new ones

            def one(i=i, first=first):
                r = first.pop() if first else getattr(handles[i], method).remote(*args[i])
                return r.result()

            out[i] = _asked(one)
        return out

    return call


def _searcher(cfg: RayServeConfig, shard_handles: tuple, encoder: bool) -> Searcher:
    """The replica's Searcher, its index the shard deployments; built in a thread of its own, since a replica's
    constructor runs on its event loop, where a request may not wait for its answer."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_new_searcher, cfg, shard_handles, encoder).result()


def _new_searcher(cfg: RayServeConfig, shard_handles: tuple, encoder: bool) -> Searcher:
    index = None
    if shard_handles:
        call = shard_call(list(shard_handles))
        described = call("describe", {i: () for i in range(len(shard_handles))})
        index = ServedShardedIndex(cfg.index_dir, [described[i] for i in range(len(shard_handles))], call, cfg.plan)
    return open_searcher(cfg.searcher_options(index), encoder=encoder)


class ShardReplica(ShardService):
    """A replica of one shard's deployment."""

    def __init__(self, folder: str, threads: int = 1, expect: Optional[dict] = None) -> None:
        use_threads(threads)
        super().__init__(folder, expect)


class RerankReplica:
    """A replica of the re-rank deployment: a Searcher whose index is the shard deployments; a request is a batch
    of queries (the ingress gathered them), answered in one call, each with its result or its own error (returned,
    not raised)."""

    def __init__(self, cfg: RayServeConfig, *shard_handles) -> None:
        use_threads(cfg.threads)
        self.searcher = _searcher(cfg, shard_handles, encoder=True)
        self.health = Health(self.searcher)
        self.shortlist = cfg.settings.shortlist

    async def answer(self, items: list[tuple[str, int]]) -> list:
        try:  # in a thread: the shard requests wait on their results, which an event loop may not
            return await asyncio.to_thread(run_batch, self.searcher, self.health, items, self.shortlist)
        except Exception as exc:  # the batch's (a store read that failed): every query of it says so
            return [exc] * len(items)


class RayAnswers:
    """What answers the ingress's queries: :class:`~.batcher.Batcher` (``dab serve``'s) gathers the queries that
    arrive together (``--max-batch``, ``--batch-wait-ms``) with one worker a re-rank replica, and sends each batch
    to the re-rank deployment as one request, asked again where its replica died.

    Not ``serve.batch``: measured (benchmarks/serve_ray.py, docs/search.md), it forms a batch every
    ``--batch-wait-ms`` whether or not the last one is still running, so under load the queries that arrive while
    a replica works queue as batches of one or two (16 clients, 100k videos: 1.4 a batch, half the throughput);
    this one gathers them while the replicas are busy, as ``dab serve`` does."""

    def __init__(self, handle, cfg: RayServeConfig) -> None:
        self.handle, self.cfg = handle, cfg
        self.counts: Counter = Counter()  # queries retried, and failed (an error for an answer)
        self._lock = threading.Lock()
        s = cfg.settings
        self.batcher = Batcher(self._send, s.max_batch, s.batch_wait_ms / 1000, workers=cfg.replicas)

    async def answer(self, text: str, k: int):
        return await self.batcher.answer(text, k)

    def submit(self, text: str, k: int):
        return self.batcher.submit(text, k)

    def _send(self, items) -> list:
        """One batch to a re-rank replica (in a batcher's worker thread, where a request may wait on its result)."""
        counter: Counter = Counter()
        out = None
        try:
            out = _asked(lambda: self.handle.answer.remote(list(items)).result(), counter)
            return out
        finally:  # a batch that raised failed every query of it
            failed = len(items) if out is None else sum(isinstance(a, Exception) for a in out)
            with self._lock:
                self.counts["retried"] += counter["retried"] * len(items)
                self.counts["failed"] += failed

    def stats(self) -> dict:
        with self._lock:
            counts = {"retried": self.counts["retried"], "failed": self.counts["failed"]}
        return {"engine": "ray serve", "replicas": self.cfg.replicas, "shards": self._shards(), **counts,
                **self.batcher.stats()}  # fmt: skip

    def _shards(self) -> int:
        return len(self.cfg.plan["ranges"]) if self.cfg.plan else (1 if self.cfg.index_dir else 0)

    def close(self) -> None:
        self.batcher.close()


class IngressReplica:
    """The HTTP front: ``dab serve``'s app over a Searcher that reads the page's thumbnails and captions and
    holds the calibration, its queries answered by the re-rank deployment."""

    def __init__(self, cfg: RayServeConfig, rerank, *shard_handles) -> None:
        use_threads(1)
        self.searcher = _searcher(cfg, shard_handles, encoder=False)
        # not ``self.app``: a property of Serve's ASGI wrapper
        self.dab_app = create_app(self.searcher, cfg.settings, cfg.abstain, answers=RayAnswers(rerank, cfg))

    def __serve_build_asgi_app__(self):
        return self.dab_app


def application(cfg: RayServeConfig):
    """The bound Serve application: the shard deployments, the re-rank one and the ingress."""
    _, serve = require_ray()
    folders = shard_folders(cfg.index_dir) if cfg.index_dir else []
    shards = [
        serve.deployment(
            ShardReplica,
            name=f"shard-{i:03d}",
            num_replicas=cfg.shard_replicas,
            max_constructor_retry_count=CONSTRUCTOR_RETRIES,
            ray_actor_options={"num_cpus": 0},
        ).bind(str(folder), cfg.threads, cfg.shards[i] if cfg.shards else None)
        for i, folder in enumerate(folders)
    ]
    gpu = cfg.device.startswith("cuda")  # a GPU a replica, which Ray names cuda:0 inside it
    rerank = serve.deployment(
        RerankReplica,
        name="rerank",
        num_replicas=cfg.replicas,
        # a request is a batch, and a replica runs one at a time (its Searcher answers one at a time): the
        # ingress's workers, one a replica, keep each replica busy without a batch queued behind another
        max_ongoing_requests=1,
        max_constructor_retry_count=CONSTRUCTOR_RETRIES,
        ray_actor_options={"num_cpus": cfg.threads, "num_gpus": 1 if gpu else 0},
    ).bind(dataclasses.replace(cfg, device="cuda") if gpu else cfg, *shards)
    return serve.deployment(
        serve.ingress()(IngressReplica),
        name="ingress",
        max_ongoing_requests=1000,
        max_constructor_retry_count=CONSTRUCTOR_RETRIES,
        ray_actor_options={"num_cpus": 0},
    ).bind(dataclasses.replace(cfg, device="cpu"), rerank, *shards)


def deploy(
    cfg: RayServeConfig,
    host: str,
    port: int,
    address: Optional[str] = None,
    connected: Callable[[], None] = lambda: None,
) -> str:
    """Start Ray (``address``: a cluster's, else RAY_ADDRESS, else a local one) and Serve on ``host:port``, and
    deploy the application; its URL once every replica answers. ``shutdown`` stops them. ``connected`` is called
    once Ray is (the CLI then sets its SIGTERM handler over the one Ray sets)."""
    ray, serve = require_ray()
    if not ray.is_initialized():
        local = address is None and not os.environ.get("RAY_ADDRESS")
        cpus = max(os.cpu_count() or 1, cfg.replicas * cfg.threads) if local else None
        try:
            ray.init(
                address=address,
                num_cpus=cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        except (ValueError, RuntimeError, ConnectionError) as exc:
            where = address or os.environ.get("RAY_ADDRESS") or "this machine"
            raise ConfigError(f"cannot start or reach Ray at {where}: {str(exc).strip().splitlines()[0]}") from None
        _OURS["cluster"] = local  # a Ray this started: shutdown stops it, not only the application
    connected()
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # its progress lines; its warnings still show
    serve.start(http_options={"host": host, "port": port})
    if cfg.index_dir:
        shards = tuple(shard_identity(d) for d in describe_folders(cfg.index_dir))
        cfg = dataclasses.replace(cfg, plan=read_plan(Path(cfg.index_dir)), shards=shards)
    try:
        serve.run(application(cfg), name=APP_NAME, route_prefix="/", blocking=False)
    except RuntimeError as exc:  # a replica failed to start: Serve's message is its traceback
        last = [line for line in str(exc).splitlines() if line.strip()][-1:] or ["(no message)"]
        raise ConfigError(f"the Serve application did not start: {last[0].strip()} (Ray's logs: serve/)") from None
    return served_url(host, port)


def shutdown() -> None:
    """Delete the application; stop Serve and Ray where :func:`deploy` started them (a cluster's other
    applications are left alone), else only disconnect."""
    ray, serve = require_ray()
    if not ray.is_initialized():  # deploy failed before Ray was up: nothing to stop
        return
    try:
        if _OURS.pop("cluster", False):
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
    finally:
        ray.shutdown()
