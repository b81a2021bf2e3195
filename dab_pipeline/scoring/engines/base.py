"""The engine base: the pooling's weights merged for scoring many pairs per product.

Every variant pools the same way; what it does with the pooled video ``v_c``
(a cosine, a point bridge, a video Gaussian, a Gaussian bridge) is its engine
subclass, registered by variant name in :data:`ENGINES`.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ...core.errors import ConfigError
from ...core.registry import Registry
from ...model import DABModel, masked_softmax
from ..blocks import Linears, Texts, Videos, center, pack_kept

# variant name -> engine class; a variant without an engine has no fast path (a Scorer says so)
ENGINES: Registry[type["Engine"]] = Registry("scoring engine")

PairCosts = tuple[Tensor, Optional[Tensor], Optional[Tensor]]  # cost, bridged_var, video_var


class Engine:
    """The model's function, re-associated; built and kept by a :class:`~dab_pipeline.scoring.Scorer`.

    Subclasses add their per-text state (:meth:`texts`), per-video bases
    (:meth:`videos`) and the per-pair cost (:meth:`pairs`).
    """

    def __init__(self, model: DABModel, device: torch.device, mm_dtype: torch.dtype, batch_hint: int = 1024) -> None:
        cfg = model.cfg
        self.model, self.cfg, self.device, self.mm_dtype = model, cfg, device, mm_dtype
        pool = model.pool
        self.d, self.heads, self.head_dim = cfg.embed_dim, pool.num_heads, pool.head_dim
        d = self.d
        self.eps1, self.eps2 = pool.ln_attn.eps, pool.ln_out.eps
        b1 = self.f32(pool.ln_attn.bias)
        self.g1 = self.f32(pool.ln_attn.weight)
        self.g2, self.b2 = self.f32(pool.ln_out.weight), self.f32(pool.ln_out.bias)
        self.wl_t = self.f32(pool.linear_proj.weight).T.contiguous()  # (D, D)
        # out_proj folded into the values, head by head: (Hh, Dh, D)
        self.wo_heads = self.f32(pool.out_proj.weight).reshape(d, self.heads, self.head_dim).permute(1, 2, 0)
        self.wo_heads = self.wo_heads.contiguous()
        self.bo = self.f32(pool.out_proj.bias)
        # a's constant (b1) passes through the residual and linear_proj
        self.r0 = b1 + b1 @ self.wl_t + self.f32(pool.linear_proj.bias)  # (D,)
        self.v_a, self.v_b = self.g2 * center(self.r0), self.b2  # v_c's constant rows (coefficients rs2 and 1)
        self.c0 = center(self.r0)  # (D,) C(r0), the constant row of C(o)
        self.m0 = float(self.b2.mean())  # v_c's moments are taken around mean(b2)
        self.b2c = center(self.b2)  # (D,)
        self.b2c_sq = float(self.b2c.square().sum())
        self.lo, self.hi = cfg.logvar_min, cfg.logvar_max
        self.batch_hint = batch_hint
        self._one: Optional[Linears] = None  # the one-text path's products and merged weights, built on first use
        self._wk: Optional[Tensor] = None

    bridge_runner = None  # the bridge engines' BridgeRunner: its T' steps

    @property
    def onednn(self):
        """The bridge's oneDNN bf16 linears, or None (no bridge, not bf16 on CPU, or unsupported)."""
        return None if self.bridge_runner is None else self.bridge_runner.onednn

    @property
    def kernels(self):
        """The fused CPU kernels the bridge uses with oneDNN, or None."""
        return None if self.bridge_runner is None else self.bridge_runner.kernels

    def f32(self, t: Tensor) -> Tensor:
        return t.detach().to(device=self.device, dtype=torch.float32)

    def f64(self, t: Tensor) -> Tensor:
        return t.detach().to(device=self.device, dtype=torch.float64)

    # ------------------------------------------------------------------ per text / per video

    def texts(self, text: Tensor) -> Texts:
        """text (Q, D) -> per-text state: the pooling queries."""
        return Texts(q=self.model.pool.query(text) * (1.0 / math.sqrt(self.head_dim)))  # (Q, Hh, Dh)

    def videos(self, frames: Tensor, mask: Tensor) -> Videos:
        """frames (V, F, D), mask (V, F) bool -> per-video state: keys and [U | Rm]."""
        return self.pool_videos(frames, mask)[0]

    def pool_videos(self, frames: Tensor, mask: Tensor) -> tuple[Videos, Tensor, Tensor]:
        """:meth:`videos`, with U and Rm (V, R, D) each, the rows of the subclasses' bases."""
        pool = self.model.pool
        n_v, n_f, d = frames.shape
        x = pool.ln_in(frames)  # (V, F, D)
        key = pool.k_proj(x).reshape(n_v, n_f, self.heads, self.head_dim)  # (V, F, Hh, Dh)
        val = pool.v_proj(x).reshape(n_v, n_f, self.heads, self.head_dim)  # (V, F, Hh, Dh)
        # the weights of each head sum to one, so out_proj's bias splits evenly over the heads
        u = torch.einsum("vfhd,hde->vhfe", val, self.wo_heads) + self.bo / self.heads  # (V, Hh, F, D)
        u = u.reshape(n_v, self.heads * n_f, d)  # (V, R, D), row r = h * F + f
        a1 = self.g1 * center(u)  # (V, R, D)
        rm = a1 + a1 @ self.wl_t  # (V, R, D)
        out = Videos(
            mask=mask,
            key_t=key.permute(0, 2, 3, 1).contiguous(),  # (V, Hh, Dh, F)
            ur=torch.cat([u, rm], dim=-1),
        )  # (V, R, 2D)
        return out, u, rm

    @staticmethod
    def basis(rows: Tensor, w: Tensor, const: Tensor) -> Tensor:
        """rows (V, R, D) @ w (D, C) with the constant rows ``const`` (K, C) appended: (V, R + K, C)."""
        return torch.cat([rows @ w, const.expand(rows.shape[0], *const.shape)], dim=1)

    # ------------------------------------------------------------------ one text, each video once

    def one_linears(self) -> Linears:
        """The products of the one-text path (:meth:`one_mats`), packed once, on first use."""
        if self._one is None:
            self._one = Linears(self.one_mats(), self.mm_dtype, self.device, self.batch_hint)
        return self._one

    def one_mats(self) -> list[tuple[Tensor, Optional[Tensor]]]:
        """(w (in, out), bias) of the one-text path's pooling products (``GaussianEngine.pool_one``), merged in
        float64: 0, LN_in's scale and shift, v_proj and out_proj on each head's weighted mean of the normalised
        frames (Hh D, D; the weights of a head sum to one); 1, ``a + linear_proj(a)`` (D, D)."""
        pool, d, hh, dh, f64 = self.model.pool, self.d, self.heads, self.head_dim, self.f64
        wv, wo = f64(pool.v_proj.weight).view(hh, dh, d), f64(pool.out_proj.weight).view(d, hh, dh)
        w_vo = torch.einsum("ehc,hcd->hde", wo, wv).reshape(hh * d, d)  # (Hh D, D): row h D + d_in
        b_vo = f64(pool.out_proj.weight) @ f64(pool.v_proj.bias) + f64(pool.out_proj.bias)  # (D,)
        g1, b1 = f64(pool.ln_in.weight).repeat(hh), f64(pool.ln_in.bias).repeat(hh)  # (Hh D,)
        w_l = torch.eye(d, dtype=torch.float64, device=self.device) + f64(pool.linear_proj.weight).T  # (D, D)
        mats = [(g1[:, None] * w_vo, b_vo + b1 @ w_vo), (w_l, f64(pool.linear_proj.bias))]
        return [(w.float(), None if b is None else b.float()) for w, b in mats]

    def pool_query(self, ts: Texts) -> Tensor:
        """The pooling's query on the normalised frames (Hh, D) of the one text of ``ts``, or (P, Hh, D) of each of
        its P texts (``one_query`` with a text a video): the keys' projection moved onto it, ``q . (W_k x + b_k) =
        (W_k^T q) . x + q . b_k``, with x = LN_in's scale and shift of the normalised frame (each adds a term the
        same for every frame of a head, which the softmax drops)."""
        if self._wk is None:  # W_k head by head, LN_in's scale on its columns: (Hh, Dh, D)
            pool = self.model.pool
            w_k = self.f32(pool.k_proj.weight).view(self.heads, self.head_dim, self.d)
            self._wk = (w_k * self.f32(pool.ln_in.weight)).contiguous()
        if ts.q.shape[0] > 1:
            return torch.einsum("phk,hkd->phd", ts.q, self._wk)  # (P, Hh, D)
        return torch.bmm(ts.q[0][:, None], self._wk)[:, 0]  # (Hh, D); 1 / sqrt(Dh) is in q

    def has_one_query(self) -> bool:
        """Whether :meth:`one_query` computes this model (else it returns None and the caller takes the model's path)."""
        return False

    def one_pairs(self, ts: Texts) -> bool:
        """Whether :meth:`one_query` takes ``ts`` as a text a video (a batch's pairs in one call); else the caller
        scores each text's videos in a call of their own."""
        return self.has_one_query()

    def one_query(self, ts: Texts, frames: Tensor, mask: Tensor, terms: Optional[Tensor] = None) -> Optional[Tensor]:
        """Costs (K,) float32 of the one text of ``ts`` with each of K videos (frames (K, F, D) float32, mask (K, F)
        bool), or of K pairs, ``ts`` a text a video (K texts: the gathered queries of a batch, :meth:`one_pairs`),
        the model's function re-associated for a text that meets each video once, without :meth:`videos`' per-video
        bases (``F`` times a pair's products, which one text cannot amortise); None where this engine has no such
        path (the caller takes the model's own). ``terms`` (K, D): the videos' cached token-branch terms
        (``GaussianEngine.video_terms``), or None to compute them."""
        return None

    # ------------------------------------------------------------------ per pair

    def attention(self, ts: Texts, vs: Videos) -> Tensor:
        """The pooling weights of a (B, M) block of pairs: w (B, M, R), R = heads x frames."""
        n_b, n_m = len(vs), ts.q.shape[1]
        q4 = ts.q.permute(0, 2, 1, 3)  # (1 | B, Hh, M, Dh)
        logits = torch.matmul(q4, vs.key_t)  # (B, Hh, M, F)
        w = masked_softmax(logits, vs.mask[:, None, None, :], dim=-1)  # (B, Hh, M, F)
        return w.permute(0, 2, 1, 3).reshape(n_b, n_m, -1)  # (B, M, R)

    def pooled(self, vs: Videos, w: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """v_c = LN_out(o) of each pair, with |v_c| and the two LayerNorms' rsqrt(var + eps) (the point variants' path)."""
        d = self.d
        yr = torch.bmm(w, vs.ur)  # (B, M, 2D)
        var1, _ = torch.var_mean(yr[..., :d], dim=-1, unbiased=False, keepdim=True)  # (B, M, 1)
        rs1 = torch.rsqrt(var1 + self.eps1)
        o = torch.addcmul(self.r0, yr[..., d:], rs1)  # (B, M, D)
        del yr
        var2, mean2 = torch.var_mean(o, dim=-1, unbiased=False, keepdim=True)  # (B, M, 1)
        rs2 = torch.rsqrt(var2 + self.eps2)
        v_c = o.sub_(mean2).mul_(rs2).mul_(self.g2).add_(self.b2)  # (B, M, D) LN_out(o), in place
        return v_c, v_c.norm(dim=-1, keepdim=True), rs1, rs2  # (B, M, D), then (B, M, 1) each

    def pairs(self, ts: Texts, vs: Videos, keep: Optional[Tensor] = None, want_var: bool = False) -> PairCosts:
        """Costs of a block of pairs laid out (B, M): row b holds video b with M texts.

        ``vs`` has B videos; the fields of ``ts`` are (1, M, ...) (a grid: the same M
        texts for every video), (B, 1, ...) (aligned: text p with video p) or
        (B, M, ...) (rows of a shortlist).  Each video's bases serve its M texts in
        one batched product.  Returns cost (B, M) or, with ``keep`` (indices into the
        flattened B * M slots, e.g. without a shortlist's padding), cost (P,), the
        slots dropped before the bridge runs.  With ``want_var`` also the mean
        sigma^2 over D of the bridged text and of the video Gaussian, same shape.
        """
        raise NotImplementedError

    @staticmethod
    def packer(keep: Optional[Tensor], n_b: int, n_m: int):
        """(1 | B, M, ...) -> the kept slots as (P, 1, ...), or unchanged when every slot is kept."""
        return lambda x: pack_kept(x, keep, n_b, n_m)


def engine_name(cfg) -> str:
    """The registry name of a model config's engine: its variant, or ``<variant>/constant`` for a constant drift."""
    return f"{cfg.variant}/constant" if cfg.uses_bridge and cfg.drift == "constant" else cfg.variant


# the engines that score a low-rank or mixture model: those without a per-pair bridge (its video Gaussian is the
# diagonal model's; only the cost step differs); dab's bridges run per component and per pair's U
COVARIANCE_ENGINES = ("prob", "dab/constant")


def engine_covers(cfg) -> bool:
    """Whether a fast engine scores a model of config ``cfg``: every diagonal one, and ``prob`` / ``dab-const`` with
    any ``model.covariance``."""
    return not cfg.gaussian or cfg.covariance_spec.kind == "diag" or engine_name(cfg) in COVARIANCE_ENGINES


def build_engine(model: DABModel, device: torch.device, mm_dtype: torch.dtype, batch_hint: int = 1024) -> Engine:
    """The registered engine of ``model``'s variant (and drift); non-diagonal Gaussians only where
    :func:`engine_covers` says so."""
    if not engine_covers(model.cfg):
        raise ConfigError(
            f"the fast engines score model.covariance={model.cfg.covariance} only for the variants without a per-pair "
            f"bridge ({', '.join(COVARIANCE_ENGINES)}); Scorer scores such a model through the reference "
            "(scoring/covariance.py)"
        )
    return ENGINES.get(engine_name(model.cfg))(model, device, mm_dtype, batch_hint)
