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
eager ATen versions below, which compute the same thing (they are the reference the
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
import torch.nn.functional as F
from torch import Tensor

from ...model.costs import kl_diag_gaussian

__all__ = [
    "Kernels",
    "get_kernels",
    "amx_ops",
    "eager_kernels",
    "kernel_cache_dir",
    "silu_bf16_eager",
    "add_silu_bf16_eager",
    "bridge_update_eager",
    "pair_heads_eager",
    "kl_rows_eager",
]

SOURCE = Path(__file__).parent / "csrc" / "dab_cpu.cpp"
AMX_SOURCE = Path(__file__).parent / "csrc" / "dab_amx.cpp"  # the bridge's products on AMX (same build)
_ENV_SWITCH = "DAB_CPU_KERNELS"


# --------------------------------------------------------------------------- eager versions (the spec)


def silu_bf16_eager(x: Tensor) -> None:
    """``x <- silu(x)`` in place; x (P, H) bfloat16."""
    F.silu(x, inplace=True)


def add_silu_bf16_eager(out: Tensor, a: Tensor, b: Tensor) -> None:
    """``out[r] <- silu(bf16(a[r] + b[r % Mb]))``; out, a (P, H) bfloat16, b (Mb, H) float32."""
    rows, mb = a.shape[0], b.shape[0]
    reps = -(-rows // mb)
    b_rows = b.expand(reps, *b.shape).reshape(reps * mb, -1)[:rows]  # (P, H): row r is b[r % Mb]
    torch.add(a, b_rows, out=out)  # float32 sum, rounded once into out
    F.silu(out, inplace=True)


def bridge_update_eager(
    st: Tensor, delta: Tensor, s: Tensor, chi: float, lo: float, hi: float, d: int, write_s: bool
) -> None:
    """One bridge step's state update, in place.

    st (P, W) float32 holds ``[mu, logvar / 2]`` (W = 2D) or ``[x]`` (W = D); delta (P, W)
    bfloat16 is the drift.  ``st -= chi * delta``; the logvar half is clamped to
    ``[lo, hi]``; with ``write_s`` the next product's input s (P, W) bfloat16 gets
    ``[mu, exp(logvar / 2)]`` (or ``[x]``).
    """
    st.add_(delta, alpha=-chi)  # (P, W) float32 += bf16, promoted
    if st.shape[1] > d:
        st[:, d:].clamp_(lo, hi)
    if write_s:
        s[:, :d].copy_(st[:, :d])
        if st.shape[1] > d:
            torch.exp(st[:, d:], out=s[:, d:])


def pair_heads_eager(
    coef: Tensor,
    g: Tensor,
    basis: Tensor,
    vidx: Tensor,
    vtok: Tensor,
    lo: float,
    hi: float,
    mu: Tensor,
    lv: Tensor,
    sigma: Tensor,
    target: Tensor,
) -> None:
    """The video side of a block of pairs, from each video's merged basis; writes the four outputs.

    coef (P, K) float32 holds each pair's coefficients and vidx (P,) int64 its video (any
    order; the engine's rows come grouped by video, one product per run); basis (V, K, 3D + H) gives
    ``out = coef[r] @ basis[vidx[r]]``, read as ``[tok_g | mu | lv_raw | target]``.  Then
    mu (P, D) float32 <- ``out[D:2D]``; lv (P, D) float32 <-
    ``clamp((clamp(lv_raw, lo, hi) + tok_g / g + vtok[vidx]) / 2, lo, hi)`` with g (P,) the
    token term's scale and vtok (V, D) the per-video token term; sigma (P, D) bfloat16 <-
    ``exp(lv / 2)``; target (P, H) bfloat16 <- ``out[3D:]``.  sigma may instead be tile-blocked,
    (Pp/16, D/32, 16, 32) with Pp = P rounded up to 32 (the AMX products' input), its padding rows 0.
    """
    d = mu.shape[1]
    out = torch.empty(coef.shape[0], basis.shape[2], dtype=torch.float32)  # (P, 3D + H)
    videos, counts = torch.unique_consecutive(vidx, return_counts=True)
    r0 = 0
    for v, n in zip(videos.tolist(), counts.tolist()):
        torch.mm(coef[r0 : r0 + n], basis[v], out=out[r0 : r0 + n])
        r0 += n
    mu.copy_(out[:, d : 2 * d])
    lv.copy_(out[:, 2 * d : 3 * d]).clamp_(lo, hi).add_(out[:, :d] / g[:, None]).add_(vtok[vidx])
    lv.mul_(0.5).clamp_(lo, hi)
    if sigma.dim() == 4:
        rows = torch.zeros(sigma.shape[0] * 16, d, dtype=sigma.dtype)  # (Pp, D)
        torch.exp(lv * 0.5, out=rows[: lv.shape[0]])
        sigma.permute(0, 2, 1, 3).copy_(rows.view(sigma.shape[0], 16, d // 32, 32))
    else:
        torch.exp(lv * 0.5, out=sigma)
    target.copy_(out[:, 3 * d :])


def kl_rows_eager(mu_v: Tensor, lv_v: Tensor, st: Tensor) -> Tensor:
    """``KL(N(mu_v, e^lv_v) || N(mu_t, e^(2 hv_t)))`` per row -> (P,) float32; st (P, 2D) = [mu_t, hv_t]."""
    d = mu_v.shape[1]
    return kl_diag_gaussian(mu_v, lv_v, st[:, :d], st[:, d:] * 2.0)


@dataclass(frozen=True)
class Kernels:
    """The kernels in use: compiled (``fused``) or the eager fallbacks, with the reason."""

    silu_bf16_: Callable[[Tensor], None]
    add_silu_bf16_: Callable[[Tensor, Tensor, Tensor], None]
    bridge_update_: Callable[[Tensor, Tensor, Tensor, float, float, float, int, bool], None]
    pair_heads_: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, float, float, Tensor, Tensor, Tensor, Tensor], None]
    kl_rows: Callable[[Tensor, Tensor, Tensor], Tensor]
    fused: bool
    reason: str
    target: str = "native"  # the -march the compiled kernels were built for

    @property
    def name(self) -> str:
        if not self.fused:
            return "eager"
        return "fused" if self.target == "native" else f"fused ({self.target})"


# the kernels' names, in the order of Kernels' fields: torch.ops.dab_cpu.<name> and <name>_eager
_NAMES = ("silu_bf16_", "add_silu_bf16_", "bridge_update_", "pair_heads_", "kl_rows")


def eager_kernels(reason: str = "eager requested") -> Kernels:
    eager = (silu_bf16_eager, add_silu_bf16_eager, bridge_update_eager, pair_heads_eager, kl_rows_eager)
    return Kernels(*eager, False, reason)


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


def _cpu_signature() -> str:
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
        _cpu_signature().encode(),
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
