"""DAB: text-conditioned pooling, probabilistic encoder, distribution bridge (paper §3).

Inputs are cached CLIP features: text ``(Q, D)`` and frames ``(V, F, D)``
(projected, not L2-normalised) with a frame mask ``(V, F)`` (False = padding of a
short video; padded frames are excluded from attention and mean pooling).

Work is split by what it depends on, so all-pairs scoring never recomputes
per-text or per-video work for every pair:

* :meth:`DABModel.encode_text` -> :class:`TextState` (text only),
* :meth:`DABModel.encode_video` -> :class:`VideoState` (video only),
* :meth:`DABModel.pair_costs` -> ``(Q, V)`` (per pair: pooling, video Gaussian,
  bridge, cost).

Variants (paper Table 5a):

* ``xpool``  X-Pool baseline: ``C = -cos(t, v_c)``, InfoNCE with a learnable logit scale.
* ``prob``   probabilistic encoder, no bridge: ``C = D(Q_v || P_t)``.
* ``bridge`` point bridge: the L2-normalised text feature is refined toward the
  L2-normalised pooled video by the same truncated drift scheme without
  variances; ``C = -cos(bridged text, v_c)`` with X-Pool's loss.
* ``dab``    the full model: ``C = D(Q_v || P_hat_t)``, P_hat the bridged text Gaussian."""

from __future__ import annotations

from ..core.choices import DIST_COSTS, VARIANTS  # noqa: F401  (re-exported)
from .bridge import ConstantShift, DistributionBridge  # noqa: F401
from .config import ModelConfig, beta_schedule, bridge_macs_per_pair_step, resolve_tau, sinusoidal_embedding, step_sizes  # noqa: F401
from .costs import COSTS, get_cost, kl_diag_gaussian, neg_cosine, w2_diag_gaussian  # noqa: F401
from .covariance import CovarianceSpec, parse_covariance  # noqa: F401
from .losses import LOSSES, contrastive_loss, infonce_loss, loss_of, pac_loss  # noqa: F401
from .network import DABModel, ModelOutput, PairDiagnostics, PairTerms, TextState, VideoState  # noqa: F401
from .pooling import TextConditionedPooling, float32_math, masked_softmax  # noqa: F401
from .probabilistic import ProbabilisticEncoder, TokenUncertainty  # noqa: F401

__all__ = [
    "VARIANTS",
    "DIST_COSTS",
    "ModelConfig",
    "TextState",
    "VideoState",
    "PairTerms",
    "ModelOutput",
    "PairDiagnostics",
    "DABModel",
    "TextConditionedPooling",
    "ProbabilisticEncoder",
    "TokenUncertainty",
    "DistributionBridge",
    "beta_schedule",
    "step_sizes",
    "sinusoidal_embedding",
    "bridge_macs_per_pair_step",
    "resolve_tau",
    "LOSSES",
    "loss_of",
    "pac_loss",
    "infonce_loss",
    "contrastive_loss",
]
