"""Beyond the diagonal: low-rank-plus-diagonal and mixture Gaussians, and their costs (issue 36, part 2).

The option ``model.covariance`` names the form of every Gaussian the heads predict:

* ``diag``: ``N(mu, diag(s))`` with ``s = exp(logvar)``, today's model (:mod:`.costs`);
* ``lowrank:R``: ``N(mu, diag(s) + U U^T)``, ``U`` of shape ``(D, R)``;
* ``mixture:K``: the text as ``K`` diagonal components with weights ``pi = softmax(logits)``,
  the video one diagonal Gaussian.

Conventions are those of :mod:`.costs`: log-variances (never variances) and means of shape
``(..., D)``, factors ``(..., D, R)``, costs reduce the feature axis, lower is better.  The
DAB cost is directional, ``C_ij = KL(Q_vj || P_ti)``: the video Gaussian (``q``) measured
against the text Gaussian (``p``).  Batch functions take ``q`` first, like
:func:`.costs.kl_diag_gaussian`; grid functions take the video first, like the registered
costs, and return ``(Q, V)``: row ``i`` a text, column ``j`` a video.

Low-rank algebra, with ``S = diag(s)``, ``Sigma = S + U U^T`` and the ``R x R`` core
``C = I + U^T S^-1 U = L L^T`` (Cholesky; its eigenvalues are >= 1, so it is always
well conditioned):

* Woodbury: ``Sigma^-1 = S^-1 - A^T A`` with the whitened factor ``A = L^-1 U^T S^-1``, (R, D);
* determinant lemma: ``log det Sigma = sum(logvar) + log det C = sum(logvar) + 2 sum log diag L``.

No ``D x D`` matrix is ever formed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ..core.errors import ConfigError
from .costs import kl_diag_gaussian

__all__ = [
    "CovarianceSpec",
    "parse_covariance",
    "kl_lowrank_gaussian",
    "kl_lowrank_grid",
    "kl_diag_grid",
    "kl_diag_to_mixture",
    "kl_mixture_grid",
    "soft_min_kl",
    "mixture_moments",
]

CovarianceKind = Literal["diag", "lowrank", "mixture"]

# the compiled scoring kernels' limits (csrc/dab_cpu.cpp): U has at most 16 columns, a mixture at most 64 components
MAX_RANK, MAX_COMPONENTS = 16, 64
VALID_FORMS = f"diag, lowrank:R (1 <= R <= {MAX_RANK}), mixture:K (2 <= K <= {MAX_COMPONENTS})"


@dataclass(frozen=True)
class CovarianceSpec:
    """A parsed ``model.covariance``: the kind, the rank R (lowrank) and the components K (mixture)."""

    kind: CovarianceKind = "diag"
    rank: int = 0  # R: columns of U; 0 unless lowrank
    components: int = 1  # K: text mixture components; 1 unless mixture

    def __str__(self) -> str:
        # the inverse of parse_covariance, so config.json records the string the user wrote
        if self.kind == "lowrank":
            return f"lowrank:{self.rank}"
        if self.kind == "mixture":
            return f"mixture:{self.components}"
        return "diag"


_SPEC = re.compile(r"(lowrank|mixture):(\d+)")


def parse_covariance(spec: str) -> CovarianceSpec:
    """``"diag"`` | ``"lowrank:R"`` (R >= 1) | ``"mixture:K"`` (K >= 2) -> :class:`CovarianceSpec`.

    Anything else raises :class:`ConfigError` with one line naming the valid forms.
    """
    bad = ConfigError(f"model.covariance={spec!r} is invalid; valid: {VALID_FORMS}")
    if not isinstance(spec, str):
        raise bad
    if spec == "diag":
        return CovarianceSpec()
    m = _SPEC.fullmatch(spec)
    if m is None:
        raise bad
    digits = m.group(2)
    n = int(digits) if len(digits) <= 6 else MAX_COMPONENTS + 1  # lowrank:99999999999999999999: out of range, said
    kind = m.group(1)
    if kind == "lowrank" and 1 <= n <= MAX_RANK:
        return CovarianceSpec(kind="lowrank", rank=n)
    if kind == "mixture" and 2 <= n <= MAX_COMPONENTS:
        return CovarianceSpec(kind="mixture", components=n)
    # lowrank:0 (that is diag: say so explicitly), mixture:1 (one component is diag too), or past the kernels' limits
    raise bad


# ---------------------------------------------------------------------------------------------
# low-rank plus diagonal


@dataclass(frozen=True)
class _Woodbury:
    """Per-Gaussian factors of ``Sigma^-1 = S^-1 - A^T A`` and ``log det C`` (the P side of a KL)."""

    inv_var: Tensor  # (..., D)     S^-1
    white: Tensor  # (..., R, D)    A = L^-1 U^T S^-1
    white_sq: Tensor  # (..., D)    diag(A^T A) = sum_r A_rd^2
    logdet_core: Tensor  # (...)    log det C


def _core_cholesky(logvar: Tensor, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(S^-1, S^-1 U, L)`` with ``L L^T = I + U^T S^-1 U``: O(D R^2) + O(R^3)."""
    inv_var = torch.exp(-logvar)  # (..., D)
    su = u * inv_var[..., None]  # (..., D, R)   S^-1 U
    eye = torch.eye(u.shape[-1], dtype=u.dtype, device=u.device)  # (R, R)
    # einsum, not u.mT @ su: a U shared along a batch axis (a text's, against the pairs' bridged variances)
    # is contracted in place instead of being copied out to every pair by matmul's broadcasting
    chol = torch.linalg.cholesky(eye + torch.einsum("...dr,...ds->...rs", u, su))  # (..., R, R)
    return inv_var, su, chol


