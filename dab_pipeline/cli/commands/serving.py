"""`dab serve`: the search page and JSON API (FastAPI + uvicorn, the `serve` extra)."""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path

import click

from ...core.choices import DEFAULT_SCORE_DTYPE, SCORE_DTYPES, SERVE_MAX_K
from .. import cli
from .options import EXISTING, FINITE_FLOAT, STORE, k_option, one_spelling, typed


@cli.command()
@click.option("--run", "run_dir", type=EXISTING, required=True, help="Run folder written by `dab train`.")
@click.option("--features", type=STORE, required=True, help="Feature store whose videos are searched.")
@click.option(
    "--index",
    "index_dir",
    type=EXISTING,
    default=None,
    help="Index folder from `dab index` (large stores: only each query's shortlist is read).",
)
@click.option(
    "--split",
    default="test",
    show_default=True,
    help="Split of the store to search (all: every video, whatever its split).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to listen on (0: any free port, printed when serving).",
)
@k_option(
    "Videos a query returns by default (the HTTP API's k; as `dab search -k`; --topk, its former spelling, also works "
    "with a deprecation line)."
)
@click.option(
    "--shortlist",
    type=click.IntRange(min=1),
    default=None,
    help="Videos re-ranked a query (with --index: default 100; without: every video).",
)
@click.option(
    "--abstain-below",
    type=FINITE_FLOAT,
    default=None,
    help="Flag answers whose margin (2nd - 1st cost) is below this; the page and /search say what "
    "the threshold gave on the run's test split.",
)
@click.option(
    "--descriptions",
    type=EXISTING,
    default=None,
    help="JSON {video_id: text} or CSV (video_id, description) shown beside each hit.",
)
@click.option(
    "--max-batch",
    type=click.IntRange(1, 256),
    default=16,
    show_default=True,
    help="Queries that arrive together are answered in one call, at most this many (1: one at a time).",
)
@click.option(
    "--batch-wait-ms",
    type=click.FloatRange(0, 1000),
    default=5.0,
    show_default=True,
    help="How long a batch waits for more queries after its first arrived (never once --max-batch are waiting).",
)
@click.option(
    "--threads", type=click.IntRange(min=1), default=2, show_default=True, help="CPU threads for the model and FAISS."
)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option(
    "--dtype",
    type=click.Choice(SCORE_DTYPES),
    default=DEFAULT_SCORE_DTYPE,
    show_default=True,
    help="Precision of the re-ranking, the default of `dab search` and of the run's test costs, so a query's "
    "margin is the same number in each (auto: bf16 where the device has it natively, faster, margins "
    "within ~20 %).",
)
@click.option(
    "--ray",
    "on_ray",
    is_flag=True,
    help="Serve on Ray Serve (the ray extra): a deployment per index shard and --replicas re-rank replicas; the "
    "ingress gathers the queries that arrive together with dab serve's own batcher (--max-batch, --batch-wait-ms) "
    "and sends each batch to a re-rank replica as one request; the same API and page (docs/search.md).",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --ray: re-rank replicas, each with the run, the store's CLIP and --threads CPUs.",
)
@click.option(
    "--shard-replicas",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --ray: replicas of each index shard's deployment.",
)
@click.option(
    "--ray-address",
    default=None,
    help="With --ray: a running cluster's address (host:6379, ray://host:10001); default RAY_ADDRESS, else a Ray "
    "started on this machine. Every path must read the same on the cluster's machines.",
)
@click.pass_context
def serve(
    ctx,
    run_dir,
    features,
    index_dir,
    split,
    host,
    port,
    k,
    former_topk,
    shortlist,
    abstain_below,
    descriptions,
    max_batch,
    batch_wait_ms,
    threads,
    device,
    dtype,
    on_ray,
    replicas,
    shard_replicas,
    ray_address,
) -> None:
    """Serve a search page (/) and a JSON API (/search?q=...&k=10) over a run and a store.

    One worker; the run, the store's CLIP and the index are loaded once; queries that arrive together are
    answered in one batch (--max-batch, --batch-wait-ms). With --ray, the same API and page on Ray Serve: each
    index shard a deployment, the re-rank --replicas replicas.
    """
    k = one_spelling(ctx, "k", "-k/--k", "--topk", former_topk)
    if k > SERVE_MAX_K:  # before the port and the loading: a default above what a query may ask answers nothing
        raise click.BadParameter(f"{k} is above {SERVE_MAX_K}, the most a query may ask for", param_hint="'-k'")
    ray_only = [f"--{n.replace('_', '-')}" for n in ("replicas", "shard_replicas", "ray_address") if typed(ctx, n)]
    if ray_only and not on_ray:
        raise click.UsageError(f"{', '.join(ray_only)} needs --ray")
    args = (run_dir, features, index_dir, split, k, shortlist, abstain_below, descriptions, threads, device, dtype)
    if on_ray:
        _serve_on_ray(args, host, port, max_batch, batch_wait_ms, replicas, shard_replicas, ray_address)
    else:
        _serve_here(args, host, port, max_batch, batch_wait_ms)


