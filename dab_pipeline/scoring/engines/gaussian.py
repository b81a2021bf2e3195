"""prob: a Gaussian per text and per pair's video, scored by the distributional cost (no bridge)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ...model.costs import kl_diag_gaussian
from ...model.covariance import (
    kl_lowrank_gaussian,
    kl_lowrank_shared_text,
    lowrank_text_pack,
    mixture_moments,
    mixture_text_pack,
    soft_min_kl,
)
from ..blocks import Texts, Videos, center
from ..kernels.cpu import Kernels, eager_kernels, get_kernels
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
        heads = [(self.w_mu, self.b_mu), (f32(pr.logvar_head.weight), f32(pr.logvar_head.bias))]
        self.rank = pr.rank  # lowrank:R: U's heads follow, rank-major (R D columns), as ProbabilisticEncoder.factor
        if self.rank:
            heads.append(tuple(f32(t) for t in pr.rank_major()))  # type: ignore[arg-type]
        # g basis: linear maps of h = LN_p(v_c / |v_c|) (coefficients w rs1 rs2 g, rs2 g, g, 1)
        self.h_rows = torch.stack([self.gp * center(self.v_a), self.gp * center(self.v_b), self.bp])  # (3, D)
        self.gh_w = torch.cat([w for w, _ in heads]).T.contiguous()  # (D, 2D [+ R D])
        self.gh_rows = self.h_rows @ self.gh_w
        self.gh_rows[2] += torch.cat([b for _, b in heads])
        self.gt_w: Optional[Tensor] = None  # (D, H): a bridge's mu_v block (DAB sets it)
        self.gt_rows: Optional[Tensor] = None
        self.gt_bias: Optional[Tensor] = None  # (H,): that block on b_mu
        tok, f64 = (
            model.token_unc,
            self.f64,
        )  # the token branch's video term's constants (token_frames): s W1 (W_o (W_v b2 + b_v) + b_o) (D,), b1
        w1_o = f64(tok.w1.weight) @ f64(tok.out_proj.weight)  # (D, D)
        self.tok_e = w1_o @ (f64(tok.v_proj.weight) @ f64(tok.ln.bias) + f64(tok.v_proj.bias))
        self.tok_e = (self.tok_e + f64(tok.w1.weight) @ f64(tok.out_proj.bias)).float()
        self.tok_b1 = f32(tok.w1.bias)
        self._one_kernels: Optional[Kernels] = None
        self._one_ln: Optional[list[Tensor]] = None  # pool_one's LayerNorm scales and shifts, float32
        self._cov_kernels: Optional[Kernels] = None  # the low-rank / mixture KL rows (cov_kernels)

    def texts(self, text: Tensor) -> Texts:
        out = super().texts(text)
        m = self.model
        assert m.prob is not None
        out.mu, out.logvar, out.factor = m.prob.full(text)  # (Q, D) each; U (Q, D, R) or None
        if m.mixture is not None:  # the components; mu and logvar their moments (what the diagnostics read)
            out.mix_mu, out.mix_logvar, out.mix_logits = m.mixture(m.prob.hidden(text), out.mu, out.logvar)
            out.mu, out.logvar = mixture_moments(out.mix_mu, out.mix_logvar, out.mix_logits)
        out.text_var = out.logvar.exp().mean(dim=-1)  # (Q,): before dab-const's shift (constant.py)
        return self.cov_pack(out)

    def cov_pack(self, ts: Texts) -> Texts:
        """A low-rank or mixture text's share of every KL against it (``lowrank_text_pack``, ``mixture_text_pack``),
        once per text, before the blocks (made again by dab-const after its shift)."""
        if ts.factor is not None:
            assert ts.mu is not None and ts.logvar is not None
            ts.kl_pack, ts.kl_const = lowrank_text_pack(ts.mu, ts.logvar, ts.factor)
        elif ts.mix_mu is not None:
            assert ts.mix_logvar is not None and ts.mix_logits is not None
            ts.kl_pack, ts.kl_const = mixture_text_pack(ts.mix_mu, ts.mix_logvar, ts.mix_logits)
        return ts

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

    # ------------------------------------------------------------------ one text, each video once

    def one_mats(self) -> list[tuple[Tensor, Optional[Tensor]]]:
        """:meth:`Engine.one_mats`, then 2: the heads on h = LN_p(v_c / |v_c|), [mu | logvar [| mu_v's block of the
        bridge's first layer]] (D, 2D [+ H]); 3: the token terms on [v_c | xo], W2 over W1 W_o W_v diag(g2) (2D, D)
        (:meth:`token_frames`); 4: :meth:`token_frames`' A'' (D, D) with c''; 5: W2 alone (D, D) with b2, the token
        term's product on v_c where the videos' terms are given (``gaussian_one``'s ``terms``)."""
        m, f64 = self.model, self.f64
        assert m.prob is not None and m.token_unc is not None
        tok, root = m.token_unc, float(self.d) ** 0.5
        heads = [f64(m.prob.mu_head.weight).T, f64(m.prob.logvar_head.weight).T]  # (D, D) each
        biases = [f64(m.prob.mu_head.bias), f64(m.prob.logvar_head.bias)]
        if self.gt_w is not None and self.gt_bias is not None:  # DAB: mu_v W_tmu^T = h (W_tmu W_mu)^T + W_tmu b_mu
            heads.append(f64(self.gt_w))
            biases.append(f64(self.gt_bias))
        g2, b2 = f64(tok.ln.weight), f64(tok.ln.bias)  # x = g2 n + b2 (n: the normalised frame)
        w1_o_v = f64(tok.w1.weight) @ f64(tok.out_proj.weight) @ f64(tok.v_proj.weight)  # (D, D)
        mats = [(torch.cat(heads, dim=1), torch.cat(biases))]
        mats.append((torch.cat([f64(tok.w2.weight).T, (w1_o_v * g2).T]), f64(tok.w2.bias)))  # (2D, D)
        a = f64(tok.q_proj.weight).T @ f64(tok.k_proj.weight) / root  # (D, D): logits x_i A x_j^T + ...
        c = f64(tok.k_proj.weight).T @ f64(tok.q_proj.bias) / root  # (D,)
        mats.append((g2[:, None] * a * g2, (b2 @ a + c) * g2))
        mats.append((f64(tok.w2.weight).T, f64(tok.w2.bias)))
        return super().one_mats() + [(w.float(), None if b is None else b.float()) for w, b in mats]

    def token_frames(self, n: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """The token branch's attention over the normalised frames n (K, F, D) in the matmul dtype, mask (K, F) ->
        (xo = sum_j om_j n_j (K, D), s = sum_j om_j (K,)) float32, om_j the mean over the real query frames i of the
        weight on key j.

        :meth:`TokenUncertainty.video_term` re-associated: with x = g2 n + b2 (its LayerNorm), the logits
        ``(W_q x_i + b_q) . (W_k x_j + b_k)`` are ``(n_i A'' + c'') . n_j`` plus terms the same for every key j,
        which the softmax drops (``A'' = diag(g2) W_q^T W_k diag(g2) / sqrt(D)``, ``c'' = g2 (b2 W_q^T W_k +
        W_k^T b_q) / sqrt(D)``); the mean over i commutes with the linear maps after the attention, so the video
        term is ``W1 h_bar + b1 = W1 W_o W_v diag(g2) xo + s W1 (W_o (W_v b2 + b_v) + b_o) + b1`` (s: 1, or 0 for
        a video without a real frame), which :meth:`gaussian_one` adds with the pair's token term W2 v_c + b2."""
        n_v, d = n.shape[0], self.d
        p = self.one_linears()(n.view(-1, d), 4).view_as(n)  # (K, F, D): n_i A'' + c''
        xo, s = n.new_empty(n_v, d, dtype=torch.float32), n.new_empty(n_v, dtype=torch.float32)
        self.one_kernels().one_token_(p, n, mask, xo, s)
        return xo, s

    def pool_one(self, nbar: Tensor, xo: Tensor) -> tuple[Tensor, Tensor]:
        """The pooled videos from each head's attention-weighted mean of the normalised frames nbar (K, Hh, D)
        (``one_frames_``), with the token branch's xo (K, D): -> ([v_c | xo] (K, 2D), h = LN_p(v_c / |v_c|) (K, D)),
        the inputs of the heads' and the token terms' products, in the matmul dtype."""
        m, lin, kern = self.model, self.one_linears(), self.one_kernels()
        assert m.prob is not None
        if self._one_ln is None:  # the three LayerNorms' float32 scales and shifts, once
            self._one_ln = [
                self.f32(t) for ln in (m.pool.ln_attn, m.pool.ln_out, m.prob.ln) for t in (ln.weight, ln.bias)
            ]
        n_v, d, (g1, b1, g2, b2, gp, bp) = nbar.shape[0], self.d, self._one_ln
        a = nbar.new_empty(n_v, d, dtype=self.mm_dtype)  # LN_attn(out_proj(v_proj ...))
        kern.one_norm_(lin(nbar.reshape(n_v, -1), 0), g1, b1, m.pool.ln_attn.eps, a)
        vx, h = nbar.new_empty(n_v, 2 * d, dtype=self.mm_dtype), nbar.new_empty(n_v, d, dtype=self.mm_dtype)
        y = lin(a, 1)  # (K, D): a + linear_proj(a), before LN_out
        kern.one_pooled_(y, g2, b2, m.pool.ln_out.eps, gp, bp, m.prob.ln.eps, xo, vx, h)
        return vx, h

    def gaussian_one(
        self,
        ts: Texts,
        frames: Tensor,
        mask: Tensor,
        sigma: Optional[Tensor] = None,
        target: Optional[Tensor] = None,
        terms: Optional[Tensor] = None,
    ) -> tuple[Tensor, Tensor]:
        """The video Gaussian of one text with each of K videos -> mu_v, logvar_v (K, D) float32; where given, sigma
        <- exp(logvar_v / 2) ((K, D) or tile-blocked, ``one_heads_``) and target (K, H) <- mu_v's block of the
        bridge's first layer, in the matmul dtype.

        The frames are normalised once for both LayerNorms that read them (LN_in and the token branch's: the same
        statistics; their scales and shifts are folded into the products), by ``one_frames_``, which also pools
        them; on CPU in bf16 the compiled kernels do the per-frame passes video by video, in L1, and the row passes
        between the products in one pass each (``one_norm_``, ``one_pooled_``, ``one_heads_``).

        ``terms`` (K, D) float32: the videos' token-branch terms W1 h_bar + b1 (:func:`video_terms`, cached with an
        index): they do not depend on the text, so the token branch's attention over the frames is skipped."""
        m, lin, kern, d = self.model, self.one_linears(), self.one_kernels(), self.d
        n_v, n_f = frames.shape[:2]
        nbar = frames.new_empty(n_v, self.heads, d)  # (K, Hh, D)
        qk = self.pool_query(ts).contiguous()  # (Hh, D)
        if terms is None:
            n = frames.new_empty(n_v, n_f, d, dtype=self.mm_dtype)  # (K, F, D): the normalised frames
            kern.one_frames_(frames.contiguous(), mask.contiguous(), qk, m.pool.ln_in.eps, nbar, n)
            xo, s = self.token_frames(n, mask.contiguous())  # (K, D), (K,)
            tok_e, b1 = self.tok_e, self.tok_b1  # (D,) each: the video term is W1 W_o W_v diag(g2) xo + s tok_e + b1
        else:  # xo = 0 and s = 0 leave W2 v_c + b2 in tokp; the term, per video, takes b1's place
            kern.one_frames_(frames.contiguous(), mask.contiguous(), qk, m.pool.ln_in.eps, nbar, None)
            xo, s = frames.new_zeros(n_v, d), frames.new_zeros(n_v)
            tok_e, b1 = self.tok_e, terms.float().contiguous()  # (D,), (K, D)
        vx, h = self.pool_one(nbar, xo)  # (K, 2D), (K, D)
        heads = lin(h, 2)  # (K, 2D [+ H]): [mu | logvar [| target]]
        # (K, D): W2 v_c + b2 + W1 W_o W_v diag(g2) xo; with the terms, W2 v_c + b2 on v_c alone
        tokp = lin(vx, 3) if terms is None else lin(vx[:, :d].contiguous(), 5)
        mu, lv = frames.new_empty(n_v, d), frames.new_empty(n_v, d)
        kern.one_heads_(heads, tokp, s, tok_e, b1, self.lo, self.hi, mu, lv, sigma, target)
        return mu, lv

    def video_terms(self, frames: Tensor, mask: Tensor) -> Tensor:
        """The token branch's video terms W1 h_bar + b1 (K, D) float32 of frames (K, F, D), mask (K, F): what
        ``gaussian_one`` takes as ``terms`` (the model's own float32 function)."""
        tok = self.model.token_unc
        assert tok is not None
        return tok.video_term(frames.float(), mask).float()

    def one_query(self, ts: Texts, frames: Tensor, mask: Tensor, terms: Optional[Tensor] = None) -> Optional[Tensor]:
        assert ts.mu is not None and ts.logvar is not None
        if not self.has_one_query():
            return None
        mu_v, lv_v = self.gaussian_one(ts, frames, mask, terms=terms)  # (K, D) each
        if ts.mix_mu is not None:  # the text's components against each video: (K, 1) slots of covariance_cost
            assert ts.mix_mu.shape[0] == 1, "a mixture's texts are scored one text a call (one_pairs)"
            return self.covariance_cost(mu_v[:, None], lv_v[:, None], ts.mu, ts.logvar, ts, lambda x: x, None)[:, 0]
        return self.model.cost_fn(mu_v, lv_v, ts.mu, ts.logvar)  # (K,)

    def lowrank_block(self, mu_v: Tensor, lv_v: Tensor, u_v: Tensor, ts: Texts) -> Tensor:
        """The low-rank KL of a grid block: videos (B, M, D), U (B, M, R, D) rank-major; the block's M texts (1, M,
        ...) -> (B, M). On CPU the compiled ``kl_lowrank_rows`` (one pass over a pair's D values and factor rows,
        ~8x the eager form's rate at R = 4), else :func:`kl_lowrank_shared_text` (the same sums in ATen)."""
        kern = self.cov_kernels()
        if kern.fused and ts.kl_pack is not None and ts.kl_const is not None:
            n_b, n_m, d = mu_v.shape
            rows = kern.kl_lowrank_rows(
                mu_v.reshape(-1, d),
                lv_v.reshape(-1, d),
                u_v.reshape(n_b * n_m, -1),
                ts.kl_pack[0],
                ts.kl_const[0],
                self.rank,
            )  # (B M,): pair (b, m) is row b M + m, its text m
            return rows.view(n_b, n_m)
        assert ts.mu is not None and ts.logvar is not None and ts.factor is not None
        return kl_lowrank_shared_text(mu_v, lv_v, u_v, ts.mu[0], ts.logvar[0], ts.factor[0])

    def cov_kernels(self) -> Kernels:
        """The kernels of the low-rank KL: compiled on CPU in any dtype (float32 sums), else the eager ones."""
        if self._cov_kernels is None:
            cpu = self.device.type == "cpu"
            self._cov_kernels = get_kernels() if cpu else eager_kernels("the low-rank KL off the CPU")
        return self._cov_kernels

    def has_one_query(self) -> bool:
        """The one-text path computes this model where its LayerNorms on the frames agree (:meth:`one_applies`) and
        there is no U (lowrank:R: its heads are not on this path; the caller takes the model's own)."""
        return self.one_applies() and not self.rank

    def one_pairs(self, ts: Texts) -> bool:
        """A text a video in one call, except a mixture's texts (its components' costs take one text a call)."""
        return self.has_one_query() and ts.mix_mu is None

    def one_kernels(self) -> Kernels:
        """The per-frame passes of :meth:`gaussian_one`: the compiled kernels on CPU in bf16 (where they build), else
        their eager versions."""
        if self._one_kernels is None:
            cpu_bf16 = self.mm_dtype == torch.bfloat16 and self.device.type == "cpu"
            self._one_kernels = get_kernels() if cpu_bf16 else eager_kernels("the one-text path outside bf16 on CPU")
        return self._one_kernels

    def one_applies(self) -> bool:
        """Whether :meth:`gaussian_one` computes this model: its two LayerNorms on the frames share their statistics."""
        a, b = self.model.pool.ln_in, self.model.token_unc.ln
        return a.eps == b.eps and a.normalized_shape == b.normalized_shape == (self.d,)

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
        """mu_v, logvar_v (B, M, D) each and the rest of the merged product (B, M, 0 | H | R D): the bridge's mu_v
        block (dab) or the video's U, rank-major (lowrank:R; ``(B, M, R, D)`` after an unflatten)."""
        d = self.d
        assert vs.g_all is not None and vs.tok is not None
        out = torch.bmm(coef_g, vs.g_all)  # (B, M, D + 2D [+ H | + R D]): [g (W2 v_c + b2) | mu | logvar | rest]
        lv_raw, tok_g = out[..., 2 * d : 3 * d], out[..., :d]
        lv_v = lv_raw.clamp_(self.lo, self.hi).add_(tok_g / g).add_(vs.tok[:, None])  # (B, M, D)
        return out[..., d : 2 * d], lv_v.mul_(0.5).clamp_(self.lo, self.hi), out[..., 3 * d :]

    def pairs(self, ts: Texts, vs: Videos, keep: Optional[Tensor] = None, want_var: bool = False) -> PairCosts:
        assert ts.mu is not None and ts.logvar is not None
        w = self.attention(ts, vs)  # (B, M, R)
        pack = self.packer(keep, *w.shape[:2])
        mu_v, lv_v, rest = self.video_gaussian(vs, *self.coefficients(vs, w))
        factor = pack(rest.unflatten(-1, (self.rank, self.d)).mT) if self.rank else None  # (B, M, D, R) | (P, 1, ...)
        return self.costs(pack(mu_v), pack(lv_v), pack(ts.mu), pack(ts.logvar), keep, want_var, ts, pack, factor)

    def costs(
        self,
        mu_v: Tensor,
        lv_v: Tensor,
        mu_t: Tensor,
        lv_t: Tensor,
        keep: Optional[Tensor],
        want_var: bool,
        ts: Optional[Texts] = None,
        pack=None,
        u_v: Optional[Tensor] = None,
    ) -> PairCosts:
        """The distributional cost D(Q_v || P_t) of the (packed) pairs, with the mean variances if asked.

        A low-rank or mixture text (``ts``, its fields packed by ``pack`` as the pairs are) is scored as the model
        scores it: the low-rank KL with the video's U ``u_v`` (the text's Woodbury factors once per text of a grid
        block), or the soft minimum of the components' diagonal KLs."""
        if ts is not None and (ts.factor is not None or ts.mix_mu is not None):
            cost = self.covariance_cost(mu_v, lv_v, mu_t, lv_t, ts, pack, u_v)
        else:
            cost = self.model.cost_fn(mu_v, lv_v, mu_t, lv_t)  # (B, M) | (P, 1)
        bridged_var = video_var = None
        if want_var:
            bridged_var = lv_t.exp().mean(dim=-1).expand(cost.shape)
            video_var = lv_v.exp().mean(dim=-1)
            if keep is not None:
                bridged_var, video_var = bridged_var[:, 0], video_var[:, 0]
        return (cost[:, 0] if keep is not None else cost), bridged_var, video_var

    def covariance_cost(
        self, mu_v: Tensor, lv_v: Tensor, mu_t: Tensor, lv_t: Tensor, ts: Texts, pack, u_v: Optional[Tensor]
    ) -> Tensor:
        """:meth:`costs` of a low-rank or mixture text: (B, M) | (P, 1), as ``DABModel.pair_terms`` computes it."""
        if ts.factor is not None:
            assert u_v is not None, "a low-rank text is scored with the video's factor"
            if ts.factor.shape[0] == 1 and mu_v.shape[0] > 1 and u_v.shape[1] == ts.factor.shape[1]:
                return self.lowrank_block(mu_v, lv_v, u_v.mT, ts)  # a grid block: its M texts shared by its rows
            return kl_lowrank_gaussian(mu_v, lv_v, u_v, mu_t, lv_t, pack(ts.factor))
        assert ts.mix_logvar is not None and ts.mix_logits is not None
        kern = self.cov_kernels()
        if kern.fused and ts.mix_logits.shape[0] == 1 and mu_v.shape[0] > 1 and mu_v.shape[1] == ts.mix_logits.shape[1]:
            assert ts.kl_pack is not None and ts.kl_const is not None  # a grid block: its M texts shared by its rows
            n_b, n_m, d = mu_v.shape
            rows = kern.kl_mixture_rows(mu_v.reshape(-1, d), lv_v.reshape(-1, d), ts.kl_pack[0], ts.kl_const[0])
            return rows.view(n_b, n_m)  # pair (b, m) is row b M + m, its text m
        kl_k = kl_diag_gaussian(mu_v[..., None, :], lv_v[..., None, :], pack(ts.mix_mu), pack(ts.mix_logvar))
        return soft_min_kl(kl_k, pack(ts.mix_logits))  # (B, M, K) -> (B, M) | (P, 1)