def _logdet_from_chol(chol: Tensor) -> Tensor:
    return 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(dim=-1)  # (...)


def _woodbury(logvar: Tensor, u: Tensor) -> _Woodbury:
    """Factor ``Sigma = diag(e^logvar) + U U^T`` for its inverse and log-determinant, O(D R^2)."""
    inv_var, su, chol = _core_cholesky(logvar, u)
    # a triangular solve instead of inverting C: A = L^-1 (S^-1 U)^T
    white = torch.linalg.solve_triangular(chol, su.mT, upper=False)  # (..., R, D)
    return _Woodbury(inv_var, white, white.square().sum(dim=-2), _logdet_from_chol(chol))


def _logdet_core(logvar: Tensor, u: Tensor) -> Tensor:
    """``log det(I + U^T S^-1 U)`` = ``log det Sigma - sum(logvar)``: the Q side needs only this."""
    return _logdet_from_chol(_core_cholesky(logvar, u)[2])  # (...)


def kl_lowrank_gaussian(
    mu_q: Tensor, logvar_q: Tensor, u_q: Tensor, mu_p: Tensor, logvar_p: Tensor, u_p: Tensor
) -> Tensor:
    """``KL(N(mu_q, S_q + U_q U_q^T) || N(mu_p, S_p + U_p U_p^T))``, batch dims broadcast -> (...).

    Shapes: means and log-variances ``(..., D)``, factors ``(..., D, R_q)`` and ``(..., D, R_p)``
    (the ranks may differ, R = 0 is allowed).  Closed form, written as today's diagonal KL
    of the diagonal parts plus low-rank corrections (so ``U = 0`` gives exactly
    :func:`.costs.kl_diag_gaussian`)::

        2 KL = 2 KL_diag(S_q || S_p)
             + sum_d (U_q U_q^T)_dd / s_p,d          tr(S_p^-1 U_q U_q^T)
             - sum_d s_q,d (A_p^T A_p)_dd            -tr(A_p^T A_p S_q)
             - ||A_p U_q||_F^2                        -tr(A_p^T A_p U_q U_q^T)
             - ||A_p (mu_p - mu_q)||^2                Woodbury part of the Mahalanobis term
             + log det C_p - log det C_q              determinant lemma

    O(D R_p (R_p + R_q)) per pair plus two R x R Cholesky factorisations.  Broadcast a text
    (P) of batch shape (Q, 1) against videos (1, V) and P's factors are computed once per
    text; when every pair has its own Gaussians (the model's pooling and bridge) all of it is
    per pair: ~8x a diagonal pair at R = 4 in this eager form (benchmarks/covariance_costs.py),
    most of it P's factorisation (batched R x R products, Cholesky and the solve over D).
    """
    p = _woodbury(logvar_p, u_p)
    diff = mu_p - mu_q  # (..., D)
    # einsum rather than matmul wherever P's factors are shared along a batch axis (a text's, against V
    # videos): matmul would copy A_p out to every pair first (three passes over (..., R, D) per pair)
    trace_u = torch.einsum("...dr,...d->...", u_q.square(), p.inv_var)  # (...)
    trace_s = (torch.exp(logvar_q) * p.white_sq).sum(dim=-1)  # (...)
    cross = torch.einsum("...rd,...ds->...rs", p.white, u_q).square().sum(dim=(-2, -1))  # (...)  ||A_p U_q||_F^2
    maha = torch.einsum("...rd,...d->...r", p.white, diff).square().sum(dim=-1)  # (...)
    corr = trace_u - trace_s - cross - maha + p.logdet_core - _logdet_core(logvar_q, u_q)  # (...)
    return kl_diag_gaussian(mu_q, logvar_q, mu_p, logvar_p) + 0.5 * corr


