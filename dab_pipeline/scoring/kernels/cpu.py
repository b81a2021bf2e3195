"""Fused CPU kernels for the bf16 scoring engine, built on first use, with eager fallbacks.

The bf16 bridge on CPU runs its products on the bf16 matrix units (AMX / AVX512-BF16)
several times faster than in float32, so the elementwise work between them -- SiLU and the
state update, each several ATen passes over memory -- becomes a third of a step.
``csrc/dab_cpu.cpp`` does each of those stretches in one pass.  It is compiled on the
machine that runs it (``-march=native``; a C++ compiler and ``ninja`` are needed) the first
time :func:`get_kernels` is called, and the build is cached:

* in ``$DAB_KERNEL_CACHE``, else ``<dab cache>/kernels`` (``$DAB_CACHE`` or ``~/.cache/dab``);
* under a key of the source, the flags, torch, Python and the CPU's feature flags, so a
  home folder shared by different machines never loads a binary built for another CPU.

``DAB_KERNEL_MARCH`` replaces ``native`` in ``-march=native`` (e.g. ``x86-64-v3``: AVX2, no
AVX-512), so the portable paths of the source can be built and tested on any machine; the
flag is part of the cache key like everything else that changes the binary.

``DAB_CPU_KERNELS=0`` (or ``off``/``false``) turns the build off.  Whenever the kernels are
unavailable -- turned off, no compiler, a failed build -- :func:`get_kernels` returns the
eager ATen versions (``eager.py``), which compute the same thing (they are the reference the
tests hold the compiled kernels to), and :attr:`Kernels.reason` says why.
``python -m dab_pipeline.scoring.kernels.cpu`` builds them now and prints the outcome.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from . import eager

__all__ = ["Kernels", "get_kernels", "amx_ops", "eager_kernels", "kernel_cache_dir", "cpu_signature", "build_key"]

SOURCE = Path(__file__).parent / "csrc" / "dab_cpu.cpp"
AMX_SOURCE = Path(__file__).parent / "csrc" / "dab_amx.cpp"  # the bridge's products on AMX (same build)
_ENV_SWITCH = "DAB_CPU_KERNELS"


@dataclass(frozen=True)
class Kernels:
    """The kernels in use: compiled (``fused``) or the eager fallbacks, with the reason."""

    silu_bf16_: Callable[[Tensor], None]
    add_silu_bf16_: Callable[[Tensor, Tensor, Tensor], None]
    bridge_update_: Callable[[Tensor, Tensor, Tensor, float, float, float, int, bool], None]
    pair_heads_: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, float, float, Tensor, Tensor, Tensor, Tensor], None]
    kl_rows: Callable[[Tensor, Tensor, Tensor], Tensor]
    kl_lowrank_rows: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, int], Tensor]
    kl_mixture_rows: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
    one_frames_: Callable[[Tensor, Tensor, Tensor, float, Tensor, Optional[Tensor]], None]
    one_token_: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None]
    one_norm_: Callable[..., None]
    one_pooled_: Callable[..., None]
    one_heads_: Callable[..., None]
    fused: bool
    reason: str
    target: str = "native"  # the -march the compiled kernels were built for

    @property
    def name(self) -> str:
        if not self.fused:
            return "eager"
        return "fused" if self.target == "native" else f"fused ({self.target})"


# the kernels' names, in the order of Kernels' fields: torch.ops.dab_cpu.<name> and <name>_eager
_NAMES = (
    "silu_bf16_",
    "add_silu_bf16_",
    "bridge_update_",
    "pair_heads_",
    "kl_rows",
    "kl_lowrank_rows",
    "kl_mixture_rows",
    "one_frames_",
    "one_token_",
    "one_norm_",
    "one_pooled_",
    "one_heads_",
)


def eager_kernels(reason: str = "eager requested") -> Kernels:
    """The eager specs in :data:`_NAMES`' order (``<name>_eager``, a trailing underscore dropped)."""
    return Kernels(*(getattr(eager, name.rstrip("_") + "_eager") for name in _NAMES), False, reason)


# --------------------------------------------------------------------------- build and load


def kernel_cache_dir() -> Path:
    env = os.environ.get("DAB_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("DAB_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "dab") / "kernels"


def compile_flags() -> list[str]:
    # -ffast-math's parts, for vector min/max in the clamps and reciprocal estimates (one
    # Newton step: ~1e-7 relative) in place of divides; the source tests NaN on the bits, so it
    # still passes NaN through.  Not -ffast-math itself: at link time that can pull in
    # crtfastmath.o, which would flush denormals for the whole process.
    flags = [
        "-O3",
        "-fopenmp",
        "-fno-math-errno",
        "-funsafe-math-optimizations",
        "-ffinite-math-only",
        "-fno-trapping-math",
        "-fno-signed-zeros",
    ]
    machine = platform.machine().lower()
    target = kernel_target()
    if machine in ("x86_64", "amd64"):
        flags += [f"-march={target}", "-mprefer-vector-width=512", "-mrecip"]
    elif machine in ("aarch64", "arm64"):
        flags += [f"-mcpu={target}"]
    return flags


