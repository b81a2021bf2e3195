"""The fast scoring engines, one per model variant, chosen by name from :data:`ENGINES`.

* ``base``: the pooling, merged (every variant pools the same way);
* ``trajectory``: the bridge's T' steps (generic and oneDNN bf16 paths);
* one module per variant: ``xpool`` (the cosine), ``prob`` (the video Gaussian), ``point_bridge`` (the ``bridge``
  ablation), ``dab``;
* ``constant``: the bridge variants with ``drift="constant"`` (shifted texts, no steps).
"""

from __future__ import annotations

from .base import ENGINES, Engine, PairCosts, build_engine, engine_name  # noqa: F401
from .bridge_runner import BridgeRunner  # noqa: F401
from .constant import ConstantPointShiftEngine, ConstantShiftEngine  # noqa: F401
from .cosine import CosineEngine  # noqa: F401  (each module registers its engine)
from .dab import DABEngine  # noqa: F401
from .gaussian import GaussianEngine  # noqa: F401
from .point_bridge import PointBridgeEngine  # noqa: F401