def _blocks(n: int, chunk: int) -> list[slice]:
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return [slice(i, min(i + chunk, n)) for i in range(0, n, chunk)]


def kl_lowrank_grid(
    mu_v: Tensor,
    logvar_v: Tensor,
    u_v: Tensor,
    mu_t: Tensor,
    logvar_t: Tensor,
    u_t: Tensor,
    chunk: int = 64,
) -> Tensor:
    """All pairs ``C_ij = KL(Q_vj || P_ti)``: videos ``(V, D)``, ``(V, D, R_v)``; texts ``(Q, D)``, ``(Q, D, R_t)`` -> (Q, V).

    Where the work goes: per text, once, the Woodbury factors (O(D R_t^2) + O(R_t^3)); per
    video, once, ``log det C_v`` (O(D R_v^2)); per pair, today's diagonal KL over D
    (elementwise, with an exp) plus ``2 D + D R_t (R_v + 1)`` multiply-adds in matrix
    products (``A_t [U_v, mu_v]`` is one GEMM over all pairs of a block), i.e. O(D R^2).
    Pairs are scored in blocks of ``chunk`` texts x ``chunk`` videos, so the extra memory is
    O(chunk^2 (D + R_t R_v)) whatever Q and V.
    """
    t = _woodbury(logvar_t, u_t)
    white_mu_t = (t.white @ mu_t[..., None])[..., 0]  # (Q, R_t)
    logdet_v = _logdet_core(logvar_v, u_v)  # (V,)
    var_v, u2_v = torch.exp(logvar_v), u_v.square().sum(dim=-1)  # (V, D) each
    # [U_v, mu_v] laid out (D, V, R_v + 1) once, so a block of videos is a (D, v (R_v + 1)) view
    rhs = torch.cat([u_v, mu_v[..., None]], dim=-1).permute(1, 0, 2).contiguous()  # (D, V, R_v + 1)
    rank_t = t.white.shape[-2]
    out = mu_v.new_empty(mu_t.shape[0], mu_v.shape[0])  # (Q, V)
    for qs in _blocks(mu_t.shape[0], chunk):
        lhs = t.white[qs].reshape(-1, mu_t.shape[-1])  # (q R_t, D)
        for vs in _blocks(mu_v.shape[0], chunk):
            diag = kl_diag_gaussian(mu_v[None, vs], logvar_v[None, vs], mu_t[qs, None], logvar_t[qs, None])  # (q, v)
            # one GEMM for both products with A_t: [A_t U_v, A_t mu_v]
            prod = lhs @ rhs[:, vs].reshape(rhs.shape[0], -1)  # (q R_t, v (R_v + 1))
            prod = prod.view(diag.shape[0], rank_t, diag.shape[1], rhs.shape[-1])  # (q, R_t, v, R_v + 1)
            cross = prod[..., :-1].square().sum(dim=(1, 3))  # (q, v)
            maha = (white_mu_t[qs, :, None] - prod[..., -1]).square().sum(dim=1)  # (q, v)
            trace_u = t.inv_var[qs] @ u2_v[vs].T  # (q, v)
            trace_s = t.white_sq[qs] @ var_v[vs].T  # (q, v)
            logdets = t.logdet_core[qs, None] - logdet_v[None, vs]  # (q, v)
            out[qs, vs] = diag + 0.5 * (trace_u - trace_s - cross - maha + logdets)
    return out


