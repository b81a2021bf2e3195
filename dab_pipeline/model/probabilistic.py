"""The Gaussian heads (paper §3.2): the probabilistic encoder and the video's token-based uncertainty."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .pooling import masked_softmax


class ProbabilisticEncoder(nn.Module):
    """Shared Gaussian head (paper §3.2): L2-normalise -> LayerNorm -> (mu, logvar).

    The logvar bias starts at ``logvar_init`` so every Gaussian starts at
    sigma^2 ~ e^-2; logvar is clamped to [logvar_min, logvar_max].

    ``rank`` R > 0 (``model.covariance="lowrank:R"``): a third head predicts the factor U (..., D, R) of
    ``Sigma = diag(sigma^2) + U U^T`` from the same features.  It starts small and random, never zero:
    every cost sees U only through U U^T, whose gradient w.r.t. U vanishes at U = 0.  Its weights are drawn
    with std ``0.1 sigma_init / sqrt(D)`` (and a zero bias), so U's entries start at ~0.1 sigma_init and
    U U^T at ~R / 100 of the diagonal.  R = 0 builds no third head (the default model is unchanged, its
    random draws included).
    """

    def __init__(self, dim: int, logvar_init: float, logvar_min: float, logvar_max: float, rank: int = 0) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.mu_head = nn.Linear(dim, dim)
        self.logvar_head = nn.Linear(dim, dim)
        nn.init.constant_(self.logvar_head.bias, logvar_init)
        self.logvar_min, self.logvar_max = logvar_min, logvar_max
        self.rank = rank
        self.factor_head: Optional[nn.Linear] = None
        self._rank_major_cache: Optional[tuple[tuple, tuple[Tensor, Tensor]]] = None  # see rank_major
        if rank > 0:
            self.factor_head = nn.Linear(dim, dim * rank)
            nn.init.normal_(self.factor_head.weight, std=0.1 * math.exp(0.5 * logvar_init) / math.sqrt(dim))
            nn.init.zeros_(self.factor_head.bias)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (..., D) -> mu (..., D), logvar (..., D)."""
        mu, logvar, _ = self.full(x)
        return mu, logvar

    def hidden(self, x: Tensor) -> Tensor:
        """x (..., D) -> the features every head reads, LayerNorm(x / |x|) (..., D)."""
        return self.ln(F.normalize(x, dim=-1))

    def full(self, x: Tensor) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """x (..., D) -> mu (..., D), logvar (..., D), U (..., D, R) (None without a factor head)."""
        h = self.hidden(x)  # (..., D)
        mu = self.mu_head(h)  # (..., D)
        logvar = self.logvar_head(h).clamp(self.logvar_min, self.logvar_max)  # (..., D)
        if self.factor_head is None:
            return mu, logvar, None
        return mu, logvar, self.factor(h)  # U (..., D, R)

    def factor(self, h: Tensor) -> Tensor:
        """The heads' features h (..., D) -> U (..., D, R), a view of a rank-major (..., R, D) tensor.

        The same numbers as ``factor_head(h).unflatten(-1, (D, R))`` (the head's rows are indexed (d, r), as
        trained), but the rows are taken rank-major, so each of U's R columns is contiguous over D: the costs'
        passes over U (``U * s[..., None]``, ``U^T S^-1 U``, ``A U``) then run along unit-stride rows instead of
        along an innermost axis of R (measured at R = 4, D = 512: the KL of a prob block ~1.6x faster, a whole
        prob pair 13 % cheaper with the KL's einsums, docs/model.md).
        """
        d, r = h.shape[-1], self.rank
        w, b = self.rank_major()  # (R D, D), (R D,): row r D + d
        return F.linear(h, w, b).unflatten(-1, (r, d)).mT  # (..., D, R), unit stride along D

    def rank_major(self) -> tuple[Tensor, Tensor]:
        """The factor head's weight and bias with their rows in (r, d) order: a copy, kept while the weights last.

        With gradients on (training) the copy is made per call, inside the graph.  Without, it is kept and
        made again only when a weight moves or changes in place (an optimiser step, ``load_state_dict``): a
        block of a few hundred pairs would otherwise spend as long allocating and faulting in the copy
        (4 MiB at R = 4, D = 512) as on the product.
        """
        lin = self.factor_head
        assert lin is not None
        d, r = lin.in_features, self.rank
        # weights made under inference_mode have no version counter: those are gathered each call
        keep = not torch.is_grad_enabled() and not lin.weight.is_inference()
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in (lin.weight, lin.bias)) if keep else None
        if keep and self._rank_major_cache is not None and self._rank_major_cache[0] == key:
            return self._rank_major_cache[1]
        w = lin.weight.view(d, r, d).transpose(0, 1).reshape(r * d, d)  # (R D, D)
        b = lin.bias.view(d, r).T.reshape(r * d)  # (R D,)
        if keep:
            self._rank_major_cache = (key, (w, b))
        return w, b


