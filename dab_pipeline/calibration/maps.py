"""A fitted map from a query's features to a probability, as plain numbers: written in calibration.json,
applied with numpy (searching needs no scikit-learn; tests/calibration check it against scikit-learn's own
``predict_proba`` / ``predict``).

* ``logistic``: scikit-learn's LogisticRegression over standardised features: 1 / (1 + exp(-(z . w + b))),
  z = (x - mean) / scale. With the one feature ``margin`` it is Platt scaling of the raw margin (the baseline
  ``margin_sigmoid``).
* ``isotonic``: scikit-learn's IsotonicRegression of one feature: linear between its fitted points, clipped to
  the end values outside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.choices import CALIBRATION_METHODS
from ..core.errors import ConfigError
from .features import QueryFeatures

__all__ = ["MAP_KINDS", "ProbabilityMap", "nested_probabilities"]

MAP_KINDS = CALIBRATION_METHODS


@dataclass(frozen=True)
class ProbabilityMap:
    kind: str  # logistic | isotonic
    features: tuple[str, ...]  # the columns it reads (isotonic: one)
    params: dict[str, Any]  # logistic: mean, scale, coef, intercept; isotonic: x, y (its fitted points)

    def __post_init__(self) -> None:
        if self.kind not in MAP_KINDS:
            raise ConfigError(f"unknown probability map {self.kind!r}; valid: {', '.join(MAP_KINDS)}")
        if self.kind == "isotonic" and len(self.features) != 1:
            raise ConfigError(f"an isotonic map reads one feature, not {len(self.features)}")

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
    """(P(the first hit is a match), P(a match in the first k)) (Q,) each. The two maps are fitted apart, so on few
    queries the second can come out below the first for an event that contains it: it is raised to the first."""
    p1 = first.predict(feats)
    return p1, np.maximum(first_k.predict(feats), p1)
