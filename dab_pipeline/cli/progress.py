"""Render library progress events with rich (the only place rich is used for progress)."""

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

from ..core.events import Event


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
        self.console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[extra]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
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