def kl_lowrank_shared_text(
    mu_v: Tensor, logvar_v: Tensor, u_v: Tensor, mu_t: Tensor, logvar_t: Tensor, u_t: Tensor
) -> Tensor:
    """:func:`kl_lowrank_gaussian` of a grid block whose texts are shared by its rows: ``C_bm = KL(Q_bm || P_m)``.

    Videos: means and log-variances ``(B, M, D)`` (row b, text m: the pooled video is per pair), factors ``(B, M,
    R, D)`` rank-major; texts ``(M, D)`` and ``(M, D, R_t)`` -> (B, M).  The scoring engine's form of the same closed
    form: the traces folded into the diagonal sums (``tr(S_p^-1 S_q) - tr(A_p^T A_p S_q) = sum_d s_q,d (1 / s_p,d -
    (A_p^T A_p)_dd)``), and ``||A_p U_q^T||_F^2 + ||A_p (mu_p - mu_q)||^2`` as one GEMM per text over the block's
    rows (``[U_q; mu_p - mu_q]`` copied once text-major), never A_p copied out to each pair.
    """
    t = _woodbury(logvar_t, u_t)  # per text: S^-1, A (M, R_t, D), diag(A^T A), log det C
    n_b, n_m, rank, d = u_v.shape
    x = u_v.new_empty(n_m, n_b, rank + 1, d)  # (M, B, R + 1, D): [U_q; mu_p - mu_q], text-major
    x[:, :, :rank] = u_v.transpose(0, 1)
    diff = torch.sub(mu_t[:, None], mu_v.transpose(0, 1), out=x[:, :, rank])  # (M, B, D)
    white = torch.bmm(x.view(n_m, -1, d), t.white.mT).view(n_m, n_b, rank + 1, -1)  # (M, B, R + 1, R_t)
    quad = torch.addcmul(x[:, :, :rank].square().sum(dim=-2), diff, diff)  # (M, B, D): |U_q|^2 over r + diff^2
    var_v = torch.exp(logvar_v)  # (B, M, D)
    sums = (var_v * (t.inv_var - t.white_sq)).sum(dim=-1) - logvar_v.sum(dim=-1)  # (B, M)
    sums += (quad * t.inv_var[:, None]).sum(dim=-1).T + (logvar_t.sum(dim=-1) + t.logdet_core - d)
    sums -= white.square().sum(dim=(-2, -1)).T  # ||A_p U_q^T||_F^2 + ||A_p (mu_p - mu_q)||^2
    gram = torch.matmul(u_v * (1.0 / var_v)[..., None, :], u_v.mT)  # (B, M, R, R): U_q^T S_q^-1 U_q
    gram.diagonal(dim1=-2, dim2=-1).add_(1.0)
    return 0.5 * (sums - _logdet_from_chol(torch.linalg.cholesky(gram)))


