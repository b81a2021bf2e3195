"""`dab sweep`: every combination of a grid (or a plan) times seeds on one store, and one table of them."""

from __future__ import annotations

import json

import click

from ...core.errors import ConfigError
from .. import cli
from ..progress import RichProgress
from .options import PATH, STORE
from .output import console


def _seeds(option: tuple[str, ...], more: tuple[str, ...]) -> tuple[int, ...] | None:
    """``--seeds 1 2 3`` (click hands the 2 and 3 over as arguments), ``--seeds 1,2,3`` or ``--seeds 1 --seeds 2``."""
    if more and not option:
        raise click.UsageError(f"unexpected argument(s) {' '.join(more)}; seeds go after --seeds")
    raw = [p for item in (*option, *more) for p in str(item).split(",") if p.strip()]
    try:
        return tuple(int(p) for p in raw) if raw else None
    except ValueError:
        raise click.BadParameter(f"expected integers, got {' '.join(raw)}", param_hint="--seeds") from None


@cli.command()
@click.argument("more_seeds", nargs=-1, metavar="")
@click.option("--features", type=STORE, default=None, help="The store every run trains on (not with --resume).")
@click.option("--out", type=PATH, required=True, help="The sweep folder: one run folder per row and seed, the table.")
@click.option(
    "--grid",
    multiple=True,
    metavar="KEY=V1,V2,...",
    help="A TrainConfig key and its values (repeatable: the rows are every combination); variant, cost "
    "and steps are model.variant, model.cost and model.steps, and a variant may be a control "
    "(variant=dab,dab-const).",
)
@click.option(
    "--plan",
    default=None,
    metavar="NAME|FILE",
    help="A shipped plan (paper-table4, paper-table5a, paper-table5b) or a plan file (JSON) instead of --grid.",
)
@click.option(
    "--seeds", "seeds", multiple=True, metavar="N [N ...]", help="Training seeds of every row (default 1 2 3)."
)
@click.option("--recipe", default=None, help="The recipe every run starts from (a plan names its own).")
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a TrainConfig value of every run."
)
@click.option(
    "--baseline",
    default=None,
    metavar="KEY=VALUE[,...]|ROW",
    help="The row the others are compared with (default: the plan's, else the first row).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Runs at a time on this machine, each in its own process with cores // N threads (and one GPU "
    "each where there are GPUs).",
)
@click.option(
    "--backend",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="ray: one Ray task per run on the cluster of RAY_ADDRESS or --ray-address (pip install 'dab-pipeline[ray]').",
)
@click.option("--ray-address", default=None, help="The Ray cluster's address (default: RAY_ADDRESS, else a local one).")
@click.option("--resume", is_flag=True, help="Run what is missing of the sweep in --out, with its recorded plan.")
@click.option("--json", "as_json", is_flag=True, help="Print sweep.json instead of the table.")
@click.option("--quiet", "-q", is_flag=True, help="No progress display (logs only).")
def sweep(
    more_seeds,
    features,
    out,
    grid,
    plan,
    seeds,
    recipe,
    overrides,
    baseline,
    jobs,
    backend,
    ray_address,
    resume,
    as_json,
    quiet,
) -> None:
    """Train and evaluate every row x seed of a grid or plan on one store; a table with bootstrap intervals.

    Every run is an ordinary run folder under --out (dab evaluate, compare and search read it). A
    finished run with the same configuration is reused; a failed one does not stop the others; the
    same command again (or --resume) runs only what is missing. See docs/sweeps.md.
    """
    from ...stages.sweep import (  # deferred: `dab --help` must not import torch
        SweepConfig,
        load_sweep_config,
        run_sweep,
    )

    seed_list = _seeds(seeds, more_seeds)
    if resume:
        if features or grid or plan or seed_list or recipe or overrides or baseline:
            raise ConfigError("--resume continues the sweep recorded in --out: drop the options that define one")
        cfg = load_sweep_config(out, jobs=jobs, backend=backend, ray_address=ray_address)
    else:
        cfg = SweepConfig(
            features=features,
            out=out,
            plan=_sweep_plan(features, grid, plan, seed_list, recipe, baseline),
            overrides=tuple(overrides),
            jobs=jobs,
            backend=backend,
            ray_address=ray_address,
        )
    with RichProgress(quiet=quiet) as prog:
        res = run_sweep(cfg, progress=prog)
    _report(res, out, as_json)


