"""What the current device computes fast, detected once per process, and the dtype choices that follow.

bf16 pays only where the hardware multiplies bf16 natively: on CPU, AMX or AVX512-BF16
with oneDNN's bf16 kernels; on CUDA, compute capability 8.0 or newer.  Elsewhere torch
still runs bf16, but by widening every product in software: on an AVX2 CPU the bf16
scoring engine ran about 100x slower than float32 (issue 14).  So every ``auto`` choice
(``dab extract --dtype``, ``dab train --set score_dtype``, ``dab search --dtype``) asks
:func:`capabilities`, and an explicit bf16 request on a device without native bf16 runs
in float32 with one warning, unless ``DAB_ALLOW_EMULATED_BF16=1`` says to run it anyway
(for checking numerics, never for speed).

The detection is cached per device; tests replace :func:`probe_cpu` / :func:`_probe_cuda`
(or set the result with :func:`override`) to play either kind of machine.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Iterator, Optional

import torch

from ..core.choices import AMP_MODES, CLIP_DTYPES, SCORE_DTYPES
from ..core.errors import ConfigError

__all__ = [
    "Capabilities",
    "DtypeChoice",
    "capabilities",
    "cpu_flags",
    "override",
    "resolve_score_dtype",
    "resolve_amp",
    "resolve_clip_dtype",
    "ALLOW_EMULATED_ENV",
]

ALLOW_EMULATED_ENV = "DAB_ALLOW_EMULATED_BF16"
# the CPU flags that decide which kernels and dtypes are fast, in the order they are printed
_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16", "amx_tile", "bf16", "asimd", "sve")


@dataclass(frozen=True)
class Capabilities:
    """One device's fast paths.  ``bf16`` is True only where bf16 products run natively."""

    device: str  # "cpu" or "cuda:N"
    name: str  # CPU model name or GPU name
    bf16: bool
    bf16_why: str  # what makes bf16 native here, or why it is not
    tf32: bool  # CUDA: tensor-core float32 (compute capability >= 8.0); always False on CPU
    isa: tuple[str, ...] = field(default_factory=tuple)  # CPU: which of _ISA_FLAGS are present

    def as_dict(self) -> dict:
        d = asdict(self)
        d["isa"] = list(self.isa)
        return d

    def summary(self) -> str:
        """One line, e.g. ``cpu (AMD EPYC 9R14): bf16 native (AVX512-BF16, oneDNN bf16 on)``."""
        native = "native" if self.bf16 else "not native"
        return f"{self.device} ({self.name}): bf16 {native} ({self.bf16_why})" + (", TF32" if self.tf32 else "")


@dataclass(frozen=True)
class DtypeChoice:
    """A resolved dtype and, when the request could not be honoured as asked, the warning line."""

    requested: str
    dtype: str
    warning: Optional[str] = None


# --------------------------------------------------------------------------- detection


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo ``flags`` on x86, ``Features`` on ARM); empty if unknown."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def onednn_bf16() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def probe_cpu() -> Capabilities:
    flags = cpu_flags()
    isa = tuple(f for f in _ISA_FLAGS if f in flags)
    units = [
        name
        for flag, name in (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("bf16", "ARM BF16"))
        if flag in flags
    ]
    onednn = onednn_bf16()
    if units and onednn:
        bf16, why = True, f"{', '.join(units)}; oneDNN bf16 on"
    elif units:
        bf16, why = (
            False,
            (f"{', '.join(units)} present, but oneDNN's bf16 check is off (this torch build, or ONEDNN_MAX_CPU_ISA)"),
        )
    elif onednn:
        # oneDNN knows the CPU better than a flag list we may not recognise (e.g. no /proc)
        bf16, why = True, "oneDNN reports native bf16"
    else:
        best = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else (platform.machine() or "this CPU"))
        bf16, why = False, f"{best} without AMX or AVX512-BF16: bf16 products are emulated"
    return Capabilities("cpu", _cpu_name(), bf16, why, False, isa)


def _probe_cuda(index: int) -> Capabilities:
    major, minor = torch.cuda.get_device_capability(index)
    name = torch.cuda.get_device_name(index)
    native = major >= 8
    why = f"compute capability {major}.{minor}" + ("" if native else ": no bf16 tensor cores (8.0+ has them)")
    return Capabilities(f"cuda:{index}", name, native, why, native, ())


_overrides: dict[str, Capabilities] = {}


