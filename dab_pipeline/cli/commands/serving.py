"""`dab serve`: the search page and JSON API (FastAPI + uvicorn, the `serve` extra): the options parsed into a
ServeConfig, run by the stage (stages/serve: run_serve), its lines printed."""

from __future__ import annotations

import click

from ...core.choices import DEFAULT_SCORE_DTYPE, SCORE_DTYPES, SERVE_MAX_K
from ...core.events import Event
from .. import cli
from .options import EXISTING, FINITE_FLOAT, STORE, k_option, one_spelling, typed
from .output import echo_line


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
    from ...stages.serve import ServeConfig, run_serve  # deferred: torch, and FastAPI (an extra)

    cfg = ServeConfig(
        run=run_dir,
        features=features,
        index=index_dir,
        split=split,
        host=host,
        port=port,
        k=k,
        shortlist=shortlist,
        abstain_below=abstain_below,
        descriptions=descriptions,
        max_batch=max_batch,
        batch_wait_ms=batch_wait_ms,
        threads=threads,
        device=device,
        dtype=dtype,
        backend="ray" if on_ray else "local",
        replicas=replicas,
        shard_replicas=shard_replicas,
        ray_address=ray_address,
    )
    run_serve(cfg, progress=_print)


def _print(event: Event) -> None:
    """The server's lines on stderr: where it answers (its URL on the line whole), and its warnings wrapped between
    words at the console's width (120 columns in a log), as `dab search` wraps the same warnings."""
    if event.kind == "warning":
        echo_line(f"warning: {event.message}", err=True)
    else:
        click.echo(event.message, err=True)