def _sweep_plan(features, grid, plan, seeds, recipe, baseline):
    """The plan of a new sweep: the shipped or saved plan ``plan`` (its seeds and baseline replaced where given), or
    the rows of ``grid`` on ``recipe``."""
    from ...stages.sweep import grid_plan, load_plan, with_choices  # deferred: `dab --help` must not import torch

    if features is None:
        raise click.UsageError("--features STORE is required (or --resume --out DIR)")
    if plan and (grid or recipe):
        raise click.UsageError("--plan brings its own grid and recipe: drop --grid / --recipe")
    if plan:
        return with_choices(load_plan(plan), seeds=seeds, baseline=baseline)
    return grid_plan(grid, seeds=seeds or (1, 2, 3), recipe=recipe, baseline=baseline)


def _report(res, out, as_json: bool) -> None:
    """The sweep's table (or sweep.json with --json); an error, after it, when runs failed."""
    if as_json:
        click.echo(json.dumps(res.table, indent=2, default=float))
    else:
        _print_table(res)
    if res.failed:
        raise click.ClickException(
            f"{len(res.failed)} run(s) failed (listed above); rerun the same command, or "
            f"dab sweep --resume --out {out}, to retry them"
        )


def _print_table(res) -> None:
    """The sweep's table: each cell "mean ± std" on one line where the console is wide enough, else (a log's 120
    columns) the std under the mean, so the table fits without a number cut or split."""
    con = console()
    t = _sweep_table(res, stacked=False)
    if con.measure(t, options=con.options.update_width(1_000_000)).maximum > con.width:  # its natural width
        t = _sweep_table(res, stacked=True)
    con.print(t)
    for note in res.notes:
        con.print(f"note: {note}")
    for key, why in res.failed.items():
        con.print(f"[red]failed[/red] {key}: {why}")
    con.print(
        f"{len(res.done)} run(s) done, {len(res.reused)} reused, {len(res.failed)} failed in "
        f"{res.seconds:.0f} s; wrote {res.out / 'sweep.md'}, sweep.json, sweep.png"
    )


def _sweep_table(res, stacked: bool):
    """The sweep's rows as a rich table (``stacked``: a cell's std on a line under its mean)."""
    from rich.table import Table

    from ...results.sweep import COLUMNS  # deferred: `dab --help` must not import torch

    table = res.table
    shown = [(c, d) for c, _, d in COLUMNS if c not in ("MdR", "v2t R@1")]  # the rest: sweep.md
    t = Table(title=f"{res.out}  (baseline: {table['baseline']})")
    t.add_column("row", overflow="fold")  # a long row name folds onto more lines, whole
    # stacked, the baseline is named in the title only; the difference and its interval stay on one line
    diff_header = "R@1 - baseline" if stacked else f"R@1 - {table['baseline']}"
    for col in ["seeds", *(c for c, _ in shown), diff_header]:
        t.add_column(col, justify="right", no_wrap=col == diff_header)
    for name, row in table["rows"].items():
        cells = []
        for col, digits in shown:
            c = row["columns"][col]
            cells.append(
                "-"
                if c is None
                else (
                    f"{c['mean']:.{digits}f}"
                    + (("\n" if stacked else " ") + f"± {c['std']:.{digits}f}" if len(c["values"]) > 1 else "")
                )
            )
        v = row["vs_baseline"]
        diff = (
            "-"
            if v is None
            else f"{v['diff']:+.1f} [{v['low']:+.1f}, {v['high']:+.1f}]{' *' if v['excludes_zero'] else ''}"
        )
        t.add_row(name, str(len(row["seeds"])), *cells, diff)
    return t
