"""prob: a Gaussian per text and per pair's video, scored by the distributional cost (no bridge)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..blocks import Texts, Videos, center
from .base import ENGINES, Engine, PairCosts


@ENGINES.register("prob")
class GaussianEngine(Engine):
    """C = D(Q_v || P_t), the video Gaussian computed without a (B, M, D) tensor before the heads.

    The three LayerNorm statistics of a pair (LN_attn, LN_out, and the probabilistic
    encoder's LN of v_c / |v_c|) come from small quadratic forms in the attention
    weights against per-video matrices (:meth:`videos`); one product against the
    merged basis then gives the token term and both heads (and, for DAB, the
    bridge's mu_v block).
    """

    def __init__(self, model, device, mm_dtype, batch_hint: int = 1024) -> None:
        super().__init__(model, device, mm_dtype, batch_hint)
        assert model.prob is not None and model.token_unc is not None
        pr, f32 = model.prob, self.f32
        self.gp, self.bp, self.eps_p = f32(pr.ln.weight), f32(pr.ln.bias), pr.ln.eps
        w2, b2 = f32(model.token_unc.w2.weight), f32(model.token_unc.w2.bias)
        # c basis: the token term W2 v_c + b2, a linear map of v_c (coefficients w rs1 rs2, rs2, 1)
        self.c_w = w2.T.contiguous()  # (D, D)
        self.c_rows = torch.stack([self.v_a @ self.c_w, self.v_b @ self.c_w + b2])  # (2, D)
        self.w_mu, self.b_mu = f32(pr.mu_head.weight), f32(pr.mu_head.bias)
        w_lv, b_lv = f32(pr.logvar_head.weight), f32(pr.logvar_head.bias)
        # g basis: linear maps of h = LN_p(v_c / |v_c|) (coefficients w rs1 rs2 g, rs2 g, g, 1)
        self.h_rows = torch.stack([self.gp * center(self.v_a), self.gp * center(self.v_b), self.bp])  # (3, D)
        self.gh_w = torch.cat([self.w_mu, w_lv]).T.contiguous()  # (D, 2D)
        self.gh_rows = self.h_rows @ self.gh_w
        self.gh_rows[2] += torch.cat([self.b_mu, b_lv])
        self.gt_w: Optional[Tensor] = None  # (D, H): a bridge's mu_v block (DAB sets it)
        self.gt_rows: Optional[Tensor] = None

    def texts(self, text: Tensor) -> Texts:
        out = super().texts(text)
        assert self.model.prob is not None
        out.mu, out.logvar = self.model.prob(text)  # (Q, D) each
        return out

    def videos(self, frames: Tensor, mask: Tensor) -> Videos:
        out, u, rm = self.pool_videos(frames, mask)
        m, d, n_v = self.model, self.d, frames.shape[0]
        assert m.token_unc is not None
        rm_c = center(rm)  # (V, R, D)
        v1 = self.g2 * rm_c  # (V, R, D)
        out.tok = m.token_unc.video_term(frames, mask)  # (V, D)
        # LN_attn's input is y = w @ U, so C(y) = w @ C(U) and var = w^T (C(U) C(U)^T / D) w.
        uc = center(u)  # (V, R, D)
        out.quad1 = uc @ uc.transpose(1, 2) / d  # (V, R, R)
        # C(o) = z @ A with z = [rs1 w, 1] and A = [C(Rm); C(r0)], so LN_out's variance is
        # z^T (A A^T / D) z, and v_c - m0 = rs2 (z @ A) * g2 + C(b2) (m0 = mean(b2)) gives
        # |v_c - m0|^2 = rs2^2 z^T M3 z + 2 rs2 z.k3 + |C(b2)|^2 and sum(v_c - m0) = rs2 z.k4,
        # with M3 = A diag(g2^2) A^T, k3 = A (g2 C(b2)), k4 = A g2.  Centering around m0
        # keeps the variance of v_c free of cancellation.
        a = torch.cat([rm_c, self.c0.expand(n_v, 1, d)], dim=1)  # (V, R + 1, D)
        out.quad2 = a @ a.transpose(1, 2) / d  # (V, R + 1, R + 1)
        ag = a * self.g2  # (V, R + 1, D)
        out.quad3 = torch.cat([ag @ ag.transpose(1, 2), ag @ self.b2c[:, None], a @ self.g2[:, None]], dim=2)
        # one product per pair block: coefficients [wr g, rs2 g, g, 1] against the token basis
        # (its coefficients are these over g: a zero row for the last), the heads and mu_v's block
        w_all, const = self.merged_basis()  # (D, N), (3, N)
        out.g_all = self.basis(v1, w_all, const)  # (V, R + 3, D + 2D [+ H])
        return out

    def merged_basis(self) -> tuple[Tensor, Tensor]:
        """The per-video basis's weights: v1 (V, R, D) @ w (D, N) gives its first R rows, ``const`` (3, N) the rest.

        N = D + 2D [+ H]: the token term ``v1 W2``, then the heads and (DAB) mu_v's block of
        ``h = gp * C(v1)``, whose centring and scale are folded into those columns
        (``C(v1) W = v1 (W - mean of W's rows)``), so that one product and no concatenation
        build the basis.  Built once, on first use (DAB sets ``gt_w`` after this class's init).
        """
        if getattr(self, "_merged", None) is None:
            folded = [self.gh_w] + ([self.gt_w] if self.gt_w is not None else [])
            folded = [center((self.gp[:, None] * w).T).T for w in folded]  # (D, C) each: rows' mean removed
            const = [torch.cat([self.c_rows, self.c_rows.new_zeros(1, self.d)])]  # (3, D)
            const += [self.gh_rows] + ([self.gt_rows] if self.gt_rows is not None else [])
            self._merged = (torch.cat([self.c_w, *folded], dim=1).contiguous(), torch.cat(const, dim=1))
        return self._merged

    def coefficients(self, vs: Videos, w: Tensor) -> tuple[Tensor, Tensor]:
        """Each pair's coefficients on the merged basis (B, M, R + 3) and g = 1 / (|v_c| sd(v_c / |v_c|)) (B, M, 1)."""
        d = self.d
        assert vs.quad1 is not None and vs.quad2 is not None and vs.quad3 is not None
        var1 = (torch.bmm(w, vs.quad1) * w).sum(dim=-1, keepdim=True)  # (B, M, 1)
        rs1 = torch.rsqrt(var1.clamp_min_(0.0) + self.eps1)
        one = torch.ones_like(rs1)
        z = torch.cat([w * rs1, one], dim=-1)  # (B, M, R + 1)
        var2 = (torch.bmm(z, vs.quad2) * z).sum(dim=-1, keepdim=True)  # (B, M, 1)
        rs2 = torch.rsqrt(var2.clamp_min_(0.0) + self.eps2)
        zq = torch.bmm(z, vs.quad3)  # (B, M, R + 3)
        r = z.shape[-1]
        s1 = rs2 * zq[..., r + 1 : r + 2]  # sum(v_c - m0), (B, M, 1)
        s2 = (
            rs2.square() * (zq[..., :r] * z).sum(dim=-1, keepdim=True) + 2.0 * rs2 * zq[..., r : r + 1] + self.b2c_sq
        ).clamp_min_(0.0)  # |v_c - m0|^2
        var_v = (s2 / d - (s1 / d).square()).clamp_min_(0.0)  # (B, M, 1)
        nv2 = (s2 + 2.0 * self.m0 * s1 + d * self.m0 * self.m0).clamp_min_(0.0)  # |v_c|^2
        den = nv2.sqrt().clamp_min_(1e-12)  # F.normalize's clamp
        g = torch.rsqrt(var_v / den.square() + self.eps_p) / den  # (B, M, 1)
        wr = w * (rs1 * rs2)  # (B, M, R)
        return torch.cat([wr * g, rs2 * g, g, one], dim=-1), g

    def video_gaussian(self, vs: Videos, coef_g: Tensor, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """mu_v, logvar_v (B, M, D) each and the rest of the merged product (B, M, 0 | H)."""
        d = self.d
        assert vs.g_all is not None and vs.tok is not None
        out = torch.bmm(coef_g, vs.g_all)  # (B, M, D + 2D [+ H]): [g (W2 v_c + b2) | mu | logvar | target]
        lv_raw, tok_g = out[..., 2 * d : 3 * d], out[..., :d]
        lv_v = lv_raw.clamp_(self.lo, self.hi).add_(tok_g / g).add_(vs.tok[:, None])  # (B, M, D)
        return out[..., d : 2 * d], lv_v.mul_(0.5).clamp_(self.lo, self.hi), out[..., 3 * d :]

    def pairs(self, ts: Texts, vs: Videos, keep: Optional[Tensor] = None, want_var: bool = False) -> PairCosts:
        assert ts.mu is not None and ts.logvar is not None
        w = self.attention(ts, vs)  # (B, M, R)
        pack = self.packer(keep, *w.shape[:2])
        mu_v, lv_v, _ = self.video_gaussian(vs, *self.coefficients(vs, w))
        return self.costs(pack(mu_v), pack(lv_v), pack(ts.mu), pack(ts.logvar), keep, want_var)

    def costs(
        self, mu_v: Tensor, lv_v: Tensor, mu_t: Tensor, lv_t: Tensor, keep: Optional[Tensor], want_var: bool
    ) -> PairCosts:
        """The distributional cost D(Q_v || P_t) of the (packed) pairs, with the mean variances if asked."""
        cost = self.model.cost_fn(mu_v, lv_v, mu_t, lv_t)  # (B, M) | (P, 1)
        bridged_var = video_var = None
        if want_var:
            bridged_var = lv_t.exp().mean(dim=-1).expand(cost.shape)
            video_var = lv_v.exp().mean(dim=-1)
            if keep is not None:
                bridged_var, video_var = bridged_var[:, 0], video_var[:, 0]
        return (cost[:, 0] if keep is not None else cost), bridged_var, video_var
