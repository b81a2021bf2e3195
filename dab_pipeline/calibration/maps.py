"""A fitted map from a query's features to a probability, as plain numbers: written in calibration.json,
applied with numpy (searching needs no scikit-learn; tests/calibration check it against scikit-learn's own
``predict_proba`` / ``predict``).

* ``logistic``: scikit-learn's LogisticRegression over standardised features: 1 / (1 + exp(-(z . w + b))),
  z = (x - mean) / scale. With the one feature ``margin`` it is Platt scaling of the raw margin (the baseline
  ``margin_sigmoid``).
* ``isotonic``: scikit-learn's IsotonicRegression of one feature: linear between its fitted points, clipped to
  the end values outside them.
* ``temperature``: temperature scaling (Guo et al. 2017): the softmax over the query's first K0 costs at a fitted
  temperature, its best video's mass (P(first)) or its first k videos' (P(first k)).
* ``softmax``: the raw softmax feature itself (``softmax_first`` or ``softmax_first_k``), nothing fitted: the
  baseline a fitted map must beat to be chosen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.choices import PROBABILITY_MAPS
from ..core.errors import ConfigError
from ..metrics.conformal import cost_softmax
from .features import QueryFeatures

__all__ = ["ProbabilityMap", "nested_probabilities"]


@dataclass(frozen=True)
class ProbabilityMap:
    kind: str  # logistic | isotonic | temperature | softmax
    features: tuple[str, ...]  # the columns it reads (isotonic, softmax: one; temperature: softmax_first(_k))
    # logistic: mean, scale, coef, intercept; isotonic: x, y (its fitted points); temperature: temperature and
    # first (the videos whose mass it gives: 1 or k); softmax: none
    params: dict[str, Any]

    def __post_init__(self) -> None:
        if self.kind not in PROBABILITY_MAPS:
            raise ConfigError(f"unknown probability map {self.kind!r}; valid: {', '.join(PROBABILITY_MAPS)}")
        if self.kind != "logistic" and len(self.features) != 1:
            raise ConfigError(f"a {self.kind} map reads one feature, not {len(self.features)}")

    def _columns(self, feats: QueryFeatures) -> np.ndarray:
        missing = [f for f in self.features if f not in feats.names]
        if missing:
            raise ConfigError(
                f"the probability map reads {', '.join(missing)}, which this model does not give "
                "(was it calibrated for another run?)"
            )
        return np.stack([feats.column(f) for f in self.features], axis=1)  # (Q, F)

    def predict(self, feats: QueryFeatures) -> np.ndarray:
        """P(the event) for each query (Q,) float64 in [0, 1]."""
        x = self._columns(feats)
        if self.kind == "softmax":
            if self.params.get("given_not_first"):  # the softmax's mass on 2..k over its mass off the first
                p1 = feats.column("softmax_first")
                return np.clip((x[:, 0] - p1) / np.maximum(1.0 - p1, 1e-12), 0.0, 1.0)
            return np.clip(x[:, 0], 0.0, 1.0)
        if self.kind == "temperature":
            if feats.top is None:
                raise ConfigError("a temperature map needs the queries' first costs (QueryFeatures.top)")
            p = cost_softmax(feats.top, float(self.params["temperature"]))  # (Q, K0)
            mass = p[:, : int(self.params["first"])].sum(axis=1)
            if self.params.get("given_not_first"):
                mass = (mass - p[:, 0]) / np.maximum(1.0 - p[:, 0], 1e-12)
            return np.clip(mass, 0.0, 1.0)
        if self.kind == "logistic":
            z = (x - np.asarray(self.params["mean"])) / np.asarray(self.params["scale"])  # (Q, F)
            logit = z @ np.asarray(self.params["coef"], np.float64) + float(self.params["intercept"])  # (Q,)
            return 0.5 * (1.0 + np.tanh(0.5 * logit))  # the logistic function, without overflow
        xs, ys = np.asarray(self.params["x"], np.float64), np.asarray(self.params["y"], np.float64)
        return np.clip(np.interp(x[:, 0], xs, ys), 0.0, 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "features": list(self.features), "params": self.params}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ProbabilityMap":
        try:
            return cls(str(d["kind"]), tuple(str(f) for f in d["features"]), dict(d["params"]))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"a probability map in calibration.json is malformed ({exc})") from None


def nested_probabilities(
    first: ProbabilityMap, first_k: ProbabilityMap, feats: QueryFeatures
) -> tuple[np.ndarray, np.ndarray]:
    """(P(the first hit is a match), P(a match in the first k)) (Q,) each, the second never below the first by
    construction: ``first_k`` is P(a match in the first k | the first hit is not one), fitted on the queries whose
    first hit is wrong, so P(first k) = P(first) + (1 - P(first)) P(2nd..kth | not first). (Two maps fitted apart
    crossed on few queries, and a patch raising one to the other read as a bug, issue 61.)"""
    p1 = first.predict(feats)
    return p1, p1 + (1.0 - p1) * first_k.predict(feats)
