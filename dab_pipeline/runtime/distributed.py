"""torch.distributed plumbing for ``dab extract`` and ``dab train`` under ``torchrun``.

The launcher is PyTorch's own: ``torchrun`` starts the processes and sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT``; :func:`distributed_session` reads them, binds each rank to
its device (``cuda:LOCAL_RANK`` or the CPU) and initialises the default process
group (``nccl`` on CUDA, ``gloo`` on CPU, unless told otherwise).

:class:`DistContext` carries the rank and a few collectives the stages need:

* control flow that must agree on every rank: :meth:`~DistContext.run_on_main`
  (rank 0 does it, every rank gets the result or raises the same error),
  :meth:`~DistContext.main_first` (rank 0 first, e.g. populating a weights
  cache, then the others) and :meth:`~DistContext.agree` (every rank does it;
  if any failed, every rank raises the lowest rank's error). Without them a
  rank that raises leaves the others blocked in their next collective until
  torchrun tears the group down, and the user sees a wall of tracebacks instead
  of one message;
* :func:`all_gather_with_grad`: the contrastive batch gather, differentiable;
* :meth:`~DistContext.gather_rows`: uneven row blocks (validation scoring).

Library code: no click, no rich. See docs/distributed.md.
"""

from __future__ import annotations

import datetime as _dt
import os
import pickle
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from ..core.errors import ConfigError

__all__ = [
    "TORCHRUN_ENV",
    "DistContext",
    "launched_by_torchrun",
    "want_distributed",
    "device_for_rank",
    "init_distributed",
    "distributed_session",
    "all_gather_with_grad",
    "shard_range",
    "part_path",
    "part_files",
    "is_shared_error",
    "mark_shared",
]

T = TypeVar("T")

# What torchrun (torch.distributed.run) exports to every worker.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

# Marks an exception that every rank raises (the CLI prints it once, on rank 0).
_SHARED_ATTR = "dab_raised_on_every_rank"


def launched_by_torchrun() -> bool:
    """True when the torchrun environment variables are all set."""
    return all(k in os.environ for k in TORCHRUN_ENV)


def want_distributed(flag: Optional[bool]) -> bool:
    """Resolve ``--distributed/--no-distributed`` (None: automatic, on under torchrun)."""
    launched = launched_by_torchrun()
    if flag is None:
        return launched
    if flag and not launched:
        missing = ", ".join(k for k in TORCHRUN_ENV if k not in os.environ)
        raise ConfigError(
            f"--distributed needs the environment torchrun sets ({missing} missing); launch with "
            "`torchrun --nproc-per-node N -m dab_pipeline.cli ...`"
        )
    if not flag and launched and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            f"--no-distributed under torchrun with WORLD_SIZE={os.environ['WORLD_SIZE']} would run "
            f"{os.environ['WORLD_SIZE']} independent copies writing the same output; drop --no-distributed "
            "or launch a single process"
        )
    return bool(flag)


def is_shared_error(exc: BaseException) -> bool:
    """True for an error that every rank raised (so rank 0 alone needs to report it)."""
    return bool(getattr(exc, _SHARED_ATTR, False))


def mark_shared(exc: BaseException) -> BaseException:
    """Mark ``exc`` as raised on every rank (see :func:`is_shared_error`); returns it."""
    try:
        setattr(exc, _SHARED_ATTR, True)
    except AttributeError:  # exceptions with __slots__; nothing to mark then
        pass
    return exc


