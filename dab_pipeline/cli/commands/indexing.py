"""`dab index`: a FAISS first stage for `dab search --index` and `dab serve`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .. import cli
from ..progress import RichProgress
from .options import EXISTING, STORE


@cli.command()
@click.option("--features", type=STORE, required=True, help="Feature store whose videos are indexed.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Index folder to write.")
@click.option(
    "--run",
    type=EXISTING,
    default=None,
    help="Run folder the index serves (required by --vector pooled; recorded always).",
)
@click.option(
    "--split",
    default="test",
    show_default=True,
    help="Split of the store to index (all: every video, whatever its split).",
)
@click.option(
    "--vector",
    default="segments",
    show_default=True,  # = index.DEFAULT_VECTOR (a test checks)
    help="What the index holds: segments (4 vectors a video, the meanP of consecutive frame runs; the "
    "best counts), meanp (mean of the L2-normalised frames), mean, pooled (the run's pooling with "
    "the mean caption as query). docs/search.md measures them.",
)
@click.option(
    "--factory",
    default="auto",
    show_default=True,
    help="FAISS factory string (Flat, IVF4096,PQ64, HNSW32, ...); auto: Flat up to 262,144 vectors, "
    "IVF(~2 sqrt N),PQ(D/8) above.",
)
@click.option("--nprobe", type=int, default=32, show_default=True, help="IVF lists scanned a query (default).")
@click.option("--ef-search", type=int, default=64, show_default=True, help="HNSW search breadth (default).")
@click.option(
    "--refine",
    type=int,
    default=4,
    show_default=True,
    help="Quantised factories (PQ, SQ): keep the exact vectors (float16, on disk) and re-score this many "
    "x K x S candidates a query (at most 4,096 unless K x S is more); 0: the codes alone.",
)
@click.option(
    "--video-terms",
    is_flag=True,
    help="Also keep the run's token-branch term of each video (float16, D values a video, needs --run): a "
    "search with that run re-ranks without computing them (docs/search.md).",
)
@click.option("--chunk", type=int, default=4096, show_default=True, help="Videos read from the store at a time.")
@click.option(
    "--shards",
    type=int,
    default=1,
    show_default=True,
    help="Cut the split's videos into this many contiguous ranges, an index over each (trained once, together), "
    "searched as one index would be (docs/search.md).",
)
@click.option(
    "--shard",
    type=int,
    default=None,
    help="Build only this shard (0-based) of --shards: each builds on its own, on any machine that reads the store.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing index folder.")
@click.option("--json", "as_json", is_flag=True, help="Print index.json to stdout.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def index(
    features,
    out,
    run,
    split,
    vector,
    factory,
    nprobe,
    ef_search,
    refine,
    video_terms,
    chunk,
    shards,
    shard,
    overwrite,
    as_json,
    quiet,
) -> None:
    """Build a FAISS index over one vector per video of a store's split.

    A stopped build resumes from its last chunk when run again with the same arguments.
    """
    from ...stages.index import IndexConfig, run_index  # deferred: `dab --help` must not import torch

    cfg = IndexConfig(
        features=features,
        out=out,
        run=run,
        split=split,
        vector=vector,
        factory=factory,
        chunk=chunk,
        nprobe=nprobe,
        ef_search=ef_search,
        refine=refine,
        video_terms=video_terms,
        overwrite=overwrite,
        shards=shards,
        shard=shard,
    )
    with RichProgress(quiet=quiet or as_json) as prog:
        meta = run_index(cfg, progress=prog)
    if as_json:
        click.echo(json.dumps(meta.to_json(), indent=2))
        return
    what = f" (shard {shard} of {shards})" if shard is not None else f" in {shards} shards" if shards > 1 else ""
    click.echo(
        f"wrote {out}{what}: {meta.count:,} videos of split {meta.split!r}, vector {meta.vector}, "
        f"factory {meta.factory}, {meta.build['seconds']:.1f} s"
    )