def lowrank_text_pack(mu_t: Tensor, logvar_t: Tensor, u_t: Tensor) -> tuple[Tensor, Tensor]:
    """What a text contributes to every KL against it, packed for the engine's fused rows (``kl_lowrank_rows``):
    means (M, D), log-variances (M, D), factors (M, D, R_t) -> texts (M, (3 + R_t) D) = [mu_t | 1 / s_t | 1 / s_t -
    diag(A^T A) | A's R_t rows] (A = L^-1 U_t^T S_t^-1, :func:`kl_lowrank_gaussian`'s Woodbury factor), and the
    constant (M,) = sum(log s_t) + log det C_t - D."""
    t = _woodbury(logvar_t, u_t)
    rows = [mu_t[:, None], t.inv_var[:, None], (t.inv_var - t.white_sq)[:, None], t.white]  # (M, ., D) each
    const = logvar_t.sum(dim=-1) + t.logdet_core - mu_t.shape[-1]  # (M,)
    return torch.cat(rows, dim=1).flatten(1).contiguous(), const.contiguous()


# ---------------------------------------------------------------------------------------------
# mixtures: text K diagonal components, video one diagonal Gaussian


def kl_diag_grid(mu_v: Tensor, logvar_v: Tensor, mu_t: Tensor, logvar_t: Tensor, chunk: int = 64) -> Tensor:
    """Today's diagonal cost on all pairs, in blocks: videos (V, D), texts (Q, D) -> (Q, V), ``KL(Q_vj || P_ti)``.

    :func:`.costs.kl_diag_gaussian` broadcast over ``chunk x chunk`` blocks, so memory stays
    O(chunk^2 D); the baseline the other grids are timed against.
    """
    out = mu_v.new_empty(mu_t.shape[0], mu_v.shape[0])  # (Q, V)
    for qs in _blocks(mu_t.shape[0], chunk):
        for vs in _blocks(mu_v.shape[0], chunk):
            out[qs, vs] = kl_diag_gaussian(mu_v[None, vs], logvar_v[None, vs], mu_t[qs, None], logvar_t[qs, None])
    return out


def soft_min_kl(kl_components: Tensor, weight_logits: Tensor, dim: int = -1) -> Tensor:
    """``-log sum_k pi_k exp(-KL_k)`` along ``dim``, with ``log pi = log_softmax(logits)`` (see :func:`kl_diag_to_mixture`)."""
    # logsumexp, not a sum of exps: component KLs of hundreds of nats would underflow exp(-KL)
    return -torch.logsumexp(torch.log_softmax(weight_logits, dim=dim) - kl_components, dim=dim)


def kl_diag_to_mixture(
    mu_q: Tensor, logvar_q: Tensor, mu_p: Tensor, logvar_p: Tensor, weight_logits_p: Tensor
) -> Tensor:
    """Variational ``KL(Q || sum_k pi_k P_k)``: q ``(..., D)``; components ``(..., K, D)``, logits ``(..., K)`` -> (...).

    Hershey and Olsen (2007) approximate the KL between mixtures f = sum_a w_a f_a and
    g = sum_b pi_b g_b by::

        D_var(f || g) = sum_a w_a log [ sum_a' w_a' exp(-KL(f_a || f_a')) / sum_b pi_b exp(-KL(f_a || g_b)) ]

    With f one Gaussian Q (a single component, w = 1, KL(Q || Q) = 0) the numerator is 1::

        D_var(Q || P) = -log sum_k pi_k exp(-KL(Q || P_k))

    a soft minimum of the component KLs, each today's closed-form diagonal KL.  Properties
    (tested): exact for K = 1 and when the components coincide; an *upper bound* on the
    true KL, since E_Q log sum_k pi_k P_k >= log sum_k pi_k exp(E_Q log P_k) (Jensen with the
    variational weights phi_k ~ pi_k exp(-KL_k)); the gap is E_Q KL(phi || r(.|x)), r the
    components' responsibilities, so it is tight when r hardly varies under Q and loose as Q
    spreads over regions where different components dominate (measured in the tests: ~0 nats
    for Q near one of two separated components, 0.05-0.4 nats for overlapping components,
    several nats for Q straddling separated ones).  Weights are ``softmax(weight_logits_p)`` (raw logits welcome).
    """
    kl_k = kl_diag_gaussian(mu_q[..., None, :], logvar_q[..., None, :], mu_p, logvar_p)  # (..., K)
    return soft_min_kl(kl_k, weight_logits_p, dim=-1)


