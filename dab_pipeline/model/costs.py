"""Pairwise costs between embeddings, as pure broadcasting functions.

Every cost is "lower is better" and reduces over the last (feature) axis, so the
same function scores one pair (D,), a batch of aligned pairs (P, D) or a grid
of pairs (Q, V, D) depending only on how the caller broadcasts its inputs.

The DAB cost is directional (paper §3.4): ``C_ij = KL(Q_vj || P_hat_ti)``, the
video Gaussian measured against the bridged text Gaussian.  Registered costs
therefore share one signature, video first::

    cost(mu_video, logvar_video, mu_text, logvar_text) -> (...)

``"cosine"`` ignores the log-variances (they may be ``None``).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ..core.registry import Registry

__all__ = [
    "COSTS",
    "CostFn",
    "kl_diag_gaussian",
    "w2_diag_gaussian",
    "neg_cosine",
    "get_cost",
]

CostFn = Callable[[Tensor, Optional[Tensor], Tensor, Optional[Tensor]], Tensor]


def kl_diag_gaussian(mu_q: Tensor, logvar_q: Tensor, mu_p: Tensor, logvar_p: Tensor) -> Tensor:
    """``KL(N(mu_q, e^logvar_q) || N(mu_p, e^logvar_p))`` summed over the last axis.

    Closed form for diagonal Gaussians (paper §3.4, with P there playing our q):
    ``1/2 sum_d [(mu_p - mu_q)^2 / s_p + s_q / s_p - 1 + log s_p - log s_q]``.
    Inputs broadcast against each other; the result has the broadcast shape
    without the last axis.
    """
    # Multiplying by exp(-logvar_p) instead of dividing by exp(logvar_p) keeps one
    # exp per element and never divides by an underflowed variance.
    inv_var_p = torch.exp(-logvar_p)  # (..., D)
    diff = mu_p - mu_q  # (..., D)
    terms = diff.square() * inv_var_p + torch.exp(logvar_q - logvar_p) - 1.0 + (logvar_p - logvar_q)  # (..., D)
    return 0.5 * terms.sum(dim=-1)  # (...)


def w2_diag_gaussian(mu_a: Tensor, logvar_a: Tensor, mu_b: Tensor, logvar_b: Tensor) -> Tensor:
    """Squared 2-Wasserstein distance between diagonal Gaussians.

    For commuting (here diagonal) covariances the Bures term reduces to
    ``||sigma_a - sigma_b||^2``, so ``W2^2 = ||mu_a - mu_b||^2 + ||sigma_a - sigma_b||^2``.
    Symmetric, unlike KL.
    """
    sigma_a = torch.exp(0.5 * logvar_a)  # (..., D)
    sigma_b = torch.exp(0.5 * logvar_b)  # (..., D)
    return (mu_a - mu_b).square().sum(dim=-1) + (sigma_a - sigma_b).square().sum(dim=-1)  # (...)


def neg_cosine(x: Tensor, y: Tensor, eps: float = 1e-8) -> Tensor:
    """``-cos(x, y)`` over the last axis (a cost in [-1, 1], lower is better)."""
    # eps guards an all-zero feature (e.g. a masked-out video) against 0/0.
    x_n = x / x.norm(dim=-1, keepdim=True).clamp_min(eps)  # (..., D)
    y_n = y / y.norm(dim=-1, keepdim=True).clamp_min(eps)  # (..., D)
    return -(x_n * y_n).sum(dim=-1)  # (...)


COSTS: Registry[CostFn] = Registry("cost")


@COSTS.register("kl")
def _kl_cost(mu_v: Tensor, logvar_v: Optional[Tensor], mu_t: Tensor, logvar_t: Optional[Tensor]) -> Tensor:
    """Directional DAB cost ``KL(Q_video || P_text)``."""
    assert logvar_v is not None and logvar_t is not None, "the KL cost needs both log-variances"
    return kl_diag_gaussian(mu_v, logvar_v, mu_t, logvar_t)


@COSTS.register("w2")
def _w2_cost(mu_v: Tensor, logvar_v: Optional[Tensor], mu_t: Tensor, logvar_t: Optional[Tensor]) -> Tensor:
    """Squared 2-Wasserstein distance (the paper's comparator, Table 5b)."""
    assert logvar_v is not None and logvar_t is not None, "the W2 cost needs both log-variances"
    return w2_diag_gaussian(mu_v, logvar_v, mu_t, logvar_t)


@COSTS.register("cosine")
def _cosine_cost(mu_v: Tensor, logvar_v: Optional[Tensor], mu_t: Tensor, logvar_t: Optional[Tensor]) -> Tensor:
    """Negative cosine between the means (point embeddings; variances unused)."""
    return neg_cosine(mu_t, mu_v)


def get_cost(name: str) -> CostFn:
    """Look a cost up by name; unknown names raise :class:`UnknownNameError` listing the valid ones."""
    # kept though dab itself calls COSTS.get: docs/model.md names get_cost as the costs' lookup by name
    return COSTS.get(name)