@functools.lru_cache(maxsize=None)
def _detect(key: str) -> Capabilities:
    if key == "cpu":
        return probe_cpu()
    return _probe_cuda(int(key.split(":", 1)[1]))


def _key(device: "str | torch.device") -> str:
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if dev.type == "cuda":
        return f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
    return "cpu"  # mps and others: treated like the CPU (no dab kernels there)


def capabilities(device: "str | torch.device" = "cpu") -> Capabilities:
    """The capabilities of ``device`` (a torch device or its name), detected once per process."""
    key = _key(device)
    return _overrides.get(key) or _detect(key)


@contextlib.contextmanager
def override(caps: Capabilities) -> Iterator[Capabilities]:
    """Make :func:`capabilities` report ``caps`` for its device inside the block (tests, benchmarks)."""
    key = caps.device if caps.device != "cuda" else "cuda:0"
    old = _overrides.get(key)
    _overrides[key] = caps
    try:
        yield caps
    finally:
        if old is None:
            _overrides.pop(key, None)
        else:
            _overrides[key] = old


def _emulation_allowed() -> bool:
    return os.environ.get(ALLOW_EMULATED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _fallback(what: str, requested: str, caps: Capabilities) -> str:
    return (
        f"{what} {requested} requested, but {caps.device} has no native bf16 ({caps.bf16_why}): "
        f"running in float32, which is much faster here (set {ALLOW_EMULATED_ENV}=1 to run bf16 anyway)"
    )


# --------------------------------------------------------------------------- resolution


def resolve_score_dtype(requested: str, device: "str | torch.device") -> DtypeChoice:
    """The scoring engine's product dtype: ``auto`` | ``float32`` | ``bfloat16`` -> float32 | bfloat16."""
    if requested not in SCORE_DTYPES:
        raise ConfigError(f"score dtype must be one of {', '.join(SCORE_DTYPES)}, got {requested!r}")
    caps = capabilities(device)
    if requested == "auto":
        return DtypeChoice(requested, "bfloat16" if caps.bf16 else "float32")
    if requested == "bfloat16" and not caps.bf16 and not _emulation_allowed():
        return DtypeChoice(requested, "float32", _fallback("score dtype", requested, caps))
    return DtypeChoice(requested, requested)


def resolve_amp(requested: str, device: "str | torch.device") -> DtypeChoice:
    """Training autocast: ``auto`` (bf16 on a GPU with native bf16) | ``bf16`` | ``none`` -> bf16 | none.

    ``auto`` stays off on CPU even where bf16 is native: autocast there casts every
    product's inputs anew and measured slower than float32 (docs/extraction.md).
    """
    if requested not in AMP_MODES:
        raise ConfigError(f"amp must be one of {', '.join(AMP_MODES)}, got {requested!r}")
    caps = capabilities(device)
    if requested == "auto":
        return DtypeChoice(requested, "bf16" if caps.device.startswith("cuda") and caps.bf16 else "none")
    if requested == "bf16" and not caps.bf16 and not _emulation_allowed():
        warning = _fallback("amp", requested, caps).replace("float32", "float32 (no autocast)", 1)
        return DtypeChoice(requested, "none", warning)
    return DtypeChoice(requested, requested)


def resolve_clip_dtype(requested: str, device: "str | torch.device") -> DtypeChoice:
    """CLIP's compute dtype for extraction.

    ``auto``: bf16 autocast on a GPU with native bf16 (float16 autocast is not offered:
    float16 weights on an older GPU, ``float16``, are the fast choice there); on CPU,
    open_clip's bf16 conversion where bf16 is native (1.4-2.6x faster, measured), float32
    elsewhere.  Explicit bf16 requests on a device without native bf16 fall back to float32.
    """
    if requested not in CLIP_DTYPES:
        raise ConfigError(f"CLIP dtype must be one of {', '.join(CLIP_DTYPES)}, got {requested!r}")
    caps = capabilities(device)
    cuda = caps.device.startswith("cuda")
    if requested == "auto":
        if cuda:
            return DtypeChoice(requested, "autocast-bf16" if caps.bf16 else "float16")
        return DtypeChoice(requested, "bfloat16" if caps.bf16 else "float32")
    if requested in ("bfloat16", "autocast-bf16") and not caps.bf16 and not _emulation_allowed():
        return DtypeChoice(requested, "float32", _fallback("--dtype", requested, caps))
    return DtypeChoice(requested, requested)
