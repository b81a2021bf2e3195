"""The eager ATen versions of the fused CPU kernels: the spec the compiled ``csrc/dab_cpu.cpp`` is tested against,
and the fallback :func:`~dab_pipeline.scoring.kernels.cpu.get_kernels` returns when the kernels cannot be built."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ...model import masked_softmax
from ...model.costs import kl_diag_gaussian

__all__ = [
    "silu_bf16_eager",
    "add_silu_bf16_eager",
    "bridge_update_eager",
    "pair_heads_eager",
    "kl_rows_eager",
    "kl_lowrank_rows_eager",
    "kl_mixture_rows_eager",
    "one_frames_eager",
    "one_token_eager",
    "one_norm_eager",
    "one_pooled_eager",
    "one_heads_eager",
]


def silu_bf16_eager(x: Tensor) -> None:
    """``x <- silu(x)`` in place; x (P, H) bfloat16."""
    F.silu(x, inplace=True)


def add_silu_bf16_eager(out: Tensor, a: Tensor, b: Tensor) -> None:
    """``out[r] <- silu(bf16(a[r] + b[r % Mb]))``; out, a (P, H) bfloat16, b (Mb, H) float32."""
    rows, mb = a.shape[0], b.shape[0]
    reps = -(-rows // mb)
    b_rows = b.expand(reps, *b.shape).reshape(reps * mb, -1)[:rows]  # (P, H): row r is b[r % Mb]
    torch.add(a, b_rows, out=out)  # float32 sum, rounded once into out
    F.silu(out, inplace=True)


def bridge_update_eager(
    st: Tensor, delta: Tensor, s: Tensor, chi: float, lo: float, hi: float, d: int, write_s: bool
) -> None:
    """One bridge step's state update, in place.

    st (P, W) float32 holds ``[mu, logvar / 2]`` (W = 2D) or ``[x]`` (W = D); delta (P, W)
    bfloat16 is the drift.  ``st -= chi * delta``; the logvar half is clamped to
    ``[lo, hi]``; with ``write_s`` the next product's input s (P, W) bfloat16 gets
    ``[mu, exp(logvar / 2)]`` (or ``[x]``).
    """
    st.add_(delta, alpha=-chi)  # (P, W) float32 += bf16, promoted
    if st.shape[1] > d:
        st[:, d:].clamp_(lo, hi)
    if write_s:
        s[:, :d].copy_(st[:, :d])
        if st.shape[1] > d:
            torch.exp(st[:, d:], out=s[:, d:])


def pair_heads_eager(
    coef: Tensor,
    g: Tensor,
    basis: Tensor,
    vidx: Tensor,
    vtok: Tensor,
    lo: float,
    hi: float,
    mu: Tensor,
    lv: Tensor,
    sigma: Tensor,
    target: Tensor,
) -> None:
    """The video side of a block of pairs, from each video's merged basis; writes the four outputs.

    coef (P, K) float32 holds each pair's coefficients and vidx (P,) int64 its video (any
    order; the engine's rows come grouped by video, one product per run); basis (V, K, 3D + H) gives
    ``out = coef[r] @ basis[vidx[r]]``, read as ``[tok_g | mu | lv_raw | target]``.  Then
    mu (P, D) float32 <- ``out[D:2D]``; lv (P, D) float32 <-
    ``clamp((clamp(lv_raw, lo, hi) + tok_g / g + vtok[vidx]) / 2, lo, hi)`` with g (P,) the
    token term's scale and vtok (V, D) the per-video token term; sigma (P, D) bfloat16 <-
    ``exp(lv / 2)``; target (P, H) bfloat16 <- ``out[3D:]``.  sigma may instead be tile-blocked,
    (Pp/16, D/32, 16, 32) with Pp = P rounded up to 16 (the AMX products' input), its padding rows 0.
    """
    d = mu.shape[1]
    out = torch.empty(coef.shape[0], basis.shape[2], dtype=torch.float32)  # (P, 3D + H)
    videos, counts = torch.unique_consecutive(vidx, return_counts=True)
    r0 = 0
    for v, n in zip(videos.tolist(), counts.tolist()):
        torch.mm(coef[r0 : r0 + n], basis[v], out=out[r0 : r0 + n])
        r0 += n
    mu.copy_(out[:, d : 2 * d])
    lv.copy_(out[:, 2 * d : 3 * d]).clamp_(lo, hi).add_(out[:, :d] / g[:, None]).add_(vtok[vidx])
    lv.mul_(0.5).clamp_(lo, hi)
    if sigma.dim() == 4:
        rows = torch.zeros(sigma.shape[0] * 16, d, dtype=sigma.dtype)  # (Pp, D)
        torch.exp(lv * 0.5, out=rows[: lv.shape[0]])
        sigma.permute(0, 2, 1, 3).copy_(rows.view(sigma.shape[0], 16, d // 32, 32))
    else:
        torch.exp(lv * 0.5, out=sigma)
    target.copy_(out[:, 3 * d :])


def kl_rows_eager(mu_v: Tensor, lv_v: Tensor, st: Tensor) -> Tensor:
    """``KL(N(mu_v, e^lv_v) || N(mu_t, e^(2 hv_t)))`` per row -> (P,) float32; st (P, 2D) = [mu_t, hv_t]."""
    d = mu_v.shape[1]
    return kl_diag_gaussian(mu_v, lv_v, st[:, :d], st[:, d:] * 2.0)


def kl_lowrank_rows_eager(mu_v: Tensor, lv_v: Tensor, u: Tensor, texts: Tensor, tconst: Tensor, rank: int) -> Tensor:
    """``KL(N(mu_v, diag(e^lv_v) + U U^T) || P_t)`` per row p, its text p % M -> (P,) float32 (covariance lowrank:R).

    mu_v, lv_v (P, D); u (P, R D), row p's U rank-major; texts (M, (3 + R_t) D) = [mu_t | 1 / s_t | 1 / s_t -
    diag(A^T A) | A's R_t rows], A the text's Woodbury factor; tconst (M,) = sum(log s_t) + log det C_t - D
    (:func:`~dab_pipeline.model.covariance.lowrank_text_pack` makes both): :func:`~dab_pipeline.model.covariance.kl_lowrank_shared_text`'s sums.
    """
    p, d = mu_v.shape
    t = texts[torch.arange(p, device=texts.device) % texts.shape[0]].view(p, -1, d)  # (P, 3 + R_t, D)
    mu_t, inv_t, e_t, a = t[:, 0], t[:, 1], t[:, 2], t[:, 3:]
    uu = u.reshape(p, rank, d)  # (P, R, D)
    diff = mu_t - mu_v  # (P, D)
    s = (torch.exp(lv_v) * e_t + (diff.square() + uu.square().sum(dim=1)) * inv_t - lv_v).sum(dim=-1)  # (P,)
    s = s - torch.bmm(a, torch.cat([uu, diff[:, None]], dim=1).mT).square().sum(dim=(-2, -1))
    gram = torch.bmm(uu * torch.exp(-lv_v)[:, None], uu.mT)  # (P, R, R)
    gram.diagonal(dim1=-2, dim2=-1).add_(1.0)
    chol = torch.linalg.cholesky(gram)
    logdet = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(dim=-1)  # (P,)
    return 0.5 * (s + tconst[torch.arange(p, device=texts.device) % texts.shape[0]] - logdet)


def kl_mixture_rows_eager(mu_v: Tensor, lv_v: Tensor, texts: Tensor, tconst: Tensor) -> Tensor:
    """``-log sum_k pi_k exp(-KL(N(mu_v, e^lv_v) || P_tk))`` per row p, its text p % M -> (P,) float32 (mixture:K).

    mu_v, lv_v (P, D); texts (M, 2 K D) = [mu_k | e^-lv_k] per component; tconst (M, 2 K) = [sum(lv_k) - D | log
    pi_k] (:func:`~dab_pipeline.model.covariance.mixture_text_pack` makes both): ``soft_min_kl`` of the components'
    diagonal KLs.
    """
    p, d = mu_v.shape
    idx = torch.arange(p, device=texts.device) % texts.shape[0]
    k = tconst.shape[1] // 2
    t = texts[idx].view(p, k, 2, d)  # (P, K, 2, D)
    c = tconst[idx]  # (P, 2 K)
    acc = (((t[:, :, 0] - mu_v[:, None]).square() + torch.exp(lv_v)[:, None]) * t[:, :, 1]).sum(dim=-1)  # (P, K)
    kl = 0.5 * (acc - lv_v.sum(dim=-1, keepdim=True) + c[:, :k])  # (P, K)
    return -torch.logsumexp(c[:, k:] - kl, dim=-1)


def one_frames_eager(frames: Tensor, mask: Tensor, qk: Tensor, eps: float, nbar: Tensor, n: Optional[Tensor]) -> None:
    """The one-text path's pass over each video's frames (``GaussianEngine.gaussian_one``); writes both outputs.

    frames (K, F, D) float32, mask (K, F) bool, qk (Hh, D) float32, or (K, Hh, D) one a video -> n (K, F, D) bf16
    or float32 (None: not written, the token branch's video terms are cached): each frame ``(x - mean) / sqrt(var +
    eps)``, a LayerNorm without its scale and shift; nbar (K, Hh, D) float32: each head's mean of the video's
    normalised frames weighted by ``masked_softmax(qk_h . n_f)`` over its real frames (from the float32 values,
    before n's rounding).
    """
    x = F.layer_norm(frames, (frames.shape[-1],), eps=eps)  # (K, F, D)
    w = masked_softmax(torch.matmul(qk, x.transpose(1, 2)), mask[:, None, :], dim=-1)  # (K, Hh, F)
    torch.bmm(w, x, out=nbar)
    if n is not None:
        n.copy_(x)


def one_token_eager(p: Tensor, n: Tensor, mask: Tensor, xo: Tensor, s: Tensor) -> None:
    """The token branch's attention of the one-text path (``GaussianEngine.token_frames``); writes both outputs.

    p, n (K, F, D), both bf16 or both float32, mask (K, F) bool -> xo (K, D) float32 ``sum_j om_j n_j`` and s (K,)
    float32 ``sum_j om_j``, om_j the mean over the real frames i of ``masked_softmax_j(p_i . n_j)`` (over the
    real frames j; a video without one: 0).
    """
    pf, nf = p.float(), n.float()
    w = masked_softmax(torch.bmm(pf, nf.transpose(1, 2)), mask[:, None, :], dim=-1)  # (K, F, F)
    m = mask.to(w.dtype)[:, None, :]  # (K, 1, F)
    om = torch.bmm(m, w).div_(m.sum(dim=-1, keepdim=True).clamp_min(1.0))  # (K, 1, F)
    xo.copy_(torch.bmm(om, nf)[:, 0])
    s.copy_(om.sum(dim=-1)[:, 0])


def one_norm_eager(y: Tensor, g: Tensor, b: Tensor, eps: float, out: Tensor) -> None:
    """``out <- LayerNorm(y)`` with scale g and shift b (D,) float32, row by row, in float32; y, out (K, D) (bf16 in
    the compiled kernel): the one-text path's LN_attn between its products."""
    out.copy_(F.layer_norm(y.float(), (y.shape[-1],), g, b, eps))


def one_pooled_eager(
    y: Tensor, g: Tensor, b: Tensor, eps: float, gp: Tensor, bp: Tensor, eps_p: float, xo: Tensor, vx: Tensor, h: Tensor
) -> None:
    """The pooled videos ``v_c = LayerNorm(y; g, b, eps)`` of the one-text path (LN_out), written with ``xo`` (K, D)
    float32 as ``vx <- [v_c | xo]`` (K, 2D), and the probabilistic head's features ``h <- LayerNorm(v_c / max(|v_c|,
    1e-12); gp, bp, eps_p)`` (K, D); y, vx, h bf16 in the compiled kernel, float32 inside."""
    d = y.shape[-1]
    v = F.layer_norm(y.float(), (d,), g, b, eps)  # (K, D)
    vx[:, :d].copy_(v)
    vx[:, d:].copy_(xo)
    h.copy_(F.layer_norm(F.normalize(v, dim=-1), (d,), gp, bp, eps_p))


def one_heads_eager(
    heads: Tensor,
    tokp: Tensor,
    s: Tensor,
    tok_e: Tensor,
    b1: Tensor,
    lo: float,
    hi: float,
    mu: Tensor,
    lv: Tensor,
    sigma: Optional[Tensor],
    target: Optional[Tensor],
) -> None:
    """The video Gaussian of the one-text path from its products; writes mu, lv and, where given, sigma and target.

    heads (K, 2D + H) = [mu | lv_raw | target] and tokp (K, D), the token terms' product (bf16 in the compiled kernel);
    s (K,), tok_e (D,), b1 (D,) or one row a video (K, D: cached video terms) float32 -> mu (K, D) float32; lv (K, D) float32 ``clamp((clamp(lv_raw, lo, hi) +
    tokp + s tok_e + b1) / 2, lo, hi)``; sigma ``exp(lv / 2)`` in its dtype, (K, D) or tile-blocked (Kp/16, D/32, 16,
    32) with Kp = K rounded up to 16 (the AMX products' input, padding rows 0); target (K, H) ``heads[:, 2D:]``.
    """
    d = mu.shape[1]
    mu.copy_(heads[:, :d])
    tok = tokp.float().addcmul_(s[:, None], tok_e).add_(b1)  # (K, D)
    lv.copy_(heads[:, d : 2 * d].float().clamp_(lo, hi).add_(tok).mul_(0.5).clamp_(lo, hi))
    if sigma is not None and sigma.dim() == 4:
        rows = torch.zeros(sigma.shape[0] * 16, d, dtype=sigma.dtype)  # (Kp, D)
        torch.exp(lv * 0.5, out=rows[: lv.shape[0]])
        sigma.permute(0, 2, 1, 3).copy_(rows.view(sigma.shape[0], 16, d // 32, 32))
    elif sigma is not None:
        sigma.copy_(torch.exp(lv * 0.5))
    if target is not None:
        target.copy_(heads[:, 2 * d :])
