"""What a sweep runs: rows (a grid's combinations or named rows) times seeds, from the CLI or a plan file.

A plan is data, like a recipe: a JSON file shipped in ``plans/`` (the paper's Tables 4, 5a and
5b) or a user's own, naming its recipe, its grid or rows, its seeds and its baseline row. The
rows are resolved into TrainConfigs through :func:`~dab_pipeline.stages.train.build_train_config`
before any run starts, so an unknown key, an invalid value or a combination a variant cannot
tell apart is reported first: rows that differ only in fields their variant never reads
(``model.steps`` of xpool) collapse into one, with the reason.

Keys are `dab train --set`'s, and ``variant``, ``cost``, ``steps`` (`dab train`'s option names) are
``model.variant``, ``model.cost``, ``model.steps`` wherever a key is read (a grid, a plan file, --set,
--baseline): a row is named after its values with ``model.`` left out either way (``variant=dab,steps=8``).
A control's name is a variant like the others (``variant=dab-const``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ...core.errors import ConfigError, UnknownNameError
from ...core.overrides import to_dict
from ...core.variants import canonical_key, canonical_values, unused_model_fields
from ...runs.config import TrainConfig
from ...store import open_store
from ..train import build_train_config

__all__ = [
    "PLAN_DIR",
    "SweepPlan",
    "SweepRow",
    "PlannedRun",
    "ResolvedPlan",
    "plan_names",
    "load_plan",
    "grid_plan",
    "plan_from_dict",
    "resolve_plan",
    "row_name",
    "with_choices",
    "SEED_KEYS",
    "refuse_seed_keys",
]

PLAN_DIR = Path(__file__).parent / "plans"
BRIDGE_ONLY_TRAIN_KEYS = ("bridge_lr",)
# The TrainConfig keys the plan's seeds own: resolve_plan sets them on every run, so a value given anywhere
# else (a grid, a row, --set) would be silently overridden (rows seed=1,2,3 all trained with one seed).
# TrainConfig has one seed field and no alias of it; a new one belongs here.
SEED_KEYS = frozenset({"seed"})
PLAN_SEEDS_FIX = 'remove it from the plan and list the seeds in its "seeds" (or pass --seeds {seeds})'


def refuse_seed_keys(values: Mapping[str, Any], where: str, fix: str) -> None:
    """ConfigError for a key of SEED_KEYS in ``values`` (a grid, a row's values, --set): --seeds owns it.

    ``where`` starts the message (``"--grid "``); ``fix`` says what to do instead, ``{seeds}`` being the values given.
    """
    for key, value in values.items():
        if str(key).strip() in SEED_KEYS:
            seeds = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
            raise ConfigError(
                f"{where}{key}={seeds}: {str(key).strip()} is set by --seeds (the plan's seeds); "
                + fix.format(seeds=seeds)
            )


@dataclass(frozen=True)
class SweepRow:
    """One row of the table: a name and the TrainConfig values (dotted keys) that set it apart."""

    name: str
    values: dict[str, Any]


@dataclass(frozen=True)
class SweepPlan:
    name: str
    rows: tuple[SweepRow, ...]
    seeds: tuple[int, ...] = (1, 2, 3)
    recipe: Optional[str] = None
    values: dict[str, Any] = field(default_factory=dict)  # applied to every row, before the row's own
    baseline: Optional[str] = None  # a row name (None: the first row)
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.rows:
            raise ConfigError(f"sweep plan {self.name!r} has no rows")
        names = [r.name for r in self.rows]
        if len(set(names)) != len(names):
            raise ConfigError(f"sweep plan {self.name!r}: row names repeat: {names}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"sweep plan {self.name!r}: seeds must be distinct and at least one, got {self.seeds}")
        # a plan built in Python or read from a file: its shared values and its rows, before any run
        refuse_seed_keys(self.values, f"sweep plan {self.name!r}: set ", PLAN_SEEDS_FIX)
        for row in self.rows:
            refuse_seed_keys(row.values, f"sweep plan {self.name!r}: row {row.name} ", PLAN_SEEDS_FIX)
        if self.baseline is not None and self.baseline not in names:
            raise ConfigError(
                f"sweep plan {self.name!r}: baseline {self.baseline!r} is not a row; rows: {', '.join(names)}"
            )

    @property
    def baseline_row(self) -> str:
        return self.baseline if self.baseline is not None else self.rows[0].name


@dataclass(frozen=True)
class PlannedRun:
    row: str
    seed: int
    config: TrainConfig


def row_name(values: Mapping[str, Any]) -> str:
    """``variant=dab,steps=8``: the grid values of a row, ``model.`` dropped (also its folder's name)."""
    if not values:
        return "default"
    parts = []
    for k, v in values.items():
        shown = Path(v).stem if k == "features" else v
        parts.append(f"{k.removeprefix('model.')}={shown}")
    return ",".join(parts).replace("/", "-")


def _parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2,...")
        name = canonical_key(key)  # variant= is model.variant=
        if name in grid:
            raise ConfigError(f"--grid {name} is given twice" + (f" (as {key.strip()})" if name != key.strip() else ""))
        grid[name] = [v.strip() for v in raw.split(",")]  # typed when the config is built
    return grid


def _expand(grid: Mapping[str, Sequence[Any]]) -> list[SweepRow]:
    keys = list(grid)
    rows = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        values = dict(zip(keys, combo))
        rows.append(SweepRow(row_name(values), values))
    return rows


def grid_plan(
    grid: Sequence[str],
    seeds: Sequence[int] = (1, 2, 3),
    recipe: Optional[str] = None,
    baseline: Optional[str] = None,
    values: Optional[Mapping[str, Any]] = None,
) -> SweepPlan:
    """A plan from ``--grid KEY=V1,V2`` strings (their cartesian product, in the order given).

    ``baseline``: ``KEY=VALUE[,KEY=VALUE]`` picking the first row with those values (None: the first row).
    """
    parsed = _parse_grid(grid)
    refuse_seed_keys(parsed, "--grid ", "remove it from --grid and pass --seeds {seeds}")
    rows = _expand(parsed) if parsed else [SweepRow("default", {})]
    return SweepPlan(
        name="grid",
        rows=tuple(rows),
        seeds=tuple(seeds),
        recipe=recipe,
        values=canonical_values(values or {}),
        baseline=_baseline_row(rows, baseline),
    )


def _baseline_row(rows: Sequence[SweepRow], spec: Optional[str]) -> Optional[str]:
    if spec is None:
        return None
    if any(r.name == spec for r in rows):
        return spec
    want = {canonical_key(k): v.strip() for k, _, v in (p.partition("=") for p in spec.split(","))}
    for r in rows:
        if all(k in r.values and str(r.values[k]) == v for k, v in want.items()):
            return r.name
    raise ConfigError(f"--baseline {spec}: no row has these values; rows: {', '.join(r.name for r in rows)}")


def with_choices(plan: SweepPlan, seeds: Optional[Sequence[int]] = None, baseline: Optional[str] = None) -> SweepPlan:
    """``plan`` with other seeds and another baseline (a row name or ``KEY=VALUE[,...]``); None keeps the plan's."""
    if seeds:
        plan = dataclasses.replace(plan, seeds=tuple(int(s) for s in seeds))
    if baseline:
        plan = dataclasses.replace(plan, baseline=_baseline_row(plan.rows, baseline))
    return plan


def plan_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in PLAN_DIR.glob("*.json")))


