"""The ``drift="constant"`` control: a bridge that shifts every text by the same learned amount.

With no video in the shift, the bridged text is a per-text state, so the engines are the
bridge-free ones (``prob``'s Gaussian cost, ``xpool``'s cosine) on shifted texts: no step
runs per pair.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ..blocks import Texts
from .base import ENGINES
from .prob import GaussianEngine
from .xpool import CosineEngine


@ENGINES.register("dab/constant")
class ConstantShiftEngine(GaussianEngine):
    """C = D(Q_v || N(mu_t + Delta mu, clamp(logvar_t + Delta logvar)))."""

    def texts(self, text: Tensor) -> Texts:
        out = super().texts(text)
        assert out.mu is not None and out.logvar is not None and self.model.bridge is not None
        shift = self.f32(self.model.bridge.total_shift())  # (2D,): [Delta mu, Delta logvar]
        out.mu = out.mu + shift[: self.d]  # (Q, D)
        out.logvar = (out.logvar + shift[self.d :]).clamp(self.lo, self.hi)  # (Q, D)
        return out


@ENGINES.register("bridge/constant")
class ConstantPointShiftEngine(CosineEngine):
    """C = -cos(t / |t| + Delta x, v_c): the point bridge's start shifted, then X-Pool's cosine."""

    def texts(self, text: Tensor) -> Texts:
        out = super().texts(text)
        assert self.model.bridge is not None
        x = F.normalize(text, dim=-1) + self.f32(self.model.bridge.total_shift())  # (Q, D)
        out.unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        return out