def _serve_here(args, host, port, max_batch, batch_wait_ms) -> None:
    """``dab serve``: uvicorn, one worker, in this process."""
    run_dir, features, abstain_below = args[0], args[1], args[6]
    try:
        import uvicorn
    except ImportError:
        raise click.ClickException("dab serve needs uvicorn and FastAPI: pip install 'dab-pipeline[serve]'") from None
    from ...stages.serve.address import bind_socket, served_url  # deferred: torch, through the stage

    # the address first: a port in use or not ours is one line at once, not after the run and the index
    sock = bind_socket(host, port)
    try:
        searcher, settings, create_app, abstain_report = _load(*args)
        settings = dataclasses.replace(settings, max_batch=max_batch, batch_wait_ms=batch_wait_ms)
    except BaseException:
        sock.close()
        raise
    try:
        app = create_app(searcher, settings, abstain_report(Path(run_dir), abstain_below))
        sock.listen(2048)
        bound = sock.getsockname()[1]
        click.echo(
            f"serving {searcher.num_videos:,} videos of {features} on {served_url(host, bound)} (Ctrl-C stops)",
            err=True,
        )
        if not _has_module("httptools"):
            click.echo(
                "warning: uvicorn parses HTTP in pure Python here (h11): a few hundred requests a second on 2 cores; "
                "httptools (in the serve extra: pip install 'dab-pipeline[serve]') serves ~6x that",
                err=True,
            )
        server = uvicorn.Server(uvicorn.Config(app, workers=1, log_level="warning"))
        server.run(sockets=[sock])
    finally:
        sock.close()
        searcher.close()


def _serve_on_ray(args, host, port, max_batch, batch_wait_ms, replicas, shard_replicas, address) -> None:
    """``dab serve --ray``: checked here (one line for a bad run, store or index, before any replica starts),
    deployed, served until Ctrl-C, then Serve and the Ray this started shut down."""
    from ...stages.serve import on_ray  # deferred: torch, and Ray (an extra)
    from ...stages.serve.address import bind_socket  # deferred: torch, through the stage

    on_ray.require_ray()
    run_dir, features, index_dir, split, k, shortlist, abstain_below, descriptions, threads, device, dtype = args
    with bind_socket(host, port) as sock:  # the address is free (Ray's proxy binds it): one line now if not
        port = sock.getsockname()[1]
    # the run, the store and the index's shards checked against each other as every replica will, without loading
    # the FAISS indexes (the shard replicas do) or the CLIP (the re-rank replicas do)
    described = on_ray.described_index(index_dir) if index_dir is not None else None
    searcher, settings, _, abstain_report = _load(
        run_dir, features, described, split, k, shortlist, abstain_below, descriptions, 1, device, dtype, encoder=False
    )
    videos = searcher.num_videos
    searcher.close()
    cfg = on_ray.RayServeConfig(
        run_dir=str(Path(run_dir).resolve()),
        features=str(features.resolve()),
        index_dir=str(Path(index_dir).resolve()) if index_dir is not None else None,
        split=split,
        device=device,
        dtype=dtype,
        settings=dataclasses.replace(settings, max_batch=max_batch, batch_wait_ms=batch_wait_ms),
        abstain=abstain_report(Path(run_dir), abstain_below),
        replicas=replicas,
        shard_replicas=shard_replicas,
        threads=threads,
    )
    shards = len(described.shards) if described is not None else 0
    click.echo(f"starting Ray Serve: {replicas} re-rank replica(s), {shards} shard deployment(s)", err=True)
    stop = signal.getsignal(signal.SIGTERM)
    try:
        # SIGTERM as Ctrl-C (the application deleted, the Ray started stopped), set once Ray has set its own
        url = on_ray.deploy(cfg, host, port, address, lambda: signal.signal(signal.SIGTERM, _interrupt))
        click.echo(f"serving {videos:,} videos of {features} on {url} with Ray Serve (Ctrl-C stops)", err=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        on_ray.shutdown()
        signal.signal(signal.SIGTERM, stop)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _load(
    run_dir, features, index_dir, split, k, shortlist, abstain_below, descriptions, threads, device, dtype, encoder=True
):
    """The searcher and the page settings (minutes for a large index), and the app's two builders."""
    from ...search import SearcherOptions, load_descriptions, open_searcher  # deferred: torch, at --help
    from ...stages.serve import ServeSettings, abstain_report, create_app, use_threads  # deferred: FastAPI is an extra

    use_threads(threads)
    about = load_descriptions(descriptions) if descriptions else {}
    settings = ServeSettings(
        k=k,
        shortlist=shortlist,
        abstain_below=abstain_below,
        descriptions=about,
        title=f"dab search: {Path(run_dir).name}",
    )
    searcher = open_searcher(
        SearcherOptions(run_dir, features, split, index_dir, device, dtype),
        warn=lambda message: click.echo(f"warning: {message}", err=True),
        encoder=encoder,
    )
    return searcher, settings, create_app, abstain_report
