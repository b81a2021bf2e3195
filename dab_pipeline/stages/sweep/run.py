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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from ...core.errors import ConfigError
from ...core.events import Event, ProgressCallback, null_progress
from ...core.fsutil import atomic_write_text
from ...core.overrides import to_dict
from ...results.sweep import SWEEP_FILES, collect_run, sweep_table, write_sweep
from .local import local_executor
from .one import execute_run, run_state
from .plan import PlannedRun, ResolvedPlan, SweepPlan, plan_from_dict, refuse_seed_keys, resolve_plan
from .ray_backend import ray_executor

__all__ = ["SweepConfig", "SweepResult", "run_sweep", "load_sweep_config", "SWEEP_BACKENDS"]

SWEEP_BACKENDS = ("local", "ray")
PLAN_FILE = "sweep_plan.json"


@dataclass(frozen=True)
class SweepConfig:
    features: Path
    out: Path
    plan: SweepPlan
    overrides: tuple[str, ...] = ()  # --set, on every run
    jobs: int = 1  # runs at a time on this machine (local backend)
    backend: str = "local"
    ray_address: Optional[str] = None  # None: RAY_ADDRESS, else a local Ray instance
    layout: str = "{row}/seed{seed}"  # a run's folder under out
    evaluate_examples: int = 0  # examples.html of every run (0: none; `dab evaluate --run` writes one later)
    # out is a cache of runs (a benchmark's): a run folder of another configuration is replaced, not refused
    cache: bool = False

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ConfigError(f"jobs must be >= 1, got {self.jobs}")
        if self.backend not in SWEEP_BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(SWEEP_BACKENDS)}, got {self.backend!r}")
        if "{row}" not in self.layout or "{seed}" not in self.layout:
            raise ConfigError(f"layout must name {{row}} and {{seed}}, got {self.layout!r}")
        # --set applies to every run, before resolve_plan sets each run's seed: a seed here would be overridden
        sets = dict(item.split("=", 1) for item in self.overrides if "=" in item)
        refuse_seed_keys(sets, "--set ", "remove it from --set and pass --seeds {seeds}")


@dataclass
class SweepResult:
    out: Path
    table: dict[str, Any]
    done: list[str] = field(default_factory=list)  # run folders finished by this call
    reused: list[str] = field(default_factory=list)  # run folders finished before it
    failed: dict[str, str] = field(default_factory=dict)  # run folder -> why
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed


def _plan_record(cfg: SweepConfig) -> dict[str, Any]:
    return {
        "features": str(cfg.features),
        "overrides": list(cfg.overrides),
        "layout": cfg.layout,
        "plan": {
            "name": cfg.plan.name,
            "doc": cfg.plan.doc,
            "recipe": cfg.plan.recipe,
            "set": cfg.plan.values,
            "seeds": list(cfg.plan.seeds),
            "baseline": cfg.plan.baseline,
            "rows": [{"name": r.name, "set": r.values} for r in cfg.plan.rows],
        },
    }


def load_sweep_config(out: Path, **changes: Any) -> SweepConfig:
    """The SweepConfig a sweep folder records (`dab sweep --resume --out DIR`), with ``changes`` applied."""
    path = Path(out) / PLAN_FILE
    if not path.is_file():
        raise ConfigError(f"{out} holds no sweep ({PLAN_FILE} is missing): nothing to resume")
    rec = json.loads(path.read_text())
    p = rec["plan"]
    plan = plan_from_dict(
        {
            "rows": p["rows"],
            "seeds": p["seeds"],
            "recipe": p["recipe"],
            "set": p["set"],
            "baseline": p["baseline"],
            "_doc": p.get("doc", ""),
        },
        p["name"],
    )
    return SweepConfig(
        features=Path(rec["features"]),
        out=Path(out),
        plan=plan,
        overrides=tuple(rec["overrides"]),
        layout=rec.get("layout", "{row}/seed{seed}"),
        **changes,
    )


def _record_plan(cfg: SweepConfig) -> None:
    """sweep_plan.json: what `--resume` runs. Another plan may use the folder (more seeds, more rows): the runs
    it shares with the last one are reused, and a run folder of another configuration was refused already."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(cfg.out / PLAN_FILE, json.dumps(_plan_record(cfg), indent=2, default=str) + "\n")


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
        return ray_executor(cfg.ray_address)  # imports ray (the optional extra dab[ray]) only now
    if cfg.jobs > 1:
        return local_executor(cfg.jobs)
    return _in_process


__all__ += ["SWEEP_FILES"]
