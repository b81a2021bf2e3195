"""The query-time groups a calibration can hold its coverage in (``dab calibrate --groups``, docs/uncertainty.md).

A spec names one or more kinds, each cut into bands: ``uncertainty:3`` (three bands of the model's own uncertainty),
``uncertainty:3,length:2`` (and two of caption length). Each kind reads a signal known when the query is asked and
that does not depend on whether its hits are right:

* ``uncertainty``: the log of the caption's text variance for a Gaussian run (prob, dab), minus the raw margin
  otherwise (a larger value is a less certain query either way). Not the calibrated P(first), whose map is fitted
  on part of the same queries.
* ``length``: the caption's number of words.

Band edges are the signal's quantiles over the *fitted* half of the calibration videos; the quantiles per band come
from the held-out half, which the edges never saw. One kind is a partition: Mondrian conformal, a quantile per band.
Two or more overlap: conditional conformal (:mod:`dab_pipeline.metrics.conditional`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from ..core.errors import ConfigError
from ..metrics.conformal import band_edges, band_of, needed_calibration

__all__ = ["GROUP_KINDS", "GroupSpec", "Groups", "describe_groups", "parse_groups", "query_signals"]

GROUP_KINDS = ("uncertainty", "length")
MAX_BANDS = 10


@dataclass(frozen=True)
class GroupSpec:
    kinds: tuple[tuple[str, int], ...]  # (kind, bands), in the order given

    def __str__(self) -> str:
        return ",".join(f"{k}:{b}" for k, b in self.kinds)


def parse_groups(text: Optional[str]) -> Optional[GroupSpec]:
    """``uncertainty:3,length:2`` -> a GroupSpec; ``uncertainty`` alone means 3 bands; None or "" -> None."""
    if text is None or not str(text).strip():
        return None
    kinds: list[tuple[str, int]] = []
    for part in str(text).split(","):
        name, _, count = part.strip().partition(":")
        if name not in GROUP_KINDS:
            raise ConfigError(f"unknown group {name!r} in --groups {text!r}; valid: {', '.join(GROUP_KINDS)}")
        try:
            bands = int(count) if count else 3
        except ValueError:
            raise ConfigError(f"--groups {text!r}: {part!r} needs a whole number of bands, as in {name}:3") from None
        if not 2 <= bands <= MAX_BANDS:
            raise ConfigError(f"--groups {text!r}: {name} needs 2 to {MAX_BANDS} bands, got {bands}")
        if name in dict(kinds):
            raise ConfigError(f"--groups {text!r} names {name} twice")
        kinds.append((name, bands))
    return GroupSpec(tuple(kinds))


def query_signals(
    kinds: Sequence[str],
    margin: np.ndarray,
    text_var: Optional[np.ndarray],
    texts: Optional[Sequence[str]],
) -> dict[str, np.ndarray]:
    """Each kind's signal per query (Q,) float64 (see the module's docstring)."""
    out = {}
    for kind in kinds:
        if kind == "uncertainty":
            out[kind] = (
                np.log(np.asarray(text_var, np.float64)) if text_var is not None else -np.asarray(margin, np.float64)
            )
        elif kind == "length":
            if texts is None:
                raise ConfigError("the length groups need each query's text")
            out[kind] = np.array([len(str(t).split()) for t in texts], np.float64)
    return out


@dataclass(frozen=True)
class Groups:
    """A calibration's groups: the spec, which signal ``uncertainty`` read, and each kind's band edges."""

    spec: GroupSpec
    signal: str  # log_text_var | minus_margin: what "uncertainty" is for this run
    edges: dict[str, list[float]]  # kind -> its bands' inner edges (B - 1), from the fitted half

    @property
    def conditional(self) -> bool:
        """Overlapping groups (two kinds or more): conditional conformal; one kind: Mondrian."""
        return len(self.spec.kinds) > 1

    def bands(self, signals: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each kind's band per query (Q,) int64 (0: the lowest signal)."""
        return {kind: band_of(signals[kind], np.asarray(self.edges[kind])) for kind, _ in self.spec.kinds}

    def indicators(self, bands: dict[str, np.ndarray]) -> np.ndarray:
        """The conditional program's features (Q, 1 + sum(B - 1)): an intercept and one column a band but each
        kind's first."""
        q = len(next(iter(bands.values())))
        cols = [np.ones(q)]
        for kind, count in self.spec.kinds:
            cols += [(bands[kind] == b).astype(np.float64) for b in range(1, count)]
        return np.stack(cols, axis=1)

    def label(self, bands: dict[str, int]) -> str:
        """``uncertainty 3/3 (most uncertain), length 1/2``."""
        parts = []
        for kind, count in self.spec.kinds:
            b = int(bands[kind])
            end = ""
            if kind == "uncertainty":
                end = " (most certain)" if b == 0 else " (most uncertain)" if b == count - 1 else ""
            parts.append(f"{kind} {b + 1}/{count}{end}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"spec": str(self.spec), "signal": self.signal, "edges": self.edges}

    @classmethod
    def fit(cls, spec: GroupSpec, signals: dict[str, np.ndarray], signal: str) -> "Groups":
        """Edges from ``signals`` (the fitted half's queries)."""
        return cls(spec, signal, {k: band_edges(signals[k], b).tolist() for k, b in spec.kinds})


def describe_groups(cal: Any) -> list[str]:
    """What a calibration's groups are and how much calibration each holds: a line for the groups, one a kind,
    one a band too small for a usual coverage (its queries get the marginal set there, labelled)."""
    if cal.groups is None:
        return []
    held = np.asarray(cal.held_out, bool)
    w = np.asarray(cal.weights)[held]
    signal = {"log_text_var": "the log text variance", "minus_margin": "minus the margin"}[cal.groups["signal"]]
    how = "conditional conformal" if parse_groups(cal.groups["spec"]).kinds[1:] else "Mondrian"
    lines = [
        f"groups {cal.groups['spec']} ({how}): edges from the fitted half, quantiles from the held-out half; "
        f"uncertainty is {signal}"
    ]
    for kind, bands in cal.groups["bands"].items():
        b = np.asarray(bands)[held]
        edges = ", ".join(f"{e:.3g}" for e in cal.groups["edges"][kind])
        sizes = [float(w[b == i].sum()) for i in range(len(cal.groups["edges"][kind]) + 1)]
        lines.append(f"  {kind}: edges {edges}; held-out videos a band " + ", ".join(f"{x:.0f}" for x in sizes))
        for i, x in enumerate(sizes):
            short = [c for c in (0.8, 0.9, 0.95) if x < needed_calibration(1 - c)]
            if short:
                lines.append(
                    f"  {kind} band {i + 1} holds {x:.1f} videos: too few for "
                    + ", ".join(f"{c:.0%}" for c in short)
                    + " (its queries get the marginal set there, labelled)"
                )
    return lines
