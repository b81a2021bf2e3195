"""Fitting the probability maps with scikit-learn (the optional extra ``dab-pipeline[calibrate]``); only
``dab calibrate`` fits, so searching and evaluating a calibrated run need no scikit-learn."""

from __future__ import annotations

import numpy as np

from ..core.choices import PROBABILITY_MAPS
from ..core.errors import ConfigError
from ..metrics.calibration import log_loss
from .features import QueryFeatures
from .maps import ProbabilityMap

__all__ = ["choose_map", "fit_map", "library_versions", "require_sklearn"]


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
    feats: QueryFeatures,
    outcome: np.ndarray,
    kind: str,
    features: tuple[str, ...] | None = None,
    target: str = "first",
    first_k: int = 1,
    temperature: float = 1.0,
) -> ProbabilityMap:
    """P(outcome) from ``features`` of ``feats`` (default: every column; isotonic: the margin).

    logistic: LogisticRegression (L2, C=1) over the features standardised by their mean and standard deviation
    on these queries; isotonic: IsotonicRegression, increasing, clipped to [0, 1] and outside its points;
    temperature: the temperature of the softmax over the first K0 costs of least log loss (from the run's
    ``temperature``, a hundredth to a hundred times it); softmax: the raw ``softmax_first`` (``target`` first) or
    ``softmax_first_k`` (target first_k: its ``first_k`` videos), nothing fitted."""
    y = np.asarray(outcome, bool).astype(np.int64)  # (Q,)
    column = "softmax_first" if target == "first" else "softmax_first_k"
    given = {} if target == "first" else {"given_not_first": True}  # first_k: P(2nd..kth | the first is not one)
    if kind == "softmax":
        return ProbabilityMap("softmax", (column,), given)
    if kind == "temperature":
        return _temperature(feats, y, column, 1 if target == "first" else first_k, temperature, given)
    LogisticRegression, IsotonicRegression = require_sklearn()
    if kind == "isotonic":
        cols = features or ("margin",)
        x = feats.column(cols[0])
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(x, y)
        params = {"x": iso.X_thresholds_.tolist(), "y": iso.y_thresholds_.tolist()}
        return ProbabilityMap("isotonic", tuple(cols[:1]), params)
    if kind != "logistic":
        raise ConfigError(f"unknown probability map {kind!r}; valid: {', '.join(PROBABILITY_MAPS)}")
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


def _temperature(
    feats: QueryFeatures, y: np.ndarray, column: str, first: int, t0: float, given: dict
) -> ProbabilityMap:
    from scipy.optimize import minimize_scalar  # scipy comes with scikit-learn, the extra calibrate needs

    require_sklearn()

    def loss(log_t: float) -> float:
        m = ProbabilityMap("temperature", (column,), {"temperature": float(np.exp(log_t)), "first": first, **given})
        return log_loss(m.predict(feats), y)

    lo, hi = np.log(t0) - np.log(100.0), np.log(t0) + np.log(100.0)
    best = minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
    return ProbabilityMap("temperature", (column,), {"temperature": float(np.exp(best.x)), "first": first, **given})


def choose_map(
    feats: QueryFeatures,
    outcome: np.ndarray,
    video: np.ndarray,
    target: str,
    first_k: int,
    temperature: float,
    folds: int = 5,
) -> tuple[str, dict[str, float]]:
    """(the map kind of least cross-validated log loss, each candidate's) on these queries (the fitting half):
    ``folds`` folds by video (no video on both sides of a fold), each candidate fitted on the others and scored on
    it. Ties go to the simpler kind (softmax, temperature, isotonic, logistic)."""
    vid = np.unique(np.asarray(video), return_inverse=True)[1]
    if len(vid) == 0 or vid.max() < 1:  # no query, or one video: nothing to cross-validate; nothing fitted
        return "softmax", {}
    n_folds = int(min(folds, vid.max() + 1))
    fold_of = np.random.default_rng(0).permutation(vid.max() + 1)[vid] % n_folds  # (Q,) a video's fold
    y = np.asarray(outcome, bool)
    losses: dict[str, float] = {}
    for kind in ("softmax", "temperature", "isotonic", "logistic"):
        total = 0.0
        for f in range(n_folds):
            train, test = np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)
            if len(train) == 0 or len(test) == 0:
                continue
            m = fit_map(feats.rows(train), y[train], kind, target=target, first_k=first_k, temperature=temperature)
            total += log_loss(m.predict(feats.rows(test)), y[test]) * len(test)
        losses[kind] = total / len(y)
    return min(losses, key=losses.__getitem__), losses  # min keeps the first (simplest) of equal losses
