"""Fitting the probability maps with scikit-learn (the optional extra ``dab-pipeline[calibrate]``); only
``dab calibrate`` fits, so searching and evaluating a calibrated run need no scikit-learn."""

from __future__ import annotations

import numpy as np

from ..core.errors import ConfigError
from .features import QueryFeatures
from .maps import ProbabilityMap

__all__ = ["fit_map", "library_versions", "require_sklearn"]


def require_sklearn():
    """scikit-learn, or a one-line ConfigError naming the extra that brings it."""
    try:
        import sklearn  # noqa: F401
        from sklearn.isotonic import IsotonicRegression
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise ConfigError(
            "dab calibrate fits its probability maps with scikit-learn, which is not installed: "
            "pip install 'dab-pipeline[calibrate]'"
        ) from None
    return LogisticRegression, IsotonicRegression


def library_versions() -> dict[str, str]:
    import sklearn

    return {"scikit-learn": sklearn.__version__, "numpy": np.__version__}


def _constant(kind_features: tuple[str, ...], y: np.ndarray) -> ProbabilityMap:
    """Every query the same probability (the outcomes were all one class): the smoothed rate (s + 1/2)/(n + 1)."""
    rate = (float(y.sum()) + 0.5) / (len(y) + 1.0)
    f = len(kind_features)
    params = {"mean": [0.0] * f, "scale": [1.0] * f, "coef": [0.0] * f, "intercept": float(np.log(rate / (1 - rate)))}
    return ProbabilityMap("logistic", kind_features, params)


def fit_map(
    feats: QueryFeatures, outcome: np.ndarray, kind: str, features: tuple[str, ...] | None = None
) -> ProbabilityMap:
    """P(outcome) from ``features`` of ``feats`` (default: every column; isotonic: the margin).

    logistic: LogisticRegression (L2, C=1) over the features standardised by their mean and standard deviation
    on these queries; isotonic: IsotonicRegression, increasing, clipped to [0, 1] and outside its points."""
    LogisticRegression, IsotonicRegression = require_sklearn()
    y = np.asarray(outcome, bool).astype(np.int64)  # (Q,)
    if kind == "isotonic":
        cols = features or ("margin",)
        x = feats.column(cols[0])
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(x, y)
        params = {"x": iso.X_thresholds_.tolist(), "y": iso.y_thresholds_.tolist()}
        return ProbabilityMap("isotonic", tuple(cols[:1]), params)
    if kind != "logistic":
        raise ConfigError(f"unknown calibration method {kind!r}; valid: logistic, isotonic")
    cols = features or feats.names
    if y.min() == y.max():
        return _constant(tuple(cols), y)
    x = np.stack([feats.column(c) for c in cols], axis=1)  # (Q, F)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)  # a constant feature: left as it is (its coefficient ends near 0)
    lr = LogisticRegression(C=1.0, max_iter=2000).fit((x - mean) / scale, y)
    params = {
        "mean": mean.tolist(),
        "scale": scale.tolist(),
        "coef": lr.coef_[0].tolist(),
        "intercept": float(lr.intercept_[0]),
    }
    return ProbabilityMap("logistic", tuple(cols), params)
