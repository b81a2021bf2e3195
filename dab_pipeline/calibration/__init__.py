"""Uncertainty a user can trust (docs/uncertainty.md): probabilities of a match calibrated on a run's validation
queries, conformal retrieval sets and answers under a risk guarantee.

``dab calibrate`` fits a :class:`Calibration` (:func:`calibrate_costs`) and writes it as the run's
calibration.json; a search reads it and :func:`assess` turns each query's costs into a
:class:`QueryUncertainty`. The measures are in :mod:`dab_pipeline.metrics.calibration`, the conformal and
risk procedures in :mod:`dab_pipeline.metrics.conformal` and :mod:`dab_pipeline.metrics.risk`.
"""

from .assess import (  # noqa: F401
    DEFAULT_CONFORMAL_SCORE,
    DEFAULT_DELTA,
    QueryUncertainty,
    UncertaintyRequest,
    assess,
    conformal_threshold,
    risk_threshold,
)
from .build import MIN_QUERIES, calibrate_costs, true_video_scores  # noqa: F401
from .features import (  # noqa: F401
    DEFAULT_FIRST_K,
    DEFAULT_K0,
    QueryFeatures,
    first_hit_outcomes,
    query_features,
    text_variance,
)
from .maps import ProbabilityMap  # noqa: F401
from .record import (  # noqa: F401
    CALIBRATION_FILE,
    Calibration,
    gallery_mismatch,
    read_calibration,
    read_run_calibration,
    write_calibration,
)

__all__ = [
    "CALIBRATION_FILE",
    "Calibration",
    "DEFAULT_CONFORMAL_SCORE",
    "DEFAULT_DELTA",
    "DEFAULT_FIRST_K",
    "DEFAULT_K0",
    "MIN_QUERIES",
    "ProbabilityMap",
    "QueryFeatures",
    "QueryUncertainty",
    "UncertaintyRequest",
    "assess",
    "calibrate_costs",
    "conformal_threshold",
    "first_hit_outcomes",
    "gallery_mismatch",
    "query_features",
    "read_calibration",
    "risk_threshold",
    "read_run_calibration",
    "text_variance",
    "true_video_scores",
    "write_calibration",
]
