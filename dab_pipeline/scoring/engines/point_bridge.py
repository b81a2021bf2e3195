"""bridge: the unit text refined toward the pooled video by a point bridge, then a cosine."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..blocks import Texts, Videos, center
from .base import ENGINES, Engine, PairCosts
from .bridge_runner import BridgeRunner


@ENGINES.register("bridge")
class PointBridgeEngine(Engine):
    """cost = -cos(x_T', v_c): x_0 = t / |t|, the drift's target x_v = v_c / |v_c|."""

    def __init__(self, model, device, mm_dtype, batch_hint: int = 1024) -> None:
        super().__init__(model, device, mm_dtype, batch_hint)
        self.bridge_runner = BridgeRunner(self, batch_hint=batch_hint)
        self.c_w = self.bridge_runner.w_target.T.contiguous()  # (D, H): x_v's block, a linear map of v_c
        self.c_rows = torch.stack([self.v_a @ self.c_w, self.v_b @ self.c_w])  # (2, H)

    def texts(self, text: Tensor) -> Texts:
        out = super().texts(text)
        out.mu = F.normalize(text, dim=-1)  # (Q, D): the point bridge starts from the unit text
        out.first = self.bridge_runner.first(out.mu)  # (Q, H)
        return out

    def videos(self, frames: Tensor, mask: Tensor) -> Videos:
        out, _, rm = self.pool_videos(frames, mask)
        out.c_basis = self.basis(self.g2 * center(rm), self.c_w, self.c_rows)  # (V, R + 2, H)
        return out

    def pairs(self, ts: Texts, vs: Videos, keep: Optional[Tensor] = None, want_var: bool = False) -> PairCosts:
        assert vs.c_basis is not None and ts.mu is not None and ts.first is not None
        w = self.attention(ts, vs)  # (B, M, R)
        pack = self.packer(keep, *w.shape[:2])
        v_c, nv, rs1, rs2 = self.pooled(vs, w)
        coef = torch.cat([w * (rs1 * rs2), rs2, torch.ones_like(rs2)], dim=-1) / nv.clamp_min(1e-12)  # (B, M, R + 2)
        target = pack(torch.bmm(coef, vs.c_basis)).to(self.mm_dtype)  # (B, M, H) | (P, 1, H)
        x = self.bridge_runner.run([pack(ts.mu)], target, pack(ts.first))[0]  # (B, M, D) | (P, 1, D)
        v_c = pack(v_c)
        # neg_cosine clamps each norm at 1e-8, as F.normalize does
        cost = -(F.normalize(x, dim=-1, eps=1e-8) * F.normalize(v_c, dim=-1, eps=1e-8)).sum(dim=-1)
        return (cost[:, 0] if keep is not None else cost), None, None
