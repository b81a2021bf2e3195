"""xpool: the cosine of the pooled video and the text (X-Pool)."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from ..blocks import Texts, Videos
from .base import ENGINES, Engine, PairCosts


@ENGINES.register("xpool")
class CosineEngine(Engine):
    """cost = -cos(t, v_c), with the norms clamped as ``neg_cosine`` does."""

    def texts(self, text: Tensor) -> Texts:
        out = super().texts(text)
        out.unit = text / text.norm(dim=-1, keepdim=True).clamp_min(1e-8)  # (Q, D)
        return out

    def pairs(self, ts: Texts, vs: Videos, keep: Optional[Tensor] = None, want_var: bool = False) -> PairCosts:
        assert ts.unit is not None
        v_c, nv, _, _ = self.pooled(vs, self.attention(ts, vs))  # (B, M, D), (B, M, 1)
        cost = -(v_c / nv.clamp_min(1e-8) * ts.unit).sum(dim=-1)  # (B, M)
        return (cost.reshape(-1)[keep] if keep is not None else cost), None, None
