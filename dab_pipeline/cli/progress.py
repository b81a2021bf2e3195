"""Render library progress events with rich (the only place rich is used for progress), and the consoles the
commands print on."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column

from ..core.events import Event

# Outside a terminal (a log, a pipe, CI, click's CliRunner) nobody resizes a window: the output is laid out for
# 120 columns, each table fitted to it (rich wraps a cell at its words rather than cut it), and the borders and
# bars are drawn in ASCII. A log viewer or collector that cuts a long line at a byte count then never splits a
# border's multi-byte character into U+FFFD (issue 61, item 5).
LOG_WIDTH = 120


class _LogConsole(Console):
    """A console for a log: rich draws tables and bars in ASCII where the output's encoding is not UTF; this one
    says it is not, whatever the file's encoding (the text itself is still written as it is)."""

    @property
    def encoding(self) -> str:
        return "ascii"


def cli_console(stderr: bool = False) -> Console:
    """The console a command prints on (stderr: its progress and warnings): the terminal's width and box
    characters in a terminal, else :data:`LOG_WIDTH` columns and ASCII borders."""
    con = Console(stderr=stderr)
    if con.is_terminal:
        return con
    return _LogConsole(stderr=stderr, width=LOG_WIDTH)


class _OneLine(TextColumn):
    """A text column that narrows with the line (its column may shrink) but stays on one line, cut with "…"."""

    def render(self, task):  # type: ignore[no-untyped-def]
        text = super().render(task)
        text.no_wrap, text.overflow = True, "ellipsis"
        return text


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class RichProgress:
    """A ProgressCallback that draws one bar per task, with rate and ETA.

    The rate is the task's average since it started (items / elapsed seconds), not
    rich's estimate over the last few updates: work arrives in bursts (prefetched
    decoding batches), and a short window made 9 videos/s read as 500.

    ``quiet=True`` hides bars and info lines; warnings still go to stderr.
    Use as a context manager so the live display is always torn down.
    """

    def __init__(self, quiet: bool = False, console: Console | None = None) -> None:
        self.quiet = quiet
        self.console = console or cli_console(stderr=True)
        # the numbers never shrink (a count cut to `3674/36…` says nothing): where the line is too long for the
        # console, the bar narrows first, then the message beside it is cut with "…"
        fixed = Column(no_wrap=True)
        self._progress = Progress(
            TextColumn("[bold]{task.description}", table_column=fixed),
            BarColumn(table_column=Column()),
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[rate]}", table_column=Column(no_wrap=True)),
            _OneLine("{task.fields[extra]}", table_column=Column()),
            TimeElapsedColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[eta]}", table_column=Column(no_wrap=True)),
            console=self.console,
            disable=quiet,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._started: dict[str, float] = {}
        self.last_metrics: dict[str, Any] = {}

    def __enter__(self) -> "RichProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def __call__(self, event: Event) -> None:
        if event.kind == "start":
            self._tasks[event.task] = self._progress.add_task(
                event.task, total=event.total, rate="", extra=event.message, eta=""
            )
            self._started[event.task] = time.perf_counter()
        elif event.kind == "advance":
            tid = self._tasks.get(event.task)
            if tid is None:
                return
            self._progress.advance(tid, event.n)
            task = self._progress.tasks[tid]
            elapsed = time.perf_counter() - self._started.get(event.task, time.perf_counter())
            speed = task.completed / elapsed if elapsed > 0 else None
            unit = event.data.get("unit", "it")
            fields = {"rate": f"{speed:.1f} {unit}/s" if speed else ""}
            if speed and task.total:
                fields["eta"] = f"eta {_clock(max(0.0, task.total - task.completed) / speed)}"
            if event.message:
                fields["extra"] = event.message
            self._progress.update(tid, **fields)
        elif event.kind == "end":
            tid = self._tasks.pop(event.task, None)
            if tid is not None:
                self._progress.update(tid, extra=event.message or "done", eta="")
        elif event.kind == "metrics":
            self.last_metrics = dict(event.data)
            if not self.quiet and event.message:
                self._progress.console.print(event.message)
        elif event.kind == "info":
            if not self.quiet:
                self._progress.console.print(event.message)
        elif event.kind == "warning":
            self._progress.console.print(f"[yellow]warning:[/] {event.message}")
