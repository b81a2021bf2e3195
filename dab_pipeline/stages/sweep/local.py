"""``--jobs N``: N runs at a time on this machine, each in its own process, with the cores or GPUs split.

Each worker process takes ``cores // N`` CPU threads (torch's intra-op pool and the BLAS
libraries'), and, where there are GPUs, one of them (``CUDA_VISIBLE_DEVICES``, round robin over
the workers): N runs never fight over the same cores or device. Workers are spawned, not
forked (torch's threads and CUDA do not survive a fork), and each takes one run at a time.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Iterator, Optional, Sequence

from ...core.events import Event, ProgressCallback
from ...core.overrides import to_dict
from .one import execute_run
from .plan import PlannedRun

__all__ = ["local_executor", "threads_per_job", "visible_gpus"]


def threads_per_job(jobs: int, cores: Optional[int] = None) -> int:
    """CPU threads each of ``jobs`` concurrent runs gets: the cores split evenly, at least one each."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // jobs)


def visible_gpus() -> list[str]:
    """The GPU ids this process may use (CUDA_VISIBLE_DEVICES, else every device torch sees)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip()]
    import torch  # not imported by the sweep's driver until a GPU is asked about

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def _init_worker(threads: int, slots: "mp.Queue[Optional[str]]") -> None:
    gpu = slots.get()
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    import torch

    torch.set_num_threads(threads)


def _work(config: dict[str, Any], examples: int) -> dict[str, Any]:
    return execute_run(config, examples)


def local_executor(jobs: int):
    """An executor of the sweep's runs: at most ``jobs`` worker processes, results as runs finish."""

    def execute(
        runs: Sequence[PlannedRun], examples: int, progress: ProgressCallback
    ) -> Iterator[tuple[PlannedRun, dict[str, Any]]]:
        if not runs:
            return
        n = min(jobs, len(runs))
        ctx = mp.get_context("spawn")
        slots = ctx.Queue()
        gpus = visible_gpus()
        for i in range(n):
            slots.put(gpus[i % len(gpus)] if gpus else None)
        threads = threads_per_job(n)
        progress(
            Event(
                "info",
                message=f"{n} worker processes, {threads} CPU thread(s) each"
                + (f", GPUs {', '.join(gpus)}" if gpus else ""),
            )
        )
        with ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_worker, initargs=(threads, slots)) as pool:
            pending = {pool.submit(_work, to_dict(r.config), examples): r for r in runs}
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    run = pending.pop(fut)
                    try:
                        yield run, fut.result()
                    except Exception as exc:  # the worker process died (killed, out of memory)
                        yield run, {"ok": False, "seconds": 0.0, "error": f"worker process lost: {exc}"}

    return execute
