"""`dab search`: the top-k videos of a store for free-text queries, with a trained run: the options parsed into a
SearchConfig, run by the stage (stages/search.py: run_search, which writes the --html page), the results printed."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ...core.choices import CONFORMAL_SCORES, DEFAULT_CONFORMAL_SCORE, DEFAULT_SCORE_DTYPE, SCORE_DTYPES
from .. import cli
from ..progress import LOG_WIDTH
from .calibrated_answers import uncertainty_lines
from .options import STORE, k_option, one_spelling
from .output import console, cut_words

_EXISTING = click.Path(path_type=Path, exists=True)


@cli.command()
@click.argument("queries", nargs=-1, required=True)
@click.option(
    "--run", "run_dir", type=_EXISTING, required=True, help="Run folder written by `dab train` (its best.pt is used)."
)
@click.option("--features", type=STORE, required=True, help="Feature store whose videos are searched.")
@click.option(
    "--split",
    default="test",
    show_default=True,
    help="Split of the store to search (all: every video, whatever its split).",
)
@k_option(
    "Videos listed per query (as `dab serve -k` and the HTTP API's k; --topk, its former spelling, "
    "still works with a deprecation line)."
)
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option(
    "--dtype",
    type=click.Choice(SCORE_DTYPES),
    default=DEFAULT_SCORE_DTYPE,
    show_default=True,
    help="Precision of the bridge's matrix products (bfloat16: several times faster where the device "
    "multiplies bf16 natively, costs within ~1e-3; float32 with a warning elsewhere; auto: bf16 "
    "where native).",
)
@click.option(
    "--index",
    "index_dir",
    type=_EXISTING,
    default=None,
    help="Index folder from `dab index`: the first stage; only each query's shortlist is read from the "
    "store and re-ranked (large stores).",
)
@click.option(
    "--shortlist",
    type=int,
    default=None,
    help="Videos re-ranked per query: with --index the index's K best (default 100); without, the K best "
    "by a cosine over the split in memory (default: every video).",
)
@click.option("--nprobe", type=int, default=None, help="IVF lists scanned a query (default: the index's).")
@click.option(
    "--coverage",
    type=float,
    default=None,
    help="Also list each query's conformal set: the fewest videos that hold a match with this probability "
    "(e.g. 0.9; on average over queries like the validation ones). Needs `dab calibrate` (docs/uncertainty.md).",
)
@click.option(
    "--conformal-score",
    type=click.Choice(CONFORMAL_SCORES),
    default=DEFAULT_CONFORMAL_SCORE,
    show_default=True,
    help="How the set is built: lac (1 - the softmax probability), aps, raps, normalized (by the model's "
    "text variance).",
)
@click.option(
    "--max-risk",
    type=float,
    default=None,
    help="Answer a query only where its calibrated confidence passes the threshold that keeps the first "
    "hit's error rate among answered queries at most this (e.g. 0.1), with probability 1 - --delta. Needs "
    "`dab calibrate`.",
)
@click.option("--delta", type=float, default=0.05, show_default=True, help="The risk guarantee's failure probability.")
@click.option(
    "--descriptions",
    type=_EXISTING,
    default=None,
    help="JSON {video_id: text} or CSV (video_id, description) shown beside each hit, e.g. the "
    "descriptions.json of a procedural world.",
)
@click.option(
    "--html",
    "html",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a self-contained page with each query's top-k as thumbnails (from the store), "
    "costs, the margin and a plot of its costs over every video.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
def search(
    ctx,
    queries,
    run_dir,
    features,
    split,
    k,
    former_topk,
    device,
    dtype,
    index_dir,
    shortlist,
    nprobe,
    coverage,
    conformal_score,
    max_risk,
    delta,
    descriptions,
    html,
    as_json,
) -> None:
    """Top-k videos of a store for each QUERY, with costs and the top-1/top-2 margin.

    The query is encoded with the store's own CLIP model, so its weights must be
    available here (the open_clip cache or the local file the store recorded).
    """
    k = one_spelling(ctx, "k", "-k/--k", "--topk", former_topk)
    from ...search import load_descriptions  # deferred: `dab --help` must not import torch
    from ...stages.search import SearchConfig, run_search  # deferred: `dab --help` must not import torch

    about = load_descriptions(descriptions) if descriptions else {}  # what the table and the JSON show
    cfg = SearchConfig(
        run=run_dir,
        features=features,
        queries=tuple(queries),
        k=k,
        split=split,
        device=device,
        dtype=dtype,
        shortlist=shortlist,
        index=index_dir,
        nprobe=nprobe,
        coverage=coverage,
        conformal_score=conformal_score,
        max_risk=max_risk,
        delta=delta,
        html=html,
        descriptions=descriptions,
    )
    errors = console(stderr=True)  # a warning wraps between words at the console's width (120 columns in a log)
    # a warning quotes the query: neither markup nor :emoji: codes in it are rendered
    results = run_search(
        cfg, warn=lambda message: errors.print(f"warning: {message}", markup=False, emoji=False, highlight=False)
    )
    if html is not None:
        click.echo(f"wrote {html}", err=True)
    if as_json:
        click.echo(json.dumps(_search_payload(results, about), indent=2))
    else:
        _print_results(results, about)


def _search_payload(results, about: dict) -> list[dict]:
    """The results as `dab search --json` prints them: each query's margin and hits (with descriptions if given)."""
    from ...search import result_payload  # deferred: `dab --help` must not import torch

    return [result_payload(r, about) for r in results]


def _print_results(results, about: dict) -> None:
    """One table per query: its hits' ranks, videos and costs (and descriptions if given), the margin below.

    The query is printed above its table, wrapped between words within 120 columns. The table fits the console
    (120 columns in a log): a description longer than the room left is cut at a word
    boundary and ended with "…" (the whole text is in --json and the --html page)."""
    from rich.table import Table
    from rich.text import Text

    con = console()
    for r in results:
        margin = "n/a (fewer than 2 videos)" if r.margin is None else f"{r.margin:.4g}"
        # the query on lines of its own, not the table's title: a title wraps at the table's width, a long query
        # then over many narrow lines cut inside words (issue 61, item 5)
        # what the user typed, as typed: no markup, no ":smile:" made an emoji
        con.print(r.query, width=min(con.width, LOG_WIDTH), markup=False, emoji=False, highlight=False)
        table = Table()
        rows = [(str(h.rank), h.video_id, f"{h.cost:.4f}") for h in r.hits]
        widths = [max([len(name), *(len(row[i]) for row in rows)]) for i, name in enumerate(("rank", "video", "cost"))]
        table.add_column("rank", justify="right", no_wrap=True)
        table.add_column("video", overflow="fold")  # a long id folds onto more lines, whole
        table.add_column("cost", justify="right", no_wrap=True)
        room = con.width - sum(widths) - 13  # 4 columns: 5 borders, 8 of padding
        if about:
            table.add_column("what the video shows", no_wrap=True)
            room = max(room, len("what the video shows"))
        for row, h in zip(rows, r.hits):
            # Text, not str: a cell's str is read as markup and emoji codes, and ids and descriptions are the user's
            what = [cut_words(about.get(h.video_id, "(no description)"), room)] if about else []
            table.add_row(*(Text(cell) for cell in (*row, *what)))
        con.print(table)
        # a line of its own, not the table's caption: a caption wraps at the table's width, its label apart from
        # its value
        con.print(f"margin (2nd - 1st cost): {margin}", highlight=False)
        for line in uncertainty_lines(r):
            # wrapped at the console's width, between words; the ids and caveats in it printed as written
            con.print(line, highlight=False, markup=False, emoji=False)
