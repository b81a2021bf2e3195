"""Costs against naive references on seeded random inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Independent, Normal, kl_divergence

from dab_pipeline.core.errors import UnknownNameError
from dab_pipeline.model.costs import COSTS, get_cost, kl_diag_gaussian, neg_cosine, w2_diag_gaussian


def _gauss(gen: torch.Generator, *shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    mu = torch.randn(*shape, generator=gen, dtype=torch.float64)
    logvar = torch.empty(*shape, dtype=torch.float64).uniform_(-4.0, 2.0, generator=gen)
    return mu, logvar


def _normal(mu: torch.Tensor, logvar: torch.Tensor) -> Independent:
    return Independent(Normal(mu, torch.exp(0.5 * logvar)), 1)


def test_kl_matches_torch_distributions() -> None:
    gen = torch.Generator().manual_seed(0)
    mu_q, lv_q = _gauss(gen, 7, 24)
    mu_p, lv_p = _gauss(gen, 7, 24)
    ours = kl_diag_gaussian(mu_q, lv_q, mu_p, lv_p)  # (7,)
    ref = kl_divergence(_normal(mu_q, lv_q), _normal(mu_p, lv_p))  # (7,)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_kl_broadcasts_to_a_grid() -> None:
    gen = torch.Generator().manual_seed(1)
    mu_v, lv_v = _gauss(gen, 1, 5, 16)  # videos along axis 1
    mu_t, lv_t = _gauss(gen, 3, 1, 16)  # texts along axis 0
    grid = kl_diag_gaussian(mu_v, lv_v, mu_t, lv_t)  # (3, 5)
    assert grid.shape == (3, 5)
    for i in range(3):
        for j in range(5):
            ref = kl_divergence(_normal(mu_v[0, j], lv_v[0, j]), _normal(mu_t[i, 0], lv_t[i, 0]))
            assert grid[i, j].item() == pytest.approx(ref.item(), rel=1e-10)


def test_kl_is_zero_on_itself_and_directional() -> None:
    gen = torch.Generator().manual_seed(2)
    mu, lv = _gauss(gen, 4, 8)
    assert torch.allclose(kl_diag_gaussian(mu, lv, mu, lv), torch.zeros(4, dtype=torch.float64))
    mu2, lv2 = _gauss(gen, 4, 8)
    assert not torch.allclose(kl_diag_gaussian(mu, lv, mu2, lv2), kl_diag_gaussian(mu2, lv2, mu, lv))


def test_w2_matches_naive_per_dimension_formula() -> None:
    gen = torch.Generator().manual_seed(3)
    mu_a, lv_a = _gauss(gen, 6, 10)
    mu_b, lv_b = _gauss(gen, 6, 10)
    ours = w2_diag_gaussian(mu_a, lv_a, mu_b, lv_b)
    for n in range(6):
        ref = 0.0
        for d in range(10):
            sa, sb = math.exp(0.5 * lv_a[n, d].item()), math.exp(0.5 * lv_b[n, d].item())
            ref += (mu_a[n, d].item() - mu_b[n, d].item()) ** 2 + (sa - sb) ** 2
        assert ours[n].item() == pytest.approx(ref, rel=1e-10)


def test_w2_matches_general_gaussian_formula() -> None:
    # W2^2 = |mu_a - mu_b|^2 + tr(Sa + Sb - 2 (Sa^1/2 Sb Sa^1/2)^1/2), with full matrices
    gen = torch.Generator().manual_seed(4)
    mu_a, lv_a = _gauss(gen, 5)
    mu_b, lv_b = _gauss(gen, 5)
    sa, sb = torch.diag(lv_a.exp()), torch.diag(lv_b.exp())

    def sqrtm(m: torch.Tensor) -> torch.Tensor:
        w, v = torch.linalg.eigh(m)
        return v @ torch.diag(w.clamp_min(0).sqrt()) @ v.T

    ra = sqrtm(sa)
    ref = (mu_a - mu_b).square().sum() + torch.trace(sa + sb - 2 * sqrtm(ra @ sb @ ra))
    assert w2_diag_gaussian(mu_a, lv_a, mu_b, lv_b).item() == pytest.approx(ref.item(), rel=1e-9)


def test_neg_cosine_matches_torch() -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 1, 12, generator=gen)
    y = torch.randn(1, 4, 12, generator=gen)
    ref = -F.cosine_similarity(x, y, dim=-1)
    torch.testing.assert_close(neg_cosine(x, y), ref)
    assert torch.isfinite(neg_cosine(torch.zeros(12), y[0, 0])).all()


def test_registry_names_direction_and_misses() -> None:
    assert COSTS.names() == ["cosine", "kl", "w2"]
    gen = torch.Generator().manual_seed(6)
    mu_v, lv_v = _gauss(gen, 2, 8)
    mu_t, lv_t = _gauss(gen, 2, 8)
    # registered costs take the video first: C = D(Q_video || P_text)
    torch.testing.assert_close(get_cost("kl")(mu_v, lv_v, mu_t, lv_t), kl_diag_gaussian(mu_v, lv_v, mu_t, lv_t))
    torch.testing.assert_close(get_cost("w2")(mu_v, lv_v, mu_t, lv_t), w2_diag_gaussian(mu_v, lv_v, mu_t, lv_t))
    torch.testing.assert_close(get_cost("cosine")(mu_v, None, mu_t, None), neg_cosine(mu_v, mu_t))
    with pytest.raises(UnknownNameError, match="cosine, kl, w2"):
        get_cost("kld")
