"""A synthetic gallery whose queries vary in difficulty, for the calibration tests and benchmarks/coverage.py."""

from __future__ import annotations

import numpy as np


def synthetic_costs(queries: int, videos: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cost (Q, V) float32, gt (Q,), text_var (Q,)): each query's match is cheaper by a margin that shrinks as
    its (hidden) ambiguity grows; the text variance tracks that ambiguity, with noise."""
    rng = np.random.default_rng(seed)
    ambiguity = rng.uniform(0, 1, queries)  # (Q,)
    cost = rng.normal(10.0, 1.0, (queries, videos))  # (Q, V)
    gt = rng.integers(0, videos, queries)
    cost[np.arange(queries), gt] -= 3.0 * (1.0 - ambiguity) + rng.normal(0, 0.5, queries)
    text_var = np.exp(ambiguity + 0.2 * rng.normal(size=queries))
    return cost.astype(np.float32), gt, text_var
