"""``--backend ray``: one Ray task per run on an existing cluster (RAY_ADDRESS or --ray-address), or a local one.

The run folders are the contract: a task trains and evaluates its run into its folder (on storage
the driver and the workers share), and the driver only reads the folders. A task that is lost
(a node gone) leaves a folder that the next ``dab sweep --resume`` finishes, from its last
checkpoint. Each task asks Ray for the GPUs of one run (1 where the cluster has GPUs, else 0) and
``cpus_per_run`` CPUs. Ray is an optional extra: ``pip install 'dab-pipeline[ray]'``.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence

from ...core.errors import ConfigError
from ...core.events import Event, ProgressCallback
from ...core.overrides import to_dict
from .one import execute_run
from .plan import PlannedRun

__all__ = ["ray_executor"]


def _ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs Ray: pip install 'dab-pipeline[ray]' (or ray[default])") from None
    return ray


def ray_executor(address: Optional[str] = None, cpus_per_run: int = 1):
    """An executor of the sweep's runs as Ray tasks; ``address`` None: RAY_ADDRESS, else a local instance."""

    def execute(
        runs: Sequence[PlannedRun], examples: int, progress: ProgressCallback
    ) -> Iterator[tuple[PlannedRun, dict[str, Any]]]:
        if not runs:
            return
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        task = ray.remote(num_cpus=cpus_per_run, num_gpus=gpus, max_retries=0)(execute_run)
        progress(Event("info", message=f"Ray: {len(runs)} tasks, {cpus_per_run} CPU and {gpus} GPU each"))
        pending = {task.remote(to_dict(r.config), examples): r for r in runs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                run = pending.pop(ref)
                try:
                    yield run, ray.get(ref)
                except Exception as exc:  # the task or its worker died
                    yield run, {"ok": False, "seconds": 0.0, "error": f"Ray task lost: {exc}"}

    return execute
