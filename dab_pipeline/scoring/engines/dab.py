"""dab: the video Gaussian of :mod:`.gaussian`, the text Gaussian bridged toward it, then the cost."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..blocks import Texts, Videos
from .base import ENGINES, PairCosts
from .bridge_runner import BridgeRunner
from .gaussian import GaussianEngine


@ENGINES.register("dab")
class DABEngine(GaussianEngine):
    """C = D(Q_v || P_hat_t), P_hat_t the text Gaussian after T' bridge steps toward Q_v.

    The first drift layer's video block splits into mu_v's (merged into the video's
    basis, so one product gives it with the heads) and sigma_v's (one product per
    pair, on sigma_v = exp(logvar_v / 2)).
    """

    def __init__(self, model, device, mm_dtype, batch_hint: int = 1024) -> None:
        super().__init__(model, device, mm_dtype, batch_hint)
        d = self.d
        w_target = BridgeRunner.video_block(model.bridge, self.f32)  # (H, 2D)
        w_tmu, w_tsig = w_target[:, :d], w_target[:, d:]  # (H, D) each
        # bf16 on CPU: sigma_v's block is the oneDNN pack's last linear
        self.bridge_runner = BridgeRunner(self, extra_linears=[(w_tsig, None)], batch_hint=batch_hint)
        self.wsig_t = w_tsig.T.contiguous().to(mm_dtype)  # (D, H)
        self.gt_w = (w_tmu @ self.w_mu).T.contiguous()  # (D, H): mu_v's block, applied to h directly
        self.gt_rows = self.h_rows @ self.gt_w
        self.gt_bias = w_tmu @ self.b_mu  # (H,)
        self.gt_rows[2] += self.gt_bias

    def texts(self, text: Tensor) -> Texts:
        out = super().texts(text)
        assert out.mu is not None and out.logvar is not None
        out.first = self.bridge_runner.first(torch.cat([out.mu, torch.exp(0.5 * out.logvar)], dim=-1))  # (Q, H)
        return out

    def pairs(self, ts: Texts, vs: Videos, keep: Optional[Tensor] = None, want_var: bool = False) -> PairCosts:
        assert ts.mu is not None and ts.logvar is not None and ts.first is not None
        w = self.attention(ts, vs)  # (B, M, R)
        n_b, n_m = w.shape[:2]
        pack = self.packer(keep, n_b, n_m)
        coef_g, g = self.coefficients(vs, w)
        sigma_v: Optional[Tensor] = None
        if self.bridge_runner.kernels is not None:
            mu_v, lv_v, sigma_v, target = self._fused_heads(vs, coef_g, g, keep)
        else:
            mu_v, lv_v, rest = self.video_gaussian(vs, coef_g, g)
            mu_v, lv_v, target = pack(mu_v), pack(lv_v), pack(rest.to(self.mm_dtype))  # (B, M, .) | (P, 1, .)
        return self._bridged(ts, pack, mu_v, lv_v, sigma_v, target, keep, want_var)

    def one_query(self, ts: Texts, frames: Tensor, mask: Tensor, terms: Optional[Tensor] = None) -> Optional[Tensor]:
        """:meth:`GaussianEngine.one_query` through the bridge: the K pairs as a (K, 1) block of :meth:`pairs`."""
        if not self.has_one_query():
            return None
        n_v, d, hidden = frames.shape[0], self.d, self.gt_w.shape[1]
        sigma: Optional[Tensor] = None  # float32: the bridge's own (_bridged)
        if self.bridge_runner.amx is not None:  # tile-blocked, the AMX products' input (add_to_target)
            sigma = frames.new_empty(-(-n_v // 16), d // 32, 16, 32, dtype=torch.bfloat16)  # (Kp/16, D/32, 16, 32)
        elif self.mm_dtype != torch.float32:
            sigma = frames.new_empty(n_v, d, dtype=self.mm_dtype)
        target = frames.new_empty(n_v, hidden, dtype=self.mm_dtype)  # (K, H)
        mu_v, lv_v = self.gaussian_one(ts, frames, mask, sigma, target, terms)  # (K, D) each
        # (1, 1, ...): the text, the same for every video; or (K, 1, ...): a text a video (a batch's pairs)
        one = ts.take((None, slice(0, 1))) if ts.q.shape[0] == 1 else ts.take((slice(None), None))
        pack = self.packer(None, n_v, 1)
        cost, _, _ = self._bridged(one, pack, mu_v[:, None], lv_v[:, None], sigma, target[:, None])
        return cost.reshape(-1)  # (K,)

    def _bridged(
        self,
        ts: Texts,
        pack,
        mu_v: Tensor,
        lv_v: Tensor,
        sigma_v: Optional[Tensor],
        target: Tensor,
        keep: Optional[Tensor] = None,
        want_var: bool = False,
    ) -> PairCosts:
        """The pairs' costs from their video Gaussians (B, M, D) | (P, 1, D) and the target block (same, H) in the
        matmul dtype, to which sigma_v's block is added here (sigma_v: None, or as ``_fused_heads`` gives it)."""
        assert ts.mu is not None and ts.logvar is not None and ts.first is not None
        n_b, n_m = target.shape[:2]
        if sigma_v is None:
            sigma_v = torch.exp(0.5 * lv_v).reshape(-1, self.d).to(self.mm_dtype)  # (P, D)
        onednn, h0, first = self.bridge_runner.onednn, None, pack(ts.first)
        if (
            self.bridge_runner.amx is not None
        ):  # + sigma_v block, in place in the product's epilogue, and the first step
            h0 = self.bridge_runner.amx.add_to_target(0, sigma_v, target, first)
        elif onednn is not None:
            shape = target.shape
            target = onednn.add(sigma_v, target.reshape(-1, shape[-1]), -1).view(shape)  # + sigma_v block
        else:
            target.view(-1, target.shape[-1]).addmm_(sigma_v, self.wsig_t)  # + sigma_v block
        del sigma_v
        if onednn is not None and self.cfg.cost == "kl" and not want_var:
            # KL straight from the float32 state [mu_t, logvar_t / 2], one pass
            assert self.bridge_runner.kernels is not None
            st = self.bridge_runner.run_onednn([pack(ts.mu), pack(ts.logvar)], target, first, raw=True, h0=h0)
            cost = self.bridge_runner.kernels.kl_rows(mu_v.reshape(-1, self.d), lv_v.reshape(-1, self.d), st)  # (P,)
            return (cost if keep is not None else cost.view(n_b, n_m)), None, None
        mu_t, lv_t = self.bridge_runner.run([pack(ts.mu), pack(ts.logvar)], target, first, h0=h0)
        return self.costs(mu_v, lv_v, mu_t, lv_t, keep, want_var)

    def _fused_heads(
        self, vs: Videos, coef_g: Tensor, g: Tensor, keep: Optional[Tensor]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """bf16 on CPU: one pass from the coefficients to mu_v, logvar_v, bf16 sigma_v and the bf16 target
        block, without the (B, M, 3D + H) float32 product.  Shapes (B, M, .) or, with ``keep``, (P, 1, .)."""
        assert self.bridge_runner.kernels is not None and vs.g_all is not None and vs.tok is not None
        d, (n_b, n_m) = self.d, coef_g.shape[:2]
        coef_rows, g_rows = coef_g.view(n_b * n_m, -1), g.view(n_b * n_m)  # (B*M, R + 3), (B*M,)
        vidx = torch.arange(n_b).repeat_interleave(n_m)  # (B*M,) each row's video
        if keep is not None:
            coef_rows, g_rows, vidx = coef_rows[keep], g_rows[keep], vidx[keep]
        p, hidden = coef_rows.shape[0], vs.g_all.shape[2] - 3 * d
        mu_v, lv_v = torch.empty(p, d), torch.empty(p, d)  # (P, D) float32
        # sigma_v (P, D), or on AMX in the products' tile-blocked layout (Pp/16, D/32, 16, 32)
        pp = -(-p // 16) * 16
        sigma_v = torch.empty(
            *((pp // 16, d // 32, 16, 32) if self.bridge_runner.amx is not None else (p, d)), dtype=torch.bfloat16
        )
        target = torch.empty(p, hidden, dtype=torch.bfloat16)  # (P, H)
        self.bridge_runner.kernels.pair_heads_(
            coef_rows, g_rows, vs.g_all, vidx, vs.tok, self.lo, self.hi, mu_v, lv_v, sigma_v, target
        )
        shape = (n_b, n_m) if keep is None else (p, 1)
        return mu_v.view(*shape, d), lv_v.view(*shape, d), sigma_v, target.view(*shape, hidden)
