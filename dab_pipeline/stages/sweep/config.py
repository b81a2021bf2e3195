"""What a sweep is given (:class:`SweepConfig`), what it returns (:class:`SweepResult`), and the record of it that
``dab sweep --resume`` reads back (``sweep_plan.json``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ...core.errors import ConfigError
from .plan import SweepPlan, plan_from_dict, refuse_seed_keys

__all__ = ["SweepConfig", "SweepResult", "load_sweep_config", "plan_record", "SWEEP_BACKENDS", "PLAN_FILE"]

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


def plan_record(cfg: SweepConfig) -> dict[str, Any]:
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
