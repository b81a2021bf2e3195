"""The fast scoring engines, one per model variant, chosen by name from :data:`ENGINES`.

* ``base``: the pooling, merged (every variant pools the same way), the registry and :func:`build_engine`;
* ``bridge_runner``: :class:`BridgeRunner`, the bridge's T' steps (generic, oneDNN bf16 and AMX paths);
* the families: ``cosine`` (:class:`CosineEngine`, the variant ``xpool``) and ``gaussian`` (:class:`GaussianEngine`,
  ``prob``: the video Gaussian); the bridges on top: ``point_bridge`` (the ``bridge`` ablation) and ``dab``;
* ``constant``: the bridge variants with ``drift="constant"`` (shifted texts, no steps).

A low-rank or mixture ``model.covariance`` is scored here only without a per-pair bridge (``prob``,
``dab/constant``: ``base.COVARIANCE_ENGINES``); :func:`build_engine` refuses the others (``dab``), which the Scorer
scores through ``scoring/covariance.py``.
"""

from __future__ import annotations

from .base import ENGINES, Engine, PairCosts, build_engine, engine_name  # noqa: F401
from .bridge_runner import BridgeRunner  # noqa: F401
from .constant import ConstantPointShiftEngine, ConstantShiftEngine  # noqa: F401
from .cosine import CosineEngine  # noqa: F401  (each module registers its engine)
from .dab import DABEngine  # noqa: F401
from .gaussian import GaussianEngine  # noqa: F401
from .point_bridge import PointBridgeEngine  # noqa: F401
