"""`dab calibrate`: probabilities of a match, conformal sets and a risk threshold for a run (docs/uncertainty.md)."""

from __future__ import annotations

import json

import click

from ...core.choices import CALIBRATION_METHODS, DEFAULT_CALIBRATION_METHOD
from .. import cli
from ..progress import RichProgress
from .options import EXISTING, STORE
from .output import console


@cli.command()
@click.option("--run", "run_dir", type=EXISTING, required=True, help="Run folder written by `dab train`.")
@click.option("--features", type=STORE, default=None, help="Feature store (default: the run's own).")
@click.option(
    "--split",
    default=None,
    help="Split whose captions are the calibration queries (default: the run's validation split; never one "
    "it trained on).",
)
@click.option(
    "--gallery",
    default=None,
    help="Split whose videos they are searched in (default: the same split; all: every video of the store, "
    "for `dab search --split all`). The guarantees hold for this gallery.",
)
@click.option(
    "--method",
    type=click.Choice(CALIBRATION_METHODS),
    default=DEFAULT_CALIBRATION_METHOD,
    show_default=True,
    help="auto: each probability's map of least cross-validated log loss on the fitted half (by video); logistic: "
    "a logistic regression over every uncertainty feature; isotonic: of the margin; temperature: the softmax "
    "rescaled; softmax: the raw softmax, nothing fitted.",
)
@click.option(
    "-k", "--first-k", "first_k", type=int, default=5, show_default=True, help="The k of P(a match in the first k)."
)
@click.option(
    "--k0",
    type=int,
    default=20,
    show_default=True,
    help="The first costs every probability reads: a search whose shortlist holds these K0 videos gives the "
    "probabilities of a search of every video.",
)
@click.option(
    "--groups",
    default=None,
    metavar="KIND:B[,KIND:B]",
    help="Hold the coverage within groups, not only on average: uncertainty:3 (three bands of the model's own "
    "uncertainty, Mondrian), uncertainty:3,length:2 (and caption length, overlapping: conditional conformal).",
)
@click.option(
    "--index",
    "index_dir",
    type=EXISTING,
    default=None,
    help="Calibrate the whole pipeline: score the queries as a search through this `dab index` of the gallery does "
    "(a match its shortlist misses is outside every set); searches must then use it, with the same --shortlist "
    "and --nprobe.",
)
@click.option("--shortlist", type=int, default=None, help="With --index: the K videos re-ranked a query (default 100).")
@click.option("--nprobe", type=int, default=None, help="With --index: IVF lists probed (default: the index's own).")
@click.option(
    "--coverage",
    type=float,
    default=None,
    help="With --index and no --shortlist: choose the smallest shortlist (of 20, 50, 100, 200, 500, ...) whose first "
    "stage misses at most half of 1 - coverage on the fitted half's videos; the quantiles from the held-out half.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Of the split into fitted and held-out videos.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--json", "as_json", is_flag=True, help="Print calibration.json's figures as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def calibrate(
    run_dir,
    features,
    split,
    gallery,
    method,
    first_k,
    k0,
    groups,
    index_dir,
    shortlist,
    nprobe,
    coverage,
    seed,
    device,
    as_json,
    quiet,
) -> None:
    """Calibrate a run on its validation queries: writes RUN/calibration.json.

    The videos are split in two, each video's captions together (the video is the unit): one half fits the
    probability maps (and the band edges), the other is held out: the figures printed are its own. `dab search --coverage` and `--max-risk` (and `dab serve`, the Python API) read the file.
    """
    from ...stages.calibrate import (  # deferred: `dab --help` must not import torch
        CalibrateConfig,
        describe_groups,
        run_calibrate,
    )

    cfg = CalibrateConfig(
        run=run_dir,
        features=features,
        split=split,
        gallery=gallery,
        method=method,
        first_k=first_k,
        k0=k0,
        seed=seed,
        device=device,
        groups=groups,
        index=index_dir,
        shortlist=shortlist,
        nprobe=nprobe,
        coverage=coverage,
    )
    with RichProgress(quiet=quiet or as_json) as prog:
        cal = run_calibrate(cfg, progress=prog)
    if as_json:
        click.echo(json.dumps({"report": cal.report, "provenance": cal.provenance}, indent=2))
        return
    _print_report(cal, describe_groups(cal))
    click.echo(f"wrote {run_dir / 'calibration.json'}")


def _print_report(cal, group_lines: list[str]) -> None:
    """The held-out figures, one table a target: each probability's ECE, Brier, log loss and AUROC."""
    from rich.table import Table

    g = cal.gallery
    con = console()
    con.print(
        f"{cal.queries} queries of {cal.videos} videos of split {cal.provenance.get('split')!r} against "
        f"{g.get('videos')} videos of {g.get('split')!r}: {cal.fit_queries} fitted ({cal.method}), "
        f"{cal.check_queries} held out, split by video"
    )
    for line in group_lines:
        con.print(line)
    through = cal.provenance.get("index")
    if through:
        missed = sum(x is None for x in next(iter(cal.conformal.values())))
        con.print(
            f"through {through['path']} at shortlist {through['shortlist']}, nprobe {through['nprobe']}: the first "
            f"stage missed the match of {missed} of {cal.queries} queries (outside every set)"
        )
        chosen = through.get("chosen_for")
        if chosen:
            shares = ", ".join(f"K={k}: {m:.3f}" for k, m in chosen["miss_share"].items())
            con.print(
                f"shortlist {through['shortlist']} chosen for coverage {chosen['coverage']:g} (fitted half's miss share: "
                f"{shares}); {chosen['re_ranks_saved']:.0%} of the re-ranks of an exhaustive search saved"
            )
    titles = {"first": "P(the first hit is a match)", "first_k": f"P(a match in the first {cal.first_k})"}
    for target, sel in cal.report.get("selection", {}).items():
        losses = ", ".join(f"{kind} {v:.3f}" for kind, v in sel["cv_log_loss"].items())
        why = f" (cross-validated log loss on the fitted half, by video: {losses})" if losses else " (asked for)"
        con.print(f"{titles[target]}: map {sel['chosen']}{why}")
    for target in ("first", "first_k"):
        rows = cal.report[target]
        table = Table(title=f"{titles[target]}, on the held-out queries", title_justify="left")
        for col in ("probability", "ECE", "ECE (mass)", "Brier", "log loss", "AUROC", "mean p", "accuracy"):
            table.add_column(col, justify="left" if col == "probability" else "right")
        for name, r in rows.items():
            table.add_row(
                name,
                *(
                    "-" if r[key] is None else f"{r[key]:.3f}"
                    for key in ("ece", "ece_mass", "brier", "log_loss", "auroc", "mean_probability")
                ),
                f"{r['accuracy']:.3f}",
            )
        con.print(table)
    for line in top_bin_lines(cal.report.get("top_bins", {})):
        con.print(line)


def top_bin_lines(bins: dict) -> list[str]:
    """Reliability where P(first) >= 0.5, per bin of >= 100 held-out queries: mean p against the observed rate."""
    if not any(bins.values()):
        return ["P(first) >= 0.5 on fewer than 100 held-out queries: no top-bin reliability to report"]
    lines = ["P(first) >= 0.5, bins of >= 100 held-out queries: mean p / observed [95 % interval]"]
    for name, rows in bins.items():
        cells = [
            f"{r['mean_p']:.2f} / {r['observed']:.2f} [{r['interval'][0]:.2f}, {r['interval'][1]:.2f}]" for r in rows
        ]
        lines.append(f"  {name}: " + ("; ".join(cells) or "-"))
    return lines
