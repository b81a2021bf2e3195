"""The compiled CPU kernels' test helpers: the kernels (skipping, with the reason, where they cannot be built) and
strided row views like the engine's."""

from __future__ import annotations

import pytest
import torch

from dab_pipeline.scoring.kernels import cpu as cpu_kernels
from dab_pipeline.scoring.kernels.cpu import get_kernels


def fused_kernels() -> cpu_kernels.Kernels:
    """The compiled kernels, or a skip that says why (a CI log then shows a missing compiler, not a silent skip)."""
    k = get_kernels()
    if not k.fused:
        pytest.skip(f"compiled kernels unavailable here: {k.reason}")
    return k


def rows_view(t: torch.Tensor, pad: int) -> torch.Tensor:
    """The same values as rows of a wider buffer: row stride > row length, as in the engine."""
    buf = torch.full((t.shape[0], t.shape[1] + pad), float("nan"), dtype=t.dtype)
    buf[:, : t.shape[1]] = t
    return buf[:, : t.shape[1]]