def kernel_target() -> str:
    """The instruction set the kernels are built for: ``native`` or ``$DAB_KERNEL_MARCH``."""
    target = os.environ.get("DAB_KERNEL_MARCH", "").strip() or "native"
    if not all(c.isalnum() or c in "-_.+" for c in target):
        raise ValueError(f"DAB_KERNEL_MARCH={target!r} is not a -march value (e.g. native, x86-64-v3)")
    return target


def cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_key() -> str:
    h = hashlib.sha256()
    for part in (
        SOURCE.read_bytes(),
        AMX_SOURCE.read_bytes(),
        " ".join(compile_flags()).encode(),
        torch.__version__.encode(),
        sys.version.encode(),
        cpu_signature().encode(),
    ):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _disabled() -> bool:
    return os.environ.get(_ENV_SWITCH, "auto").strip().lower() in ("0", "off", "false", "no", "eager")


_lock = threading.Lock()
_cached: Optional[Kernels] = None


def get_kernels(build: bool = True) -> Kernels:
    """The fused kernels, building them on first use; the eager ones when that is not possible.

    The outcome is cached for the process.  ``build=False`` only loads a build that is
    already in the cache.
    """
    global _cached
    if _disabled():
        return eager_kernels(f"turned off by {_ENV_SWITCH}={os.environ.get(_ENV_SWITCH)}")
    with _lock:
        if _cached is None:
            kernels = _load(build)
            if kernels.fused or build:  # a failed build is not retried in this process
                _cached = kernels
            return kernels
        return _cached


def amx_ops():
    """``torch.ops.dab_amx`` (the bridge's products on AMX tiles, ``csrc/dab_amx.cpp``) where the compiled
    kernels were built with AMX and this process may use its tiles; else None.  ``DAB_AMX=0`` turns it off."""
    if os.environ.get("DAB_AMX", "auto").strip().lower() in ("0", "off", "false", "no"):
        return None
    if not get_kernels().fused:
        return None
    try:
        ops = torch.ops.dab_amx
        return ops if ops.amx_available() else None
    except (AttributeError, RuntimeError):
        return None


def _compiled() -> Kernels:
    return Kernels(*(getattr(torch.ops.dab_cpu, name) for name in _NAMES), True, "compiled", kernel_target())


def _loaded() -> bool:
    try:
        return all(hasattr(torch.ops.dab_cpu, name) for name in _NAMES)
    except (AttributeError, RuntimeError):
        return False


def _load(build: bool) -> Kernels:
    if _loaded():
        return _compiled()  # already loaded in this process
    key = build_key()
    name = f"dab_cpu_{key}"
    folder = kernel_cache_dir() / name
    library = folder / f"{name}.so"
    if library.exists():
        try:
            torch.ops.load_library(str(library))
            return _compiled()
        except (OSError, RuntimeError) as exc:  # a truncated or foreign file: rebuild it
            if not build:
                return eager_kernels(f"could not load {library}: {exc}")
    if not build:
        return eager_kernels("not built yet")
    import logging

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # its CUDA_HOME notice
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return eager_kernels(f"no C++ compiler ({compiler!r} not on PATH)")
    if not cpp_extension.is_ninja_available():
        return eager_kernels("ninja is not installed (pip install ninja)")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        # cpp_extension locks the folder while it builds, so concurrent ranks build once
        cpp_extension.load(
            name=name,
            sources=[str(SOURCE), str(AMX_SOURCE)],
            extra_cflags=compile_flags(),
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            is_python_module=False,
            verbose=False,
        )
    except Exception as exc:  # noqa: BLE001 - any build failure falls back to the eager kernels
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ": error" in ln or ": fatal error" in ln]
        errors += [ln for ln in lines if "error" in ln.lower() and not ln.startswith("[")]
        detail = (errors or lines or [type(exc).__name__])[0]
        return eager_kernels(f"build failed in {folder}: {detail[:300]}")
    return _compiled()


# `python -m dab_pipeline.scoring.kernels.cpu` stays in the package, unlike the maintainer's scripts (scripts/): it is a
# user's step (the kernels built ahead on the machine that runs them, a container's build or a node before a job,
# and whether they built), and an installed dab has no scripts/ folder.
def main() -> None:
    t = time.perf_counter()
    k = get_kernels()
    took = time.perf_counter() - t
    where = kernel_cache_dir()
    if k.fused:
        print(f"dab CPU kernels: compiled ({took:.1f} s), cache {where}")
    else:
        print(f"dab CPU kernels: not available, the eager fallback is used ({k.reason})")
        raise SystemExit(1 if not _disabled() else 0)


if __name__ == "__main__":
    main()
