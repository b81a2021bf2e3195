"""Fused bf16 CPU kernels of the scoring engine: compiled from ``csrc/`` on first use, with their eager spec."""

from .cpu import Kernels, get_kernels  # noqa: F401

__all__ = ["Kernels", "get_kernels"]