def _portable(exc: BaseException) -> BaseException:
    """The exception itself when it pickles (typed errors survive the trip), else a RuntimeError."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _env_int(name: str, default: Optional[int] = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise ConfigError(f"{name} is not set: run under torchrun (it sets {', '.join(TORCHRUN_ENV)})")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def device_for_rank(device: str, local_rank: int, local_world_size: int) -> torch.device:
    """The device of one rank: ``auto``/``cuda`` -> ``cuda:LOCAL_RANK`` (when CUDA exists), ``cpu`` -> CPU.

    An explicit ``cuda:N`` is only accepted with one rank per node: several
    ranks on one GPU would make NCCL fail ("duplicate GPU") or oversubscribe it.
    """
    if device == "cpu":
        return torch.device("cpu")
    if device in ("auto", "cuda"):
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            if local_rank >= n:
                raise ConfigError(
                    f"LOCAL_RANK {local_rank} has no GPU: this node has {n}; use --nproc-per-node {n} or fewer"
                )
            return torch.device("cuda", local_rank)
        if device == "cuda":
            raise ConfigError("device 'cuda' requested but CUDA is not available here")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device {device!r} is not a torch device (cpu, cuda, cuda:1, auto)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} requested but CUDA is not available here")
        if local_world_size > 1:
            raise ConfigError(
                f"device {device!r} names one GPU but torchrun starts {local_world_size} processes on this node; "
                "use --device auto (each rank takes cuda:LOCAL_RANK)"
            )
    return dev


@dataclass
class DistContext:
    """One rank of a torchrun job (the default process group is initialised)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- collectives on Python objects ------------------------------------------

    def _object_device(self) -> Optional[torch.device]:
        # NCCL moves pickled objects through GPU memory: name the rank's GPU.
        return self.device if self.backend == "nccl" else None

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """``obj`` of rank ``src`` on every rank."""
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, device=self._object_device())
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    # -- control flow that agrees across ranks ---------------------------------

    def run_on_main(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on rank 0 only; every rank returns its result or raises its error.

        The result must pickle (it is broadcast). Every rank waits for rank 0.
        """
        outcome: tuple[bool, Any] = (True, None)
        if self.is_main:
            try:
                outcome = (True, fn())
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                outcome = (False, _portable(exc))
        ok, value = self.broadcast_object(outcome)
        if not ok:
            raise mark_shared(value)
        return value

    def main_first(self, fn: Callable[[], T]) -> T:
        """Rank 0 runs ``fn`` first (e.g. filling a download cache), then the other ranks.

        Rank 0's error is raised on every rank; the others' results are their own.
        """
        if self.is_main:
            try:
                result = fn()
            except Exception as exc:  # noqa: BLE001
                self.broadcast_object((False, _portable(exc)))
                raise mark_shared(exc)
            self.broadcast_object((True, None))
            return result
        ok, err = self.broadcast_object(None)
        if not ok:
            raise mark_shared(err)
        return fn()

    def agree(self, fn: Callable[[], T]) -> T:
        """Every rank runs ``fn``; if any rank failed, every rank raises the lowest failing rank's error."""
        err: Optional[BaseException] = None
        result: Any = None
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001
            err = exc
        errors = self.all_gather_object(None if err is None else _portable(err))
        first = next((r for r, e in enumerate(errors) if e is not None), None)
        if first is None:
            return result
        # The failing rank re-raises its own exception (traceback intact), the others its copy.
        raise mark_shared(err if first == self.rank and err is not None else errors[first])

    # -- tensors and modules --------------------------------------------------------

    def gather_with_grad(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` concatenated along dim 0, with gradients flowing back to each rank's part."""
        return all_gather_with_grad(x)

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` under DistributedDataParallel (gradients averaged over the ranks)."""
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(module, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def gather_rows(self, x: np.ndarray, counts: Sequence[int]) -> np.ndarray:
        """Concatenate every rank's ``x`` (``counts[r]`` rows on rank r, same trailing shape and dtype), on every rank."""
        if x.shape[0] != counts[self.rank]:
            raise ValueError(f"rank {self.rank} holds {x.shape[0]} rows, expected {counts[self.rank]}")
        width = max(counts)
        t = torch.zeros((width, *x.shape[1:]), dtype=torch.from_numpy(np.empty(0, x.dtype)).dtype)
        t[: x.shape[0]] = torch.from_numpy(np.ascontiguousarray(x))
        t = t.to(self.device) if self.backend == "nccl" else t  # NCCL gathers GPU tensors only
        parts = [torch.empty_like(t) for _ in range(self.world_size)]  # (width, ...) each, padded
        dist.all_gather(parts, t)
        return np.concatenate([p[:c].cpu().numpy() for p, c in zip(parts, counts)])


@dataclass
class LocalContext:
    """The one-process counterpart of :class:`DistContext`: the same calls, nothing to exchange.

    Code written against a context runs unchanged in one process and in a torchrun job.
    """

    device: torch.device
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return True

    def barrier(self) -> None:
        return None

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        return obj

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def run_on_main(self, fn: Callable[[], T]) -> T:
        return fn()

    def main_first(self, fn: Callable[[], T]) -> T:
        return fn()

    def agree(self, fn: Callable[[], T]) -> T:
        return fn()

    def gather_with_grad(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def gather_rows(self, x: np.ndarray, counts: Sequence[int]) -> np.ndarray:
        return x


def init_distributed(
    device: str = "auto", backend: str = "auto", timeout: Optional[_dt.timedelta] = None
) -> DistContext:
    """Initialise the default process group from torchrun's environment; one rank's context."""
    rank = _env_int("RANK")
    world = _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK")
    local_world = _env_int("LOCAL_WORLD_SIZE", default=world)
    dev = device_for_rank(device, local_rank, local_world)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    be = backend if backend != "auto" else ("nccl" if dev.type == "cuda" else "gloo")
    if be not in ("nccl", "gloo"):
        raise ConfigError(f"backend must be nccl, gloo or auto, got {backend!r}")
    if be == "nccl" and dev.type != "cuda":
        raise ConfigError("the nccl backend needs CUDA devices; use gloo on CPU")
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"backend": be, "rank": rank, "world_size": world}
        if timeout is not None:
            kwargs["timeout"] = timeout
        dist.init_process_group(**kwargs)
    return DistContext(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world, backend=be, device=dev
    )


@contextmanager
def distributed_session(
    device: str = "auto", backend: str = "auto", timeout: Optional[_dt.timedelta] = None
) -> Iterator[DistContext]:
    """``init_distributed`` ... ``destroy_process_group``, also on errors."""
    ctx = init_distributed(device, backend, timeout)
    try:
        yield ctx
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# --------------------------------------------------------------------------- gathers


class _AllGatherWithGrad(torch.autograd.Function):
    """All-gather along dim 0 whose backward hands each rank the *sum* over ranks of its slice's gradient.

    Every rank's loss may depend on every rank's rows; the total derivative with
    respect to rank r's rows is the sum of all ranks' partial derivatives, which
    is what the backward all-reduce (or reduce-scatter) computes.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        world, rank = dist.get_world_size(), dist.get_rank()
        ctx.rank, ctx.n = rank, x.shape[0]
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(world)]  # (n, ...) each
        dist.all_gather(parts, x)
        return torch.cat(parts)  # (world * n, ...)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        grad = grad.contiguous()  # (world * n, ...)
        if dist.get_backend() == "nccl":
            out = torch.empty((ctx.n, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
            dist.reduce_scatter_tensor(out, grad, op=dist.ReduceOp.SUM)
            return out
        # gloo has no reduce-scatter: all-reduce the whole gradient, keep our slice.
        total = grad.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n]


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """(n, ...) on each rank -> (world * n, ...) in rank order, differentiable (every rank must pass the same n).

    Inputs that do not require grad are gathered without autograd bookkeeping
    (booleans travel as uint8: not every backend reduces or gathers bool).
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return x
    if x.dtype == torch.bool:
        return all_gather_with_grad(x.to(torch.uint8)).to(torch.bool)
    if not x.requires_grad:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)
    return _AllGatherWithGrad.apply(x)


# --------------------------------------------------------------------------- shares


def shard_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous ``[lo, hi)`` of ``n`` items for ``rank``; sizes differ by at most one."""
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def part_path(out: Path, rank: int, world_size: int) -> Path:
    """HDF5 part file of ``rank``: ``store.h5`` -> ``store.part-00001-of-00002.h5`` (0-based rank)."""
    out = Path(out)
    return out.with_name(f"{out.stem}.part-{rank:05d}-of-{world_size:05d}{out.suffix}")


def part_files(out: Path) -> list[tuple[Path, int, int]]:
    """Existing part files of ``out``, any world size: (path, rank, world_size), sorted."""
    out = Path(out)
    found = []
    for p in out.parent.glob(f"{out.stem}.part-*-of-*{out.suffix}"):
        core = p.name[len(out.stem) + len(".part-") : len(p.name) - len(out.suffix)]
        r, _, w = core.partition("-of-")
        if r.isdigit() and w.isdigit():
            found.append((p, int(r), int(w)))
    return sorted(found, key=lambda t: (t[2], t[1]))
