"""The fast engine: a model's weights merged for scoring many pairs per product."""

from __future__ import annotations

import math
from typing import Optional
import torch
import torch.nn.functional as F
from torch import Tensor
from ..cpu_kernels import Kernels, get_kernels
from ..model import DABModel, masked_softmax

from .budget import _BIAS_PAD, _center, _linears
from .blocks import _OneDNN, _Texts, _Videos, pack_kept


class _Engine:
    """The model's function, re-associated; built once per :func:`score_all` call."""

    def __init__(self, model: DABModel, device: torch.device, mm_dtype: torch.dtype, batch_hint: int = 1024) -> None:
        cfg = model.cfg
        self.model, self.cfg, self.device, self.mm_dtype = model, cfg, device, mm_dtype
        pool = model.pool
        self.d, self.heads, self.head_dim = cfg.embed_dim, pool.num_heads, pool.head_dim
        self.variant = cfg.variant

        def f32(t: Tensor) -> Tensor:
            return t.detach().to(device=device, dtype=torch.float32)

        d = self.d
        self.eps1, self.eps2 = pool.ln_attn.eps, pool.ln_out.eps
        g1, b1 = f32(pool.ln_attn.weight), f32(pool.ln_attn.bias)
        self.g2, self.b2 = f32(pool.ln_out.weight), f32(pool.ln_out.bias)
        self.g1 = g1
        self.wl_t = f32(pool.linear_proj.weight).T.contiguous()  # (D, D)
        # out_proj folded into the values, head by head: (Hh, Dh, D)
        self.wo_heads = f32(pool.out_proj.weight).reshape(d, self.heads, self.head_dim).permute(1, 2, 0).contiguous()
        self.bo = f32(pool.out_proj.bias)
        # a's constant (b1) passes through the residual and linear_proj
        self.r0 = b1 + b1 @ self.wl_t + f32(pool.linear_proj.bias)  # (D,)
        v_a, v_b = self.g2 * _center(self.r0), self.b2  # v_c's constant rows (coefficients rs2 and 1)
        self.c0 = _center(self.r0)  # (D,) C(r0), the constant row of C(o)
        self.m0 = float(self.b2.mean())  # v_c's moments are taken around mean(b2)
        self.b2c = _center(self.b2)  # (D,)
        self.b2c_sq = float(self.b2c.square().sum())
        self.lo, self.hi = cfg.logvar_min, cfg.logvar_max
        # bf16 on CPU: the bridge's products as oneDNN linears on pre-packed weights, the
        # elementwise work between them in the fused kernels (cpu_kernels.py)
        self.onednn: Optional[_OneDNN] = None
        self.kernels: Optional[Kernels] = None

        # c basis: a linear map of v_c (coefficients w rs1 rs2, rs2, 1)
        self.c_w: Optional[Tensor] = None  # (D, Cc)
        self.c_rows: Optional[Tensor] = None  # (2, Cc)
        # g basis: linear maps of h = LN_p(v_c / |v_c|) (coefficients w rs1 rs2 g, rs2 g, g, 1)
        self.gh_w = self.gt_w = self.gh_rows = self.gt_rows = None
        bridge = model.bridge
        if bridge is not None:
            lins = _linears(bridge.drift)
            width = bridge.n_state * d
            w_first = f32(lins[0].weight)  # (H, n*D + n*D + d_t)
            self.ws_t = w_first[:, :width].T.contiguous()  # (n*D, H) state block
            w_target = w_first[:, width: 2 * width]  # (H, n*D)
            self.time_feat = f32(bridge.time_features())  # (T', H), includes the first layer's bias
            self.chi = [float(c) for c in bridge.chi.detach().cpu()]
            # Hidden and output layers carry their bias as an extra input row: the hidden
            # buffers keep a column of ones, so no per-step pass copies a bias into them.
            # The rows are padded with zeros to a multiple of 16 (aligned leading
            # dimensions for AVX-512 / AMX and cuBLAS).
            def with_bias(w: Tensor, b: Tensor) -> Tensor:
                w = torch.cat([w.T, b[None]])  # (H+1, out)
                return F.pad(w, (0, 0, 0, _BIAS_PAD - 1)).to(mm_dtype)  # (H+pad, out)

            # The trajectory carries logvar / 2 (sigma = exp of it, no multiply per step):
            # the output layer's logvar rows are halved, which is exact in floating point.
            w_last, b_last = f32(lins[-1].weight).clone(), f32(lins[-1].bias).clone()  # (n*D, H), (n*D,)
            if self.variant == "dab":
                w_last[d:] *= 0.5
                b_last[d:] *= 0.5
            self.mids = [with_bias(f32(m.weight), f32(m.bias)) for m in lins[1:-1]]  # (H+pad, H) each
            self.last = with_bias(w_last, b_last)  # (H+pad, n*D)
            self.ws_t_mm = self.ws_t.to(mm_dtype)
            self.time_mm = self.time_feat.to(mm_dtype)
            if self.variant == "dab":
                w_tmu, w_tsig = w_target[:, :d], w_target[:, d:]  # (H, D) each
                self.wsig_t = w_tsig.T.contiguous().to(mm_dtype)  # (D, H)
            else:
                self.c_w = w_target.T.contiguous()  # (D, H): the point bridge's target x_v = v_c / |v_c|
                self.c_rows = torch.stack([v_a @ self.c_w, v_b @ self.c_w])
            if mm_dtype == torch.bfloat16 and device.type == "cpu":
                linears = [(w_first[:, :width], None)] + [(f32(m.weight), f32(m.bias)) for m in lins[1:-1]]
                linears += [(w_last, b_last)]
                if self.variant == "dab":
                    linears.append((w_tsig, None))
                self.onednn = _OneDNN.pack(linears, batch_hint)
                if self.onednn is not None:
                    self.kernels = get_kernels()
        if cfg.probabilistic:
            assert model.prob is not None and model.token_unc is not None
            pr = model.prob
            self.gp, self.bp, self.eps_p = f32(pr.ln.weight), f32(pr.ln.bias), pr.ln.eps
            w2, b2 = f32(model.token_unc.w2.weight), f32(model.token_unc.w2.bias)
            self.c_w = w2.T.contiguous()  # (D, D)
            self.c_rows = torch.stack([v_a @ self.c_w, v_b @ self.c_w + b2])
            w_mu, b_mu = f32(pr.mu_head.weight), f32(pr.mu_head.bias)
            w_lv, b_lv = f32(pr.logvar_head.weight), f32(pr.logvar_head.bias)
            h_rows = torch.stack([self.gp * _center(v_a), self.gp * _center(v_b), self.bp])  # (3, D)
            self.gh_w = torch.cat([w_mu, w_lv]).T.contiguous()  # (D, 2D)
            gh_b = torch.cat([b_mu, b_lv])
            self.gh_rows = h_rows @ self.gh_w
            self.gh_rows[2] += gh_b
            if self.variant == "dab":
                self.gt_w = (w_tmu @ w_mu).T.contiguous()  # (D, H): mu_v's block, applied to h directly
                self.gt_rows = h_rows @ self.gt_w
                self.gt_rows[2] += w_tmu @ b_mu

    # ------------------------------------------------------------------ per text / per video

    def texts(self, text: Tensor) -> _Texts:
        """text (Q, D) -> per-text state."""
        m = self.model
        out = _Texts(q=m.pool.query(text) * (1.0 / math.sqrt(self.head_dim)))  # (Q, Hh, Dh)
        if self.variant == "xpool":
            out.unit = text / text.norm(dim=-1, keepdim=True).clamp_min(1e-8)  # as neg_cosine
        if self.cfg.probabilistic:
            assert m.prob is not None
            out.mu, out.logvar = m.prob(text)  # (Q, D) each
        if m.bridge is not None:
            if self.variant == "dab":
                state = torch.cat([out.mu, torch.exp(0.5 * out.logvar)], dim=-1)  # (Q, 2D)
            else:
                state = F.normalize(text, dim=-1)  # (Q, D)
                out.mu = state  # the point bridge starts from the unit text
            out.first = state @ self.ws_t + self.time_feat[0]  # (Q, H)
        return out

    def videos(self, frames: Tensor, mask: Tensor) -> _Videos:
        """frames (V, F, D), mask (V, F) bool -> per-video state (bases)."""
        m, pool = self.model, self.model.pool
        n_v, n_f, d = frames.shape
        x = pool.ln_in(frames)  # (V, F, D)
        key = pool.k_proj(x).reshape(n_v, n_f, self.heads, self.head_dim)  # (V, F, Hh, Dh)
        val = pool.v_proj(x).reshape(n_v, n_f, self.heads, self.head_dim)  # (V, F, Hh, Dh)
        # the weights of each head sum to one, so out_proj's bias splits evenly over the heads
        u = torch.einsum("vfhd,hde->vhfe", val, self.wo_heads) + self.bo / self.heads  # (V, Hh, F, D)
        u = u.reshape(n_v, self.heads * n_f, d)  # (V, R, D), row r = h * F + f
        a1 = self.g1 * _center(u)  # (V, R, D)
        rm = a1 + a1 @ self.wl_t  # (V, R, D)
        out = _Videos(mask=mask, key_t=key.permute(0, 2, 3, 1).contiguous(),  # (V, Hh, Dh, F)
                      ur=torch.cat([u, rm], dim=-1))  # (V, R, 2D)
        v1 = self.g2 * _center(rm)  # (V, R, D)

        def basis(rows: Tensor, w: Tensor, const: Tensor) -> Tensor:
            return torch.cat([rows @ w, const.expand(n_v, *const.shape)], dim=1)

        if self.c_w is not None:
            assert self.c_rows is not None
            out.c_basis = basis(v1, self.c_w, self.c_rows)  # (V, R + 2, Cc)
        if self.cfg.probabilistic:
            assert m.token_unc is not None and self.gh_rows is not None
            hb = self.gp * _center(v1)  # (V, R, D)
            out.g_heads = basis(hb, self.gh_w, self.gh_rows)  # (V, R + 3, 2D)
            if self.gt_w is not None:
                out.g_target = basis(hb, self.gt_w, self.gt_rows)  # (V, R + 3, H)
            out.tok = m.token_unc.video_term(frames, mask)  # (V, D)
            # LN_attn's input is y = w @ U, so C(y) = w @ C(U) and var = w^T (C(U) C(U)^T / D) w.
            uc = _center(u)  # (V, R, D)
            out.quad1 = uc @ uc.transpose(1, 2) / d  # (V, R, R)
            # C(o) = z @ A with z = [rs1 w, 1] and A = [C(Rm); C(r0)], so LN_out's variance is
            # z^T (A A^T / D) z, and v_c - m0 = rs2 (z @ A) * g2 + C(b2) (m0 = mean(b2)) gives
            # |v_c - m0|^2 = rs2^2 z^T M3 z + 2 rs2 z.k3 + |C(b2)|^2 and sum(v_c - m0) = rs2 z.k4,
            # with M3 = A diag(g2^2) A^T, k3 = A (g2 C(b2)), k4 = A g2.  Centering around m0
            # keeps the variance of v_c free of cancellation.
            a = torch.cat([_center(rm), self.c0.expand(n_v, 1, d)], dim=1)  # (V, R + 1, D)
            out.quad2 = a @ a.transpose(1, 2) / d  # (V, R + 1, R + 1)
            ag = a * self.g2  # (V, R + 1, D)
            out.quad3 = torch.cat([ag @ ag.transpose(1, 2), ag @ self.b2c[:, None], a @ self.g2[:, None]], dim=2)
            # one product per pair block: coefficients [wr g, rs2 g, g, 1] against the token basis
            # (its coefficients are these over g: a zero row for the last), the heads and mu_v's block
            tok_basis = torch.cat([out.c_basis, out.c_basis.new_zeros(n_v, 1, out.c_basis.shape[2])], dim=1)
            parts = [tok_basis, out.g_heads] + ([out.g_target] if out.g_target is not None else [])
            out.g_all = torch.cat(parts, dim=2)  # (V, R + 3, D + 2D [+ H])
            out.c_basis = out.g_heads = out.g_target = None  # merged: not kept twice
        return out

    # ------------------------------------------------------------------ per pair

    def pairs(self, ts: _Texts, vs: _Videos, keep: Optional[Tensor] = None, want_var: bool = False
              ) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """Costs of a block of pairs laid out (B, M): row b holds video b with M texts.

        ``vs`` has B videos; the fields of ``ts`` are (1, M, ...) (a grid: the same M
        texts for every video), (B, 1, ...) (aligned: text p with video p) or
        (B, M, ...) (rows of a shortlist).  Each video's bases serve its M texts in
        one batched product.  Returns cost (B, M) or, with ``keep`` (indices into the
        flattened B * M slots, e.g. without a shortlist's padding), cost (P,), the
        slots dropped before the bridge runs.  With ``want_var`` also the mean
        sigma^2 over D of the bridged text and of the video Gaussian, same shape.
        """
        d = self.d
        n_b, n_m = len(vs), ts.q.shape[1]
        q4 = ts.q.permute(0, 2, 1, 3)  # (1 | B, Hh, M, Dh)
        logits = torch.matmul(q4, vs.key_t)  # (B, Hh, M, F)
        w = masked_softmax(logits, vs.mask[:, None, None, :], dim=-1)  # (B, Hh, M, F)
        w = w.permute(0, 2, 1, 3).reshape(n_b, n_m, -1)  # (B, M, R)
        if self.cfg.probabilistic:
            return self._pairs_gaussian(ts, vs, w, keep, want_var)
        yr = torch.bmm(w, vs.ur)  # (B, M, 2D)
        var1, _ = torch.var_mean(yr[..., :d], dim=-1, unbiased=False, keepdim=True)  # (B, M, 1)
        rs1 = torch.rsqrt(var1 + self.eps1)
        o = torch.addcmul(self.r0, yr[..., d:], rs1)  # (B, M, D)
        del yr
        var2, mean2 = torch.var_mean(o, dim=-1, unbiased=False, keepdim=True)  # (B, M, 1)
        rs2 = torch.rsqrt(var2 + self.eps2)
        v_c = o.sub_(mean2).mul_(rs2).mul_(self.g2).add_(self.b2)  # (B, M, D) LN_out(o), in place
        nv = v_c.norm(dim=-1, keepdim=True)  # (B, M, 1)
        one = torch.ones_like(rs2)
        wr = w * (rs1 * rs2)  # (B, M, R)

        def pack(x: Tensor) -> Tensor:
            return pack_kept(x, keep, n_b, n_m)

        if self.variant == "xpool":
            assert ts.unit is not None
            cost = -(v_c / nv.clamp_min(1e-8) * ts.unit).sum(dim=-1)  # (B, M), as neg_cosine
            return (cost.reshape(-1)[keep] if keep is not None else cost), None, None

        if self.variant == "bridge":
            assert self.c_w is not None and vs.c_basis is not None and ts.mu is not None and ts.first is not None
            coef = torch.cat([wr, rs2, one], dim=-1) / nv.clamp_min(1e-12)  # (B, M, R + 2): x_v = v_c / |v_c|
            target = pack(torch.bmm(coef, vs.c_basis)).to(self.mm_dtype)  # (B, M, H) | (P, 1, H)
            x = self._trajectory([pack(ts.mu)], target, pack(ts.first))[0]  # (B, M, D) | (P, 1, D)
            v_c = pack(v_c)
            # neg_cosine clamps each norm at 1e-8, as F.normalize does
            cost = -(F.normalize(x, dim=-1, eps=1e-8) * F.normalize(v_c, dim=-1, eps=1e-8)).sum(dim=-1)
            return (cost[:, 0] if keep is not None else cost), None, None

        raise AssertionError(f"unhandled variant {self.variant!r}")

    def _pairs_gaussian(self, ts: _Texts, vs: _Videos, w: Tensor, keep: Optional[Tensor], want_var: bool
                        ) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """:meth:`pairs` for prob / dab, from the attention weights w (B, M, R).

        The three LayerNorm statistics of a pair (LN_attn, LN_out, and the probabilistic
        encoder's LN of v_c / |v_c|) come from small quadratic forms in w against per-video
        matrices (:meth:`videos`), so no (B, M, D) tensor is made before the heads; one
        product against the merged basis then gives the token term, both heads and the
        bridge's mu_v block.
        """
        d, n_b, n_m = self.d, w.shape[0], w.shape[1]
        assert vs.quad1 is not None and vs.quad2 is not None and vs.quad3 is not None and vs.g_all is not None
        assert vs.tok is not None and ts.mu is not None and ts.logvar is not None
        var1 = (torch.bmm(w, vs.quad1) * w).sum(dim=-1, keepdim=True)  # (B, M, 1)
        rs1 = torch.rsqrt(var1.clamp_min_(0.0) + self.eps1)
        one = torch.ones_like(rs1)
        z = torch.cat([w * rs1, one], dim=-1)  # (B, M, R + 1)
        var2 = (torch.bmm(z, vs.quad2) * z).sum(dim=-1, keepdim=True)  # (B, M, 1)
        rs2 = torch.rsqrt(var2.clamp_min_(0.0) + self.eps2)
        zq = torch.bmm(z, vs.quad3)  # (B, M, R + 3)
        r = z.shape[-1]
        s1 = rs2 * zq[..., r + 1: r + 2]  # sum(v_c - m0), (B, M, 1)
        s2 = (rs2.square() * (zq[..., :r] * z).sum(dim=-1, keepdim=True) + 2.0 * rs2 * zq[..., r: r + 1]
              + self.b2c_sq).clamp_min_(0.0)  # |v_c - m0|^2
        var_v = (s2 / d - (s1 / d).square()).clamp_min_(0.0)  # (B, M, 1)
        nv2 = (s2 + 2.0 * self.m0 * s1 + d * self.m0 * self.m0).clamp_min_(0.0)  # |v_c|^2
        den = nv2.sqrt().clamp_min_(1e-12)  # F.normalize's clamp
        g = torch.rsqrt(var_v / den.square() + self.eps_p) / den  # (B, M, 1)
        wr = w * (rs1 * rs2)  # (B, M, R)
        coef_g = torch.cat([wr * g, rs2 * g, g, one], dim=-1)  # (B, M, R + 3)

        def pack(x: Tensor) -> Tensor:
            return pack_kept(x, keep, n_b, n_m)

        sigma_v: Optional[Tensor] = None
        if self.kernels is not None:
            # bf16 on CPU (dab): one pass from the coefficients to mu_v, lv_v, bf16 sigma_v and the
            # bf16 target block, without the (B, M, 3D + H) float32 product
            assert self.variant == "dab"
            coef_rows, g_rows = coef_g.view(n_b * n_m, -1), g.view(n_b * n_m)  # (B*M, R + 3), (B*M,)
            vidx = torch.arange(n_b).repeat_interleave(n_m)  # (B*M,) each row's video
            if keep is not None:
                coef_rows, g_rows, vidx = coef_rows[keep], g_rows[keep], vidx[keep]
            p, hidden = coef_rows.shape[0], vs.g_all.shape[2] - 3 * d
            mu_v, lv_v = torch.empty(p, d), torch.empty(p, d)  # (P, D) float32
            sigma_v = torch.empty(p, d, dtype=torch.bfloat16)  # (P, D)
            target = torch.empty(p, hidden, dtype=torch.bfloat16)  # (P, H)
            self.kernels.pair_heads_(coef_rows, g_rows, vs.g_all, vidx, vs.tok, self.lo, self.hi, mu_v, lv_v,
                                     sigma_v, target)
            shape = (n_b, n_m) if keep is None else (p, 1)
            mu_v, lv_v, target = mu_v.view(*shape, d), lv_v.view(*shape, d), target.view(*shape, hidden)
        else:
            out = torch.bmm(coef_g, vs.g_all)  # (B, M, D + 2D [+ H]): [g (W2 v_c + b2) | mu | logvar | target]
            mu_v = out[..., d: 2 * d]  # (B, M, D)
            lv_raw, tok_g = out[..., 2 * d: 3 * d], out[..., :d]
            lv_v = lv_raw.clamp_(self.lo, self.hi).add_(tok_g / g).add_(vs.tok[:, None])  # (B, M, D)
            lv_v = lv_v.mul_(0.5).clamp_(self.lo, self.hi)
            if self.variant == "dab":
                target = out[..., 3 * d:].to(self.mm_dtype)  # (B, M, H): mu_v block
                mu_v, lv_v, target = pack(mu_v), pack(lv_v), pack(target)  # (B, M, .) | (P, 1, .)
        if self.variant == "prob":
            mu_t, lv_t = ts.mu, ts.logvar  # (1 | B, M, D)
            if keep is not None:
                mu_v, lv_v, mu_t, lv_t = pack(mu_v), pack(lv_v), pack(mu_t), pack(lv_t)
        else:
            if sigma_v is None:
                sigma_v = torch.exp(0.5 * lv_v).reshape(-1, d).to(self.mm_dtype)  # (P, D)
            if self.onednn is not None:
                shape = target.shape
                target = self.onednn.add(sigma_v, target.reshape(-1, shape[-1]), -1).view(shape)  # + sigma_v block
            else:
                target.view(-1, target.shape[-1]).addmm_(sigma_v, self.wsig_t)  # + sigma_v block
            del sigma_v
            if self.onednn is not None and self.cfg.cost == "kl" and not want_var:
                # KL straight from the float32 state [mu_t, logvar_t / 2], one pass
                assert self.kernels is not None
                st = self._trajectory_onednn([pack(ts.mu), pack(ts.logvar)], target, pack(ts.first), raw=True)
                cost = self.kernels.kl_rows(mu_v.reshape(-1, d), lv_v.reshape(-1, d), st)  # (P,)
                return (cost if keep is not None else cost.view(n_b, n_m)), None, None
            mu_t, lv_t = self._trajectory([pack(ts.mu), pack(ts.logvar)], target, pack(ts.first))
        cost = self.model._cost_fn(mu_v, lv_v, mu_t, lv_t)  # (B, M) | (P, 1)
        bridged_var = video_var = None
        if want_var:
            bridged_var = lv_t.exp().mean(dim=-1).expand(cost.shape)
            video_var = lv_v.exp().mean(dim=-1)
            if keep is not None:
                bridged_var, video_var = bridged_var[:, 0], video_var[:, 0]
        return (cost[:, 0] if keep is not None else cost), bridged_var, video_var

    def _trajectory(self, state: list[Tensor], target: Tensor, first: Tensor) -> list[Tensor]:
        """T' bridge steps on the B x M pairs of a block.

        state: [mu, logvar] (dab) or [x] (point), each broadcastable to (B, M, D)
        (per text); target (B, M, H): the first layer's target block, matmul dtype;
        first: broadcastable to (B, M, H), the first step's state block plus time
        feature and bias, projected per text.  Each step is three large products
        into preallocated buffers plus in-place elementwise work.  Returns the final
        state as float32 (B, M, D) tensors.
        """
        if self.onednn is not None:
            out = self._trajectory_onednn(state, target, first)
            assert isinstance(out, list)
            return out
        n_b, n_m, hidden = target.shape
        d, p = self.d, n_b * n_m
        dab = self.variant == "dab"
        dev, mm = target.device, self.mm_dtype
        width = 2 * d if dab else d
        target = target.view(p, hidden)
        # s is the state block's input [mu, sigma] | [x].  In float32 it holds mu (or x)
        # itself, updated in place; in bf16 it is a rounded copy of the float32 state
        # st = [mu, logvar / 2] | [x], which the update converts delta into once per step.
        # Halving logvar is exact, so hv = logvar / 2 clamped to [lo/2, hi/2] is the
        # reference's logvar / 2 bit for bit, and sigma = exp(hv) needs no multiply.
        s = torch.empty(p, width, device=dev, dtype=mm)  # (P, n*D)
        f32 = mm == torch.float32
        st = s if f32 else torch.empty(p, width, device=dev, dtype=torch.float32)  # (P, n*D)
        mu = st[:, :d]  # (P, D)
        hv = (torch.empty(p, d, device=dev, dtype=torch.float32) if f32 else st[:, d:]) if dab else None
        mu.view(n_b, n_m, d).copy_(state[0])  # per-pair copies: the per-text state is never written
        if hv is not None:
            torch.mul(state[1].expand(n_b, n_m, d), 0.5, out=hv.view(n_b, n_m, d))
        delta32 = None if f32 else torch.empty(p, width, device=dev, dtype=torch.float32)
        h_a = torch.zeros(p, hidden + _BIAS_PAD, device=dev, dtype=mm)  # (P, H+pad)
        h_a[:, hidden] = 1.0  # the bias input; the rest of the padding stays 0
        h_b = h_a.clone() if self.mids else h_a
        delta = torch.empty(p, width, device=dev, dtype=mm)  # (P, n*D)
        steps = len(self.chi)
        for k in range(steps):
            pre = h_a[:, :hidden]  # (P, H) view
            if k == 0:
                # the first step's state is the text's: its block was projected once per text
                torch.add(target.view(n_b, n_m, hidden), first, out=pre.view(n_b, n_m, hidden))
            else:
                torch.add(target, self.time_mm[k], out=pre)
                pre.addmm_(s, self.ws_t_mm)  # (P, H) += [mu, sigma] W_state^T, in place (beta = 1)
            F.silu(pre, inplace=True)
            h_in = h_a
            for w_mid in self.mids:
                h_out = h_b if h_in is h_a else h_a
                torch.mm(h_in, w_mid, out=h_out[:, :hidden])  # (P, H), bias from the ones column
                F.silu(h_out[:, :hidden], inplace=True)
                h_in = h_out
            torch.mm(h_in, self.last, out=delta)  # (P, n*D)
            chi = self.chi[k]
            last = k + 1 == steps
            if f32:
                mu.add_(delta[:, :d], alpha=-chi)
                if hv is not None:
                    hv.add_(delta[:, d:], alpha=-chi)
            else:
                assert delta32 is not None
                st.add_(delta32.copy_(delta), alpha=-chi)  # [mu, logvar / 2] | [x] in float32
            if hv is not None:
                hv.clamp_(0.5 * self.lo, 0.5 * self.hi)
                if not last:
                    torch.exp(hv, out=s[:, d:])  # sigma, in the matmul dtype
            if not f32 and not last:
                s[:, :d].copy_(mu)
        out = [mu.reshape(n_b, n_m, d)]  # float32 (B, M, D)
        if hv is not None:
            out.append((hv * 2.0).view(n_b, n_m, d))
        return out

    def _trajectory_onednn(self, state: list[Tensor], target: Tensor, first: Tensor, raw: bool = False
                           ) -> list[Tensor] | Tensor:
        """:meth:`_trajectory` for bf16 on CPU: oneDNN linears and the fused kernels.

        Each step: the first layer as one linear whose epilogue adds the time feature
        (its bias) and the pair's target block (a binary post-op), SiLU in place; the
        hidden layers likewise; the output layer; then one fused pass updates the
        float32 state ``[mu, logvar / 2]`` and writes the next step's bf16 input
        ``[mu, sigma]``.  Same arithmetic as the generic bf16 path: bf16 products with
        float32 accumulation, the state in float32.
        """
        assert self.onednn is not None and self.kernels is not None
        n_b, n_m, hidden = target.shape
        d, p = self.d, n_b * n_m
        dab = self.variant == "dab"
        width = 2 * d if dab else d
        kern, lin = self.kernels, self.onednn
        target = target.reshape(p, hidden).contiguous()  # (P, H) bf16
        st = torch.empty(p, width, dtype=torch.float32)  # (P, n*D): [mu, logvar / 2] | [x]
        s = torch.empty(p, width, dtype=torch.bfloat16)  # (P, n*D): the first layer's input
        st[:, :d].view(n_b, n_m, d).copy_(state[0])
        if dab:
            torch.mul(state[1].expand(n_b, n_m, d), 0.5, out=st[:, d:].view(n_b, n_m, d))
        # the first step's state is the text's: its block was projected once per text, and
        # a grid's M texts repeat for every video (row r takes text r % M)
        first_rows = first[0] if first.shape[0] == 1 else first.expand(n_b, n_m, hidden).reshape(p, hidden)
        lo, hi = 0.5 * self.lo, 0.5 * self.hi
        steps = len(self.chi)
        for k in range(steps):
            if k == 0:
                h = torch.empty(p, hidden, dtype=torch.bfloat16)  # (P, H)
                kern.add_silu_bf16_(h, target, first_rows.float().contiguous())  # silu(target + first)
            else:
                h = lin.add(s, target, 0, bias=self.time_mm[k])  # (P, H) = s W_s^T + time_k + target
                kern.silu_bf16_(h)
            for i in range(1, len(self.mids) + 1):
                h = lin.linear(h, i)  # (P, H)
                kern.silu_bf16_(h)
            delta = lin.linear(h, len(self.mids) + 1)  # (P, n*D) bf16
            kern.bridge_update_(st, delta, s, self.chi[k], lo, hi, d, k + 1 < steps)
        if raw:
            return st  # (P, n*D) float32: [mu, logvar / 2] | [x]
        out = [st[:, :d].view(n_b, n_m, d)]  # float32 (B, M, D)
        if dab:
            out.append((st[:, d:] * 2.0).view(n_b, n_m, d))
        return out