def load_plan(name_or_path: str | Path) -> SweepPlan:
    """A shipped plan by name (``paper-table5a``) or a plan file; an unknown name lists the valid ones."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        if str(name_or_path) not in plan_names():
            raise UnknownNameError(
                f"unknown sweep plan {str(name_or_path)!r}; valid: {', '.join(plan_names())} "
                "(or the path of a .json plan)"
            )
        path = PLAN_DIR / f"{name_or_path}.json"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"sweep plan {path}: cannot read it ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"sweep plan {path}: not JSON ({exc})") from None
    return plan_from_dict(data, path.stem)


def plan_from_dict(data: Mapping[str, Any], name: str) -> SweepPlan:
    known = {"_doc", "_source", "recipe", "grid", "rows", "seeds", "set", "baseline"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"sweep plan {name!r}: unknown keys {unknown}; valid: {', '.join(sorted(known))}")
    # the grid before it is expanded: one message naming its values, not one per row it would make
    refuse_seed_keys(data.get("grid") or {}, f"sweep plan {name!r}: grid ", PLAN_SEEDS_FIX)
    grid = data.get("grid") or {}
    keys = [canonical_key(k) for k in grid]  # variant= is model.variant=
    if len(set(keys)) != len(keys):
        raise ConfigError(f"sweep plan {name!r}: grid names a key twice: {', '.join(grid)}")
    rows = _expand(dict(zip(keys, grid.values()))) if grid else []
    rows += [SweepRow(str(r["name"]), canonical_values(r.get("set", {}))) for r in data.get("rows", [])]
    base = data.get("baseline")
    if isinstance(base, Mapping):
        base = _baseline_row(rows, ",".join(f"{k}={v}" for k, v in base.items()))
    return SweepPlan(
        name=name,
        rows=tuple(rows),
        seeds=tuple(data.get("seeds", (1, 2, 3))),
        recipe=data.get("recipe"),
        values=canonical_values(data.get("set", {})),
        baseline=base,
        doc=str(data.get("_doc", "")),
    )


def _canonical(cfg: TrainConfig) -> dict[str, Any]:
    """The config with every field its variant never reads reset, and where it lives left out."""
    model = cfg.model
    defaults = type(model)()
    unused = unused_model_fields(model.variant)
    model = dataclasses.replace(model, **{f: getattr(defaults, f) for f in unused})
    d = to_dict(dataclasses.replace(cfg, model=model))
    if not model.uses_bridge:
        for k in BRIDGE_ONLY_TRAIN_KEYS:
            d.pop(k, None)
    d.pop("out", None)
    return d


@dataclass
class ResolvedPlan:
    runs: list[PlannedRun]
    notes: list[str]  # one per row collapsed into an earlier one, with the reason
    aliases: dict[str, str]  # a collapsed row -> the row that runs for it
    baseline: str

    @property
    def rows(self) -> list[str]:
        return list(dict.fromkeys(r.row for r in self.runs))


def resolve_plan(
    plan: SweepPlan, features: Path, out: Path, overrides: Sequence[str] = (), layout: str = "{row}/seed{seed}"
) -> ResolvedPlan:
    """Every run of the plan, resolved (its folder: ``out / layout``), rows collapsed where runs would repeat.

    Raises ConfigError naming the row for an unknown key or an invalid value, before anything runs.
    """
    with open_store(features):  # a missing or unreadable store fails here, once
        pass
    kept: dict[str, tuple[str, dict]] = {}
    notes: list[str] = []
    runs: list[PlannedRun] = []
    aliases: dict[str, str] = {}
    for row in plan.rows:
        values = canonical_values(plan.values, row.values)  # a plan built in Python may use variant= too
        try:
            cfg = build_train_config(
                values.pop("features", features),
                out / row.name,
                recipe=plan.recipe,
                options=values,
                overrides=overrides,
            )
        except ConfigError as exc:
            raise ConfigError(f"sweep row {row.name}: {exc}") from None
        canon = _canonical(cfg)
        twin = next((name for name, (_, c) in kept.items() if c == canon), None)
        if twin is not None:
            ignored = sorted(
                k
                for k in canonical_values(row.values)
                if k.removeprefix("model.") in unused_model_fields(cfg.model.variant) or k in BRIDGE_ONLY_TRAIN_KEYS
            )
            why = f"{', '.join(ignored)} has no effect on {cfg.model.variant}" if ignored else "the same configuration"
            notes.append(f"row {row.name} is row {twin} ({why}): run once")
            aliases[row.name] = twin
            continue
        kept[row.name] = (row.name, canon)
        for seed in plan.seeds:
            seeded = dataclasses.replace(cfg, seed=int(seed), out=out / layout.format(row=row.name, seed=seed))
            runs.append(PlannedRun(row.name, int(seed), seeded))
    return ResolvedPlan(runs, notes, aliases, aliases.get(plan.baseline_row, plan.baseline_row))
