"""run_sweep: every run of a plan (train, then evaluate), reused when done, one failure never stopping the rest.

The run folders are the contract between the driver and whoever runs a run (this process,
local worker processes, Ray tasks): a run writes only its own folder; the driver decides what
is done by reading them (status.json ``complete``, metrics.json, a config.json equal to the
planned one) and builds the table from them. Killing a sweep loses at most the runs in
flight, and those resume from their last checkpoint like any `dab train --resume`.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterator, Sequence

from ...core.events import Event, ProgressCallback, null_progress
from ...core.fsutil import atomic_write_text
from ...core.overrides import to_dict
from ...results.sweep import SWEEP_FILES, collect_run, sweep_table, write_sweep
from .config import PLAN_FILE, SweepConfig, SweepResult, plan_record
from .local import local_executor
from .one import execute_run, run_state
from .plan import PlannedRun, ResolvedPlan, resolve_plan
from .ray_backend import ray_executor

__all__ = ["run_sweep"]


def _record_plan(cfg: SweepConfig) -> None:
    """sweep_plan.json: what `--resume` runs. Another plan may use the folder (more seeds, more rows): the runs
    it shares with the last one are reused, and a run folder of another configuration was refused already."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(cfg.out / PLAN_FILE, json.dumps(plan_record(cfg), indent=2, default=str) + "\n")


Executor = Callable[[Sequence[PlannedRun], int, ProgressCallback], Iterator[tuple[PlannedRun, dict[str, Any]]]]


def _in_process(
    runs: Sequence[PlannedRun], examples: int, progress: ProgressCallback
) -> Iterator[tuple[PlannedRun, dict[str, Any]]]:
    for run in runs:
        yield run, execute_run(to_dict(run.config), examples, _run_progress(run, progress))


def _run_progress(run: PlannedRun, progress: ProgressCallback) -> ProgressCallback:
    """A run's events as the sweep shows them: its epochs on the sweep's line, its warnings; not its own bars."""

    def forward(event: Event) -> None:
        if event.kind == "metrics" and "epoch" in event.data:
            progress(
                Event(
                    "advance",
                    task="sweep",
                    n=0,
                    data={"epoch": event.data["epoch"], "run": str(run.config.out)},
                    message=f"{run.row} seed {run.seed}: epoch {event.data['epoch']}/{run.config.epochs}",
                )
            )
        elif event.kind == "warning":
            progress(event)

    return forward


def run_sweep(cfg: SweepConfig, progress: ProgressCallback = null_progress) -> SweepResult:
    """Run every missing run of the plan, then write sweep.json / sweep.md / sweep.png from all of them."""
    t0 = time.perf_counter()
    plan = resolve_plan(cfg.plan, cfg.features, cfg.out, cfg.overrides, cfg.layout)
    states = {str(r.config.out): run_state(r, replace=cfg.cache) for r in plan.runs}  # a foreign run: refused now
    _record_plan(cfg)
    for note in plan.notes:
        progress(Event("info", message=note))
    res = SweepResult(out=cfg.out, table={}, notes=list(plan.notes))
    todo = [r for r in plan.runs if states[str(r.config.out)] != "done"]
    res.reused = [k for k, s in states.items() if s == "done"]
    parallel = 1 if cfg.backend == "local" and cfg.jobs == 1 else (cfg.jobs if cfg.backend == "local" else len(todo))
    progress(
        Event(
            "start",
            task="sweep",
            total=len(todo),
            message=f"{len(res.reused)} reused, {min(parallel, len(todo))} running",
        )
    )
    for run, outcome in _executor(cfg)(todo, cfg.evaluate_examples, progress):
        key = str(run.config.out)
        if outcome["ok"]:
            res.done.append(key)
        else:
            res.failed[key] = outcome["error"]
            progress(Event("warning", message=f"{key} failed: {outcome['error']}"))
        left = len(todo) - len(res.done) - len(res.failed)
        progress(
            Event(
                "advance",
                task="sweep",
                n=1,
                data={"unit": "runs"},
                message=f"{len(res.done)} done, {min(parallel, left)} running, {len(res.failed)} failed",
            )
        )
    progress(Event("end", task="sweep"))
    rows = _collect(plan)
    for note in _supersede_failures(res.failed, plan, rows):
        progress(Event("info", message=note))
        res.notes.append(note)
    res.table = sweep_table(rows, plan.baseline, notes=res.notes, failed=res.failed)
    write_sweep(cfg.out, res.table)
    res.seconds = time.perf_counter() - t0
    return res


def _collect(plan: ResolvedPlan) -> dict[str, dict[int, dict[str, Any]]]:
    """Every finished run's metrics and per-query hits, by row and seed (runs that failed are left out)."""
    rows: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in plan.rows}
    for run in plan.runs:
        got = collect_run(run.config.out)
        if got is not None:
            rows[run.row][run.seed] = got
    return rows


def _supersede_failures(
    failed: dict[str, str], plan: ResolvedPlan, rows: dict[str, dict[int, dict[str, Any]]]
) -> list[str]:
    """Drop from ``failed`` every run that has a finished result now; a note for each.

    A failure is recorded when the run is tried, the table when the sweep ends: in between another sweep
    into the same --out may finish the run (this one was locked out of it while the other trained it), or
    the run was finished and evaluated before a later step failed. Listed under failures it would also be
    in the table, with its numbers; the note keeps what went wrong in this sweep.
    """
    notes = []
    for run in plan.runs:
        key = str(run.config.out)
        if key in failed and run.seed in rows.get(run.row, {}):
            notes.append(
                f"{key} failed in this sweep ({failed.pop(key)}) but is finished and evaluated now "
                "(by another sweep into the same --out, or before the error): counted as finished"
            )
    return notes


def _executor(cfg: SweepConfig) -> Executor:
    if cfg.backend == "ray":
        return ray_executor(cfg.ray_address)  # imports ray (the optional extra dab-pipeline[ray]) only now
    if cfg.jobs > 1:
        return local_executor(cfg.jobs)
    return _in_process


__all__ += ["SWEEP_FILES"]
