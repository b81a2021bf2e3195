"""The ``drift="constant"`` control: a bridge that shifts every text by the same learned amount.

With no video in the shift, the bridged text is a per-text state, so the engines are the
bridge-free ones (``prob``'s Gaussian cost, ``xpool``'s cosine) on shifted texts: no step
runs per pair.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ...model.covariance import mixture_moments
from ..blocks import Texts
from .base import ENGINES
from .cosine import CosineEngine
from .gaussian import GaussianEngine


@ENGINES.register("dab/constant")
class ConstantShiftEngine(GaussianEngine):
    """C = D(Q_v || N(mu_t + Delta mu, clamp(logvar_t + Delta logvar)))."""

    def texts(self, text: Tensor) -> Texts:
        out = super().texts(text)
        assert out.mu is not None and out.logvar is not None and self.model.bridge is not None
        shift = self.f32(self.model.bridge.total_shift())  # (2D,): [Delta mu, Delta logvar]
        if out.mix_mu is not None:  # mixture:K: each component shifted (the model bridges each), then the moments
            assert out.mix_logvar is not None and out.mix_logits is not None
            out.mix_mu = out.mix_mu + shift[: self.d]  # (Q, K, D)
            out.mix_logvar = (out.mix_logvar + shift[self.d :]).clamp(self.lo, self.hi)  # (Q, K, D)
            out.mu, out.logvar = mixture_moments(out.mix_mu, out.mix_logvar, out.mix_logits)
            return self.cov_pack(out)  # the shifted components' share of the KL
        out.mu = out.mu + shift[: self.d]  # (Q, D); a low-rank text's U is carried unchanged, as the model does
        out.logvar = (out.logvar + shift[self.d :]).clamp(self.lo, self.hi)  # (Q, D)
        return self.cov_pack(out)  # the shifted text's share of the KL


@ENGINES.register("bridge/constant")
class ConstantPointShiftEngine(CosineEngine):
    """C = -cos(t / |t| + Delta x, v_c): the point bridge's start shifted, then X-Pool's cosine."""

    def texts(self, text: Tensor) -> Texts:
        out = super().texts(text)
        assert self.model.bridge is not None
        x = F.normalize(text, dim=-1) + self.f32(self.model.bridge.total_shift())  # (Q, D)
        out.unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        return out
