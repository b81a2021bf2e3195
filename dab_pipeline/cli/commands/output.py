"""What the commands print: the console, metric tables, byte counts, a run's summary, and one error for every
rank of a torchrun job."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import click

from ...core.errors import DabError
from .. import UserError
from ..progress import cli_console


def console(stderr: bool = False):
    """The console the commands print on: the terminal's width in a terminal; in a log, a pipe or a file 120
    columns with ASCII borders (cli/progress.py's :func:`cli_console`), every table fitted to them."""
    return cli_console(stderr=stderr)


def echo_line(text: str, err: bool = False) -> None:
    """One line of prose on stdout (stderr with ``err``), wrapped between words at the console's width (120
    columns in a log): as click.echo, never read as rich markup or emoji codes (a query's ":smile:" stays text)."""
    console(stderr=err).print(text, markup=False, highlight=False, emoji=False)


def cut_words(text: str, width: int) -> str:
    """``text`` on at most ``width`` columns: whole, or cut at the last word boundary that fits and ended with
    "…" (a single word longer than the width: cut inside it, the "…" still saying so)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = text[: width - 1]
    if text[width - 1] != " " and " " in head:
        head = head[: head.rindex(" ")]
    return head.rstrip(" ,;:") + "…"


def plain(value: Any) -> str:
    """A value as a person reads it in a table or a log line, never a Python repr: None "-", a bool "yes" or "no",
    a list its items joined with ", " (with "; " where an item is a dict), a dict ``key: value`` pairs joined with
    ", ", and an empty list or dict "-"."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {plain(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        sep = "; " if any(isinstance(v, dict) for v in value) else ", "
        return sep.join(plain(v) for v in value) or "-"
    return str(value)


def plain_rows(key: str, value: Any) -> list[tuple[str, str]]:
    """(name, text) rows of a two-column table for ``key``: a non-empty dict one row per entry, named
    ``key.entry`` (nested dicts likewise), so that each reads, and can be grepped, on its own; any other value
    one row, as :func:`plain` writes it."""
    if isinstance(value, dict) and value:
        return [row for k, v in value.items() for row in plain_rows(f"{key}.{k}", v)]
    return [(key, plain(value))]


@contextmanager
def quiet_shared_errors(ctx):
    """An error that every rank raised is printed once, by rank 0, and every rank exits with its code.

    Rank 0 prints *before* the ranks leave together: torchrun stops the whole job
    as soon as one rank ends with an error, which could cut rank 0 short.
    """
    from ...runtime.distributed import is_shared_error  # deferred: `dab --help` must not import torch

    try:
        yield
    except DabError as err:
        if not is_shared_error(err):
            raise
        if ctx.is_main:
            UserError(err).show()
        ctx.barrier()
        raise SystemExit(err.exit_code) from None


def human_bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def echo_run(res) -> None:
    """The run folder and its test numbers, as `dab train` and `dab distill` print them."""
    click.echo(f"run folder: {res.run_dir}")
    if res.test_metrics:
        m = res.test_metrics
        click.echo(
            f"test t2v: R@1 {m['R@1']:.1f}  R@5 {m['R@5']:.1f}  R@10 {m['R@10']:.1f}  "
            f"MdR {m['MdR']:.1f}  MnR {m['MnR']:.1f}  (best epoch {res.best_epoch})"
        )


def v2t_label(res: dict) -> str:
    """The v2t row's name; the stricter per-caption convention says so (the default is the field's)."""
    return "video-to-text (every caption)" if res.get("v2t_convention") == "captions" else "video-to-text"


def metric_table(title: str | None, rows: list[tuple[str, dict]]):
    from rich.table import Table

    cols = ["R@1", "R@5", "R@10", "R@50", "MdR", "MnR", "RSum"]
    t = Table(title=title)
    t.add_column("")
    for c in cols:
        t.add_column(c, justify="right")
    for name, m in rows:
        t.add_row(name, *[("-" if m.get(c) is None else f"{m[c]:.1f}") for c in cols])
    return t


def echo_survey(survey) -> None:
    """`dab extract --dry-run`'s report: the files read, a table of the splits, then the missing videos, duplicate
    and empty queries (the first few of each) and the loader's warnings."""
    from rich.table import Table

    folders: dict[str, list[str]] = {}
    for path in survey.annotation_files:
        folders.setdefault(str(path.parent), []).append(path.name)
    limit = f" (its first {survey.limit} videos)" if survey.limit else ""
    for folder, names in folders.items():
        echo_line(f"{survey.name}{limit}: annotations in {folder}: {', '.join(names)}")
    shown = {k: v for k, v in sorted(survey.options.items()) if k != "warnings"}
    echo_line("options: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    t = Table(title=f"{survey.name}: what `dab extract` would read")
    cols = ("split", "videos", "queries", "captions", "missing", "duplicate queries", "empty queries")
    for col in cols:
        t.add_column(col, justify="left" if col == "split" else "right")
    for s in survey.splits:
        t.add_row(s.split, *map(str, (s.videos, s.queries, s.captions, s.missing, s.duplicates, s.empty)))
    console().print(t)
    for s in survey.splits:
        if s.missing:
            vid, path = s.first_missing[0]
            names = ", ".join(v for v, _ in s.first_missing)
            echo_line(
                f"{s.split}: {_n(s.missing, 'video', 'videos')} missing on disk (first: {names}; looked for {path})"
            )
        if s.duplicates:
            texts = "; ".join(repr(_cut(t)) for t in s.first_duplicates)
            echo_line(
                f"{s.split}: {_n(s.duplicates, 'query repeats', 'queries repeat')} an earlier one (first: {texts})"
            )
        if s.empty:
            echo_line(f"{s.split}: {_n(s.empty, 'empty query', 'empty queries')} (first: {', '.join(s.first_empty)})")
    for w in survey.warnings:
        echo_line(f"warning: {w}")


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _cut(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
