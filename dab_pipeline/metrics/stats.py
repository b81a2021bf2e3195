"""Statistics for comparing runs: the paired bootstrap over queries and Spearman's rank correlation.

Two rows of a results table differ by their model and by chance: which queries the test
split happens to hold (the bootstrap over queries estimates that) and the training seed
(several seeds estimate that). :func:`paired_bootstrap` resamples queries with
replacement, the same resample for both rows (they answered the same queries), after
averaging each query over the seeds it was run with.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import ConfigError


def _per_query(x: Any, name: str) -> np.ndarray:
    """(Q,) or (S, Q) -> (Q,): the mean over seeds of each query's value."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 2:
        a = a.mean(axis=0)
    if a.ndim != 1 or a.size == 0:
        raise ConfigError(f"{name} must be a non-empty (queries,) or (seeds, queries) array, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ConfigError(f"{name} contains non-finite values")
    return a


def paired_bootstrap(a: Any, b: Any, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """The difference of means ``mean(a) - mean(b)`` with a percentile bootstrap interval over queries.

    ``a``, ``b``: per-query values of two rows on the same queries, (Q,) or (S, Q) with S seeds
    (averaged per query first: the seeds are pooled). Each of ``n_boot`` resamples draws Q
    queries with replacement and takes the difference of the two rows' means on them.
    Returns ``{"diff", "low", "high", "level", "n_boot", "queries", "excludes_zero"}``;
    ``excludes_zero``: the interval lies wholly above or below 0 (a difference outside the
    noise of the query sample).
    """
    x, y = _per_query(a, "a"), _per_query(b, "b")
    if x.shape != y.shape:
        raise ConfigError(f"a and b must hold the same queries, got {x.shape[0]} and {y.shape[0]}")
    if not 0.0 < level < 1.0 or n_boot < 1:
        raise ConfigError(f"level must be in (0, 1) and n_boot >= 1, got {level} and {n_boot}")
    d = x - y  # (Q,) paired differences
    rng = np.random.default_rng(seed)
    n = d.size
    means = np.empty(n_boot)
    for i0 in range(0, n_boot, 256):  # bounded memory: 256 resamples of Q indices at a time
        idx = rng.integers(0, n, size=(min(256, n_boot - i0), n))
        means[i0 : i0 + idx.shape[0]] = d[idx].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return {
        "diff": float(d.mean()),
        "low": float(low),
        "high": float(high),
        "level": level,
        "n_boot": int(n_boot),
        "queries": int(n),
        "excludes_zero": bool(low > 0 or high < 0),
    }


def average_ranks(x: Any) -> np.ndarray:
    """1-based ranks of ``x`` (N,), ties sharing their average rank."""
    v = np.asarray(x, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    ranks = np.empty(v.size)
    sv = v[order]
    start = 0
    for end in range(1, v.size + 1):
        if end == v.size or sv[end] != sv[start]:
            ranks[order[start:end]] = (start + end + 1) / 2.0  # mean of the 1-based ranks start+1..end
            start = end
    return ranks


def spearman(x: Any, y: Any) -> float:
    """Spearman's rank correlation of two (N,) arrays (Pearson's of their average ranks); NaN if one is constant."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ConfigError(f"spearman needs two (N,) arrays with N >= 2, got shapes {a.shape} and {b.shape}")
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")