def kl_mixture_grid(
    mu_v: Tensor, logvar_v: Tensor, mu_t: Tensor, logvar_t: Tensor, weight_logits_t: Tensor, chunk: int = 64
) -> Tensor:
    """All pairs of :func:`kl_diag_to_mixture`: videos (V, D); texts (Q, K, D), logits (Q, K) -> (Q, V).

    Per pair: K diagonal KLs over D (the time) plus a logsumexp over K.  Blocks of
    ``chunk // K`` texts (``chunk`` component rows) x ``chunk`` videos, so a block is the size
    of :func:`kl_diag_grid`'s (memory O(chunk^2 D)); bigger blocks fall out of cache and cost
    more than K diagonal pairs per pair.
    """
    n_q, k, d = mu_t.shape
    out = mu_v.new_empty(n_q, mu_v.shape[0])  # (Q, V)
    for qs in _blocks(n_q, max(1, chunk // k)):
        comps_mu, comps_lv = mu_t[qs].reshape(-1, 1, d), logvar_t[qs].reshape(-1, 1, d)  # (q K, 1, D)
        log_w = weight_logits_t[qs, :, None]  # (q, K, 1)
        for vs in _blocks(mu_v.shape[0], chunk):
            kl_k = kl_diag_gaussian(mu_v[None, vs], logvar_v[None, vs], comps_mu, comps_lv)  # (q K, v)
            out[qs, vs] = soft_min_kl(kl_k.view(-1, k, kl_k.shape[-1]), log_w, dim=1)
    return out


def mixture_text_pack(mu_t: Tensor, logvar_t: Tensor, weight_logits_t: Tensor) -> tuple[Tensor, Tensor]:
    """A mixture text's share of every :func:`kl_diag_to_mixture` against it, packed for the engine's fused rows
    (``kl_mixture_rows``): components (M, K, D) x 2, logits (M, K) -> texts (M, 2 K D) = [mu_k | e^-logvar_k] per
    component, and constants (M, 2 K) = [sum(logvar_k) - D | log pi_k]."""
    texts = torch.stack([mu_t, torch.exp(-logvar_t)], dim=2).flatten(1)  # (M, K, 2, D) -> (M, 2 K D)
    const = torch.cat([logvar_t.sum(dim=-1) - mu_t.shape[-1], torch.log_softmax(weight_logits_t, dim=-1)], dim=1)
    return texts.contiguous(), const.contiguous()


def mixture_moments(mu: Tensor, logvar: Tensor, weight_logits: Tensor) -> tuple[Tensor, Tensor]:
    """The diagonal Gaussian with a mixture's mean and per-dimension variance: (..., K, D), (..., K) -> (..., D) x 2.

    ``m = sum_k pi_k mu_k`` and ``v = sum_k pi_k (s_k + mu_k^2) - m^2``, i.e. the components' mean variance plus
    the spread of their means: what a diagnostic of "the text's variance" reads for a mixture run.
    """
    pi = torch.softmax(weight_logits, dim=-1)[..., None]  # (..., K, 1)
    mean = (pi * mu).sum(dim=-2)  # (..., D)
    var = (pi * (torch.exp(logvar) + (mu - mean[..., None, :]).square())).sum(dim=-2)  # (..., D)
    return mean, torch.log(var)
