"""evaluating of :mod:`commands` (see the package docstring)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ...core.choices import COST_KINDS, POSTPROCESS, V2T_CONVENTIONS
from ...core.fsutil import atomic_write_text
from ...results.calibration_md import first_k_of, measured_on, probability_tables
from ...results.published import published_line
from .. import cli
from ..progress import RichProgress
from .options import EXISTING, PATH, STORE
from .output import console, metric_table, v2t_label


@cli.command()
@click.option("--run", type=EXISTING, default=None, help="Run folder written by `dab train`.")
@click.option(
    "--costs",
    type=EXISTING,
    default=None,
    help="Any cost/similarity file of the documented layout (h5, zarr, npz, or a bare square .npy with --kind) "
    "instead of a run.",
)
@click.option(
    "--kind",
    "costs_kind",
    type=click.Choice(COST_KINDS),
    default=None,
    help="What --costs holds: cost (lower is better) or similarity (higher is better). Required for a bare .npy "
    "matrix, which cannot say; h5, zarr and npz files record it, and a --kind that disagrees is an error.",
)
@click.option("--features", type=STORE, default=None, help="Store for the neighbourhood diagnostic.")
@click.option("--out", type=PATH, default=None, help="Where to write metrics.json, report.md and plots.")
@click.option(
    "--postprocess",
    type=click.Choice(POSTPROCESS),
    default="none",
    show_default=True,
    help="Optional post-processing: dual softmax (dsl) or inverted softmax (is); labelled in outputs.",
)
@click.option(
    "--temperature",
    "postprocess_temperature",
    type=float,
    default=0.01,
    show_default=True,
    help="Softmax temperature of --postprocess dsl / is (not the model's PAC temperature).",
)
@click.option(
    "--v2t",
    "v2t",
    type=click.Choice(V2T_CONVENTIONS),
    default="videos",
    show_default=True,
    help="Video-to-text with several captions per video: rank the other videos by their best caption "
    "(X-Pool, CLIP4Clip), or every caption of every other video (stricter). Labelled in outputs.",
)
@click.option(
    "--examples",
    type=click.IntRange(min=0),
    default=24,
    show_default=True,
    help="Queries shown in examples.html (thumbnails of what was retrieved, across the margin "
    "range, failures included); 0: no page.",
)
@click.option(
    "--zero-shot",
    is_flag=True,
    help="Score --features' test split with CLIP alone (cosine with the mean of the L2-normalised frame features, "
    "no training) and evaluate that (default --out runs/<store>-zero-shot); where a paper reports this figure for "
    "the store's dataset and CLIP, it is printed beside (docs/reproducing.md).",
)
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print metrics.json to stdout instead of tables.")
def evaluate(
    run,
    costs,
    costs_kind,
    features,
    out,
    postprocess,
    postprocess_temperature,
    v2t,
    examples,
    zero_shot,
    no_plots,
    as_json,
) -> None:
    """Retrieval metrics, uncertainty diagnostics and reports for a run (or any cost file, or CLIP zero-shot)."""
    from ...stages.evaluate import EvaluateConfig, run_evaluate  # deferred: `dab --help` must not import torch

    try:
        cfg = EvaluateConfig(
            run=run,
            costs=costs,
            costs_kind=costs_kind,
            features=features,
            out=out,
            postprocess=postprocess,
            postprocess_temperature=postprocess_temperature,
            v2t=v2t,
            examples=examples,
            plots=not no_plots,
            zero_shot=zero_shot,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    with RichProgress(quiet=True) as prog:
        res = run_evaluate(cfg, progress=prog)
    if as_json:
        click.echo(json.dumps(res, indent=2, default=str))
    else:
        _print_metrics(res)


def _print_metrics(res: dict) -> None:
    """The metrics of `dab evaluate` as tables and lines: retrieval, selective retrieval, the variance, the bridge,
    the neighbourhood diagnostic and the files written."""
    con = console()
    pp = res.get("postprocess", {})
    pp_name = pp.get("label") or pp.get("name", "none") if isinstance(pp, dict) else str(pp)
    # the source on a line of its own, not the table's title: a title folds a long path at the table's width
    con.print(f"{res['source']}  (postprocess: {pp_name})", highlight=False, markup=False)
    con.print(metric_table(None, [("text-to-video", res["t2v"]), (v2t_label(res), res["v2t"])]))
    if res.get("published"):
        con.print(published_line(res["published"]))
    sel = res.get("selective", {})
    for k in ("R@1", "R@5"):
        r = sel.get(k)
        if isinstance(r, dict):
            cov = ", ".join(f"{c} {v:.1f}" for c, v in r.get("at_coverage", {}).items())
            con.print(
                f"selective {k} by {sel.get('confidence', 'margin')}: AURC {r['aurc']:.3f} "
                f"(random {r['aurc_random']:.3f}, optimal {r['aurc_optimal']:.3f}); {k} at coverage {cov}"
            )
    var = res.get("variance")
    if var:
        con.print(
            "mean sigma^2: "
            + ", ".join(
                f"{k} {v:.3f} (x{var['ratio'].get(k, float('nan')):.2f})"
                for k, v in var["mean"].items()
                if v is not None
            )
        )
    bridge = res.get("bridge")
    if bridge:
        from ...results.report import bridge_summary  # deferred: `dab --help` must not import torch

        con.print(bridge_summary(bridge))  # a bridge acting as a constant was warned about on stderr
    nb = res.get("neighbourhood")
    if nb:
        con.print(
            f"semantic positives in top-{nb['k']} (model / random): "
            + ", ".join(f"cosine >= {r['cosine']}: {r['model']:.2f} / {r['random']:.2f}" for r in nb["rows"])
        )
    _print_calibration(con, res.get("calibration"))
    con.print("wrote " + ", ".join(res.get("files", {}).values()))


# The columns of a probability's row (report.md's calibration section has the same, and more).
_PROBABILITY_COLUMNS = (
    ("ECE", "ece"),
    ("ECE (mass)", "ece_mass"),
    ("Brier", "brier"),
    ("log loss", "log_loss"),
    ("AUROC", "auroc"),
    ("mean p", "mean_probability"),
    ("accuracy", "accuracy"),
)


def _figure(x, digits: int = 3) -> str:
    """A figure, or "-" where it is undefined (an AUROC of one-class outcomes) or absent."""
    return "-" if x is None else f"{x:.{digits}f}"


def _print_calibration(con, cal) -> None:
    """A calibrated run's calibration on the test split, in short: P(first hit is a match) against its two
    baselines, and the conformal sets' coverage; report.md has the rest (P(a match in the first k), the groups)."""
    from rich.table import Table

    if not isinstance(cal, dict):
        return
    on = cal.get("calibrated_on") or {}
    gallery = on.get("gallery") or {}
    test = cal.get("test") or {}
    con.print(
        f"calibration (dab calibrate, {cal.get('method')}): fitted on {on.get('queries')} queries of split "
        f"{on.get('split')!r} against {gallery.get('videos')} videos of {gallery.get('split')!r}; measured on "
        f"{measured_on(test)}",
        highlight=False,
        markup=False,
    )
    if cal.get("same_gallery") is False:
        con.print(
            "the test gallery is not the one calibrated on: the coverage asked is not guaranteed here (calibrate on "
            "the gallery you search: dab calibrate --gallery)",
            highlight=False,
            markup=False,
        )
    first = probability_tables(cal).get("first") or {}
    if first:
        t = Table(title="P(the first hit is a match), on the test queries", title_justify="left")
        t.add_column("probability", no_wrap=True)
        for name, _ in _PROBABILITY_COLUMNS:
            t.add_column(name, justify="right")
        for name, row in first.items():
            t.add_row(name, *(_figure((row or {}).get(key)) for _, key in _PROBABILITY_COLUMNS))
        con.print(t)
    sets = cal.get("sets") or {}
    if sets:
        t = Table(title="conformal sets on the test queries (coverage: asked, measured)", title_justify="left")
        for name in ("score", "asked", "measured", "s.e.", "mean size", "median", "90th pct"):
            t.add_column(name, justify="left" if name == "score" else "right", no_wrap=name == "score")
        for score, per in sets.items():
            for asked, row in per.items():
                t.add_row(
                    score,
                    asked,
                    _figure(row.get("coverage")),
                    _figure(row.get("standard_error")),
                    _figure(row.get("size_mean"), 1),
                    _figure(row.get("size_median"), 0),
                    _figure(row.get("size_p90"), 0),
                )
        con.print(t)
    con.print(
        f"more in report.md: P(a match in the first {first_k_of(cal)}), reliability and any groups' coverage",
        highlight=False,
        markup=False,
    )


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=EXISTING)
@click.option("--out", type=PATH, default=None, help="Also write the table as markdown to this file.")
def compare(runs, out) -> None:
    """One table of several evaluated runs (the paper's ablation tables)."""
    from rich.table import Table

    from ...results.compare import (  # deferred: `dab --help` must not import torch
        compare_markdown,
        compare_table,
        load_metrics,
    )

    loaded = [load_metrics(r) for r in runs]  # a missing or damaged metrics.json: one line saying how to remake it
    headers, rows = compare_table(loaded)
    t = Table(title="comparison (text-to-video)")
    for h in headers:  # a run's name too long for the console folds onto more lines, whole; no number is cut
        t.add_column(h, justify="left", overflow="fold") if h == headers[0] else t.add_column(h, justify="right")
    for row in rows:
        t.add_row(*row)
    console().print(t)
    if out:
        atomic_write_text(Path(out), compare_markdown(loaded))
        click.echo(f"wrote {out}")