class MixtureHead(nn.Module):
    """The text's K mixture components (``model.covariance="mixture:K"``) around the shared head's Gaussian.

    Component k is ``N(mu + delta_k, diag(exp(logvar + eta_k)))`` with weight ``softmax(w)_k``, where
    ``(delta, eta, w)`` are linear in the shared head's features ``h`` (:meth:`ProbabilisticEncoder.hidden`).
    Only the text is a mixture: a caption is the side that is true of several different videos (the modes), a
    video is one instance; and with one video Gaussian the variational KL has its closed soft-minimum form.

    Symmetry: components that start identical get identical gradients and never separate, so each offset
    ``delta_k`` starts at its own random bias with per-coordinate std ``sigma_init / sqrt(D)``: the components
    start about one nat apart (``KL = |delta_k - delta_l|^2 / (2 sigma^2)`` ~ 1 whatever D), distinct enough
    that their responsibilities differ from the first step, close enough that the mixture starts near the
    diagonal model's Gaussian.  ``eta`` and ``w`` start at zero (equal variances, uniform weights); their
    gradients are non-zero at the first step once the offsets differ (tested).
    """

    def __init__(self, dim: int, components: int, logvar_init: float, logvar_min: float, logvar_max: float) -> None:
        super().__init__()
        self.components = components
        self.logvar_min, self.logvar_max = logvar_min, logvar_max
        self.offset = nn.Linear(dim, dim * components)
        self.logvar_offset = nn.Linear(dim, dim * components)
        self.weight = nn.Linear(dim, components)
        std = math.exp(0.5 * logvar_init) / math.sqrt(dim)
        nn.init.normal_(self.offset.weight, std=0.1 * std)
        nn.init.normal_(self.offset.bias, std=std)
        for lin in (self.logvar_offset, self.weight):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, h: Tensor, mu: Tensor, logvar: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """h, mu, logvar (..., D) -> component means and log-variances (..., K, D), weight logits (..., K)."""
        mu_k = mu[..., None, :] + self.offset(h).unflatten(-1, (self.components, h.shape[-1]))  # (..., K, D)
        lv_k = logvar[..., None, :] + self.logvar_offset(h).unflatten(-1, (self.components, h.shape[-1]))  # (..., K, D)
        return mu_k, lv_k.clamp(self.logvar_min, self.logvar_max), self.weight(h)  # ..., (..., K)


class TokenUncertainty(nn.Module):
    """Video token-based uncertainty (paper §3.2).

    ``H = SelfAttn(frames)``, ``h_bar = mean over real frames``,
    ``logvar_tok = W1 h_bar + b1 + W2 v_c + b2``.  The W1 term depends only on the
    video (:meth:`video_term`, cached in :class:`VideoState`); the W2 term on the
    pooled pair (:meth:`pair_term`).  Tokens are LayerNorm-ed before attention
    (pre-LN) because raw CLIP frame features are not normalised.  b1 = b2 =
    logvar_init / 2 so the fused logvar starts near logvar_init.
    """

    def __init__(self, dim: int, logvar_init: float) -> None:
        super().__init__()
        self.dim = dim
        self.ln = nn.LayerNorm(dim)
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.w1 = nn.Linear(dim, dim)
        self.w2 = nn.Linear(dim, dim)
        nn.init.constant_(self.w1.bias, logvar_init / 2.0)
        nn.init.constant_(self.w2.bias, logvar_init / 2.0)

    def video_term(self, frames: Tensor, mask: Tensor) -> Tensor:
        """frames (V, F, D), mask (V, F) -> W1 h_bar + b1 (V, D)."""
        x = self.ln(frames)  # (V, F, D)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (V, F, D) each
        logits = torch.einsum("vid,vjd->vij", q, k) / math.sqrt(self.dim)  # (V, F, F)
        w = masked_softmax(logits, mask[:, None, :], dim=-1)  # (V, F, F): padded keys get 0
        h = self.out_proj(torch.einsum("vij,vjd->vid", w, v))  # (V, F, D)
        m = mask.to(h.dtype)[..., None]  # (V, F, 1)
        # padded queries are excluded from the mean, so garbage frames cannot leak in
        h_bar = (h * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)  # (V, D)
        return self.w1(h_bar)  # (V, D)

    def pair_term(self, v_c: Tensor) -> Tensor:
        """v_c (..., D) -> W2 v_c + b2 (..., D)."""
        return self.w2(v_c)
