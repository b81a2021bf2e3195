"""Evaluation: everything the paper reports, from a run's cost file (or any cost file).

Reads the cost matrix `dab train` wrote (or a user's own cost/similarity file),
computes text-to-video and video-to-text retrieval metrics, the uncertainty
diagnostics of paper §4.4, and writes ``metrics.json``, ``report.md`` and plots.

* ``config``: EvaluateConfig;
* ``run``: ``run_evaluate``, the cost file's metrics, the store diagnostics and the report;
* ``bridge_report``: what a bridge run's bridge does per pair (the probe and the constant-bridge control);
* ``covariance_report``: what a low-rank or mixture run's text covariance does (variance share, log det, components);
* ``inputs``: the run and the cost file's split, as the bridge and covariance reports read them;
* ``examples``: the examples page and the store's thumbnails and captions it shows;
* ``zeroshot``: a zero-shot run's cost file (CLIP's mean-pooled frames, no training).
"""

from .bridge_report import CONSTANT_SHARE, bridge_report, bridge_warning  # noqa: F401
from .config import EvaluateConfig  # noqa: F401
from .covariance_report import covariance_report  # noqa: F401
from .examples import store_context  # noqa: F401
from .run import find_costs, run_evaluate, store_of  # noqa: F401
from .zeroshot import ZERO_SHOT_POOLING, write_zero_shot_costs  # noqa: F401

__all__ = [
    "EvaluateConfig",
    "run_evaluate",
    "find_costs",
    "store_of",
    "store_context",
    "bridge_report",
    "covariance_report",
    "bridge_warning",
    "CONSTANT_SHARE",
    "write_zero_shot_costs",
    "ZERO_SHOT_POOLING",
]
