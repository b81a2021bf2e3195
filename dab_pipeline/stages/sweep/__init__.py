"""`dab sweep`: every combination of a grid (or a plan's rows) times seeds on one store, and the table of them.

* ``plan``: rows and seeds from ``--grid`` strings or a plan file (``plans/*.json``: the paper's
  Tables 4, 5a and 5b), resolved into TrainConfigs through the train stage's builder before any
  run starts (unknown keys and invalid values fail first; rows a variant cannot tell apart collapse);
* ``one``: one run as any worker runs it (reuse, resume, train, evaluate; a failure reported, not raised);
* ``local``: ``--jobs N`` worker processes with the cores or GPUs split; ``ray_backend``: Ray tasks;
* ``config``: ``SweepConfig``, ``SweepResult``, the ``sweep_plan.json`` record ``--resume`` reads;
* ``run``: ``run_sweep``, the driver: the sweep folder, the runs, then the table
  (:mod:`dab_pipeline.results.sweep`).
"""

from __future__ import annotations

from .config import SWEEP_BACKENDS, SweepConfig, SweepResult, load_sweep_config  # noqa: F401
from .local import local_executor, threads_per_job  # noqa: F401
from .one import execute_run, run_state  # noqa: F401
from .plan import (  # noqa: F401
    PLAN_DIR,
    PlannedRun,
    ResolvedPlan,
    SweepPlan,
    SweepRow,
    grid_plan,
    load_plan,
    plan_from_dict,
    plan_names,
    resolve_plan,
    row_name,
    with_choices,
)
from .run import run_sweep  # noqa: F401
