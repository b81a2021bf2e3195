"""The fused rows of prob's covariance engine (issue 36): ``kl_lowrank_rows`` and ``kl_mixture_rows`` against their eager
specs, the model's cost functions and ``torch.distributions``; the engine the same with the kernels off."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributions import LowRankMultivariateNormal, kl_divergence

from dab_pipeline.model.covariance import (
    kl_diag_to_mixture,
    kl_lowrank_gaussian,
    lowrank_text_pack,
    mixture_text_pack,
)
from dab_pipeline.scoring import Scorer
from dab_pipeline.scoring.engines import gaussian as gaussian_engine
from dab_pipeline.scoring.kernels import cpu as cpu_kernels
from dab_pipeline.scoring.kernels.cpu import eager_kernels
from dab_pipeline.scoring.kernels.eager import kl_lowrank_rows_eager, kl_mixture_rows_eager

from ..helpers.kernels import fused_kernels, rows_view
from ..helpers.models import random_inputs, small_model


@pytest.fixture(scope="module")
def fused() -> cpu_kernels.Kernels:
    return fused_kernels()


def _lowrank_case(seed: int, n_b: int, n_m: int, d: int, rank: int, rank_t: int):
    gen = torch.Generator().manual_seed(seed)
    mu_v, lv_v = torch.randn(n_b * n_m, d, generator=gen), 0.5 * torch.randn(n_b * n_m, d, generator=gen) - 1.0
    u = 0.3 * torch.randn(n_b * n_m, rank, d, generator=gen)  # rank-major rows
    mu_t, lv_t = torch.randn(n_m, d, generator=gen), 0.5 * torch.randn(n_m, d, generator=gen) - 1.0
    u_t = 0.3 * torch.randn(n_m, d, rank_t, generator=gen)
    return mu_v, lv_v, u, mu_t, lv_t, u_t


@pytest.mark.parametrize(("d", "rank", "rank_t"), [(33, 1, 1), (64, 4, 4), (40, 8, 2)])
def test_the_lowrank_rows_are_the_lowrank_kl_of_each_pair(d: int, rank: int, rank_t: int) -> None:
    """The eager spec in float64 against torch.distributions, pair (b, m) with text m; then the fused rows (strided
    inputs) against the spec in float32."""
    n_b, n_m = 3, 5
    mu_v, lv_v, u, mu_t, lv_t, u_t = _lowrank_case(7, n_b, n_m, d, rank, rank_t)
    args64 = [x.double() for x in (mu_v, lv_v, u)]
    pack, const = lowrank_text_pack(mu_t.double(), lv_t.double(), u_t.double())
    spec = kl_lowrank_rows_eager(args64[0], args64[1], args64[2].flatten(1), pack, const, rank)  # (B M,)
    for p in range(n_b * n_m):
        m = p % n_m
        q = LowRankMultivariateNormal(args64[0][p], args64[2][p].T, args64[1][p].exp())
        t = LowRankMultivariateNormal(mu_t[m].double(), u_t[m].double(), lv_t[m].double().exp())
        torch.testing.assert_close(spec[p], kl_divergence(q, t), rtol=1e-9, atol=1e-9)
    ref = kl_lowrank_gaussian(
        mu_v.view(n_b, n_m, d), lv_v.view(n_b, n_m, d), u.view(n_b, n_m, rank, d).mT, mu_t, lv_t, u_t
    )
    pack32, const32 = lowrank_text_pack(mu_t, lv_t, u_t)
    torch.testing.assert_close(kl_lowrank_rows_eager(mu_v, lv_v, u.flatten(1), pack32, const32, rank), ref.flatten())


def test_the_fused_lowrank_rows_match_the_spec(fused: cpu_kernels.Kernels) -> None:
    for d, rank, rank_t in ((33, 1, 1), (64, 4, 4), (40, 8, 2), (512, 4, 4)):
        mu_v, lv_v, u, mu_t, lv_t, u_t = _lowrank_case(d, 4, 3, d, rank, rank_t)
        pack, const = lowrank_text_pack(mu_t, lv_t, u_t)
        spec = kl_lowrank_rows_eager(mu_v, lv_v, u.flatten(1), pack, const, rank)
        got = fused.kl_lowrank_rows(
            rows_view(mu_v, 3), rows_view(lv_v, 5), rows_view(u.flatten(1), 2), pack, const, rank
        )
        torch.testing.assert_close(got, spec, rtol=2e-5, atol=1e-4)


def _mixture_case(seed: int, rows: int, n_m: int, k: int, d: int):
    gen = torch.Generator().manual_seed(seed)
    mu_v, lv_v = torch.randn(rows, d, generator=gen), 0.5 * torch.randn(rows, d, generator=gen) - 1.0
    mu_k, lv_k = torch.randn(n_m, k, d, generator=gen), 0.5 * torch.randn(n_m, k, d, generator=gen) - 1.0
    return mu_v, lv_v, mu_k, lv_k, torch.randn(n_m, k, generator=gen)


@pytest.mark.parametrize(("k", "d"), [(2, 33), (4, 64)])
def test_the_mixture_rows_are_the_soft_min_of_the_components_kls(k: int, d: int) -> None:
    mu_v, lv_v, mu_k, lv_k, logits = _mixture_case(11, 12, 4, k, d)
    pack, const = mixture_text_pack(mu_k, lv_k, logits)
    spec = kl_mixture_rows_eager(mu_v, lv_v, pack, const)
    idx = torch.arange(12) % 4
    ref = kl_diag_to_mixture(mu_v, lv_v, mu_k[idx], lv_k[idx], logits[idx])  # (P,)
    torch.testing.assert_close(spec, ref, rtol=1e-5, atol=1e-5)


def test_the_fused_mixture_rows_match_the_spec(fused: cpu_kernels.Kernels) -> None:
    for k, d in ((2, 33), (4, 64), (3, 512)):
        mu_v, lv_v, mu_k, lv_k, logits = _mixture_case(k, 10, 5, k, d)
        pack, const = mixture_text_pack(mu_k, lv_k, logits)
        got = fused.kl_mixture_rows(rows_view(mu_v, 3), rows_view(lv_v, 1), pack, const)
        torch.testing.assert_close(got, kl_mixture_rows_eager(mu_v, lv_v, pack, const), rtol=2e-5, atol=1e-4)


def test_the_fused_rows_reject_bad_shapes(fused: cpu_kernels.Kernels) -> None:
    z = torch.zeros(6, 8)
    with pytest.raises(RuntimeError, match="texts must be"):
        fused.kl_lowrank_rows(z, z, torch.zeros(6, 16), torch.zeros(2, 20), torch.zeros(2), 2)
    with pytest.raises(RuntimeError, match="u must be"):
        fused.kl_lowrank_rows(z, z, torch.zeros(6, 8), torch.zeros(2, 32), torch.zeros(2), 2)
    with pytest.raises(RuntimeError, match="texts must be"):
        fused.kl_mixture_rows(z, z, torch.zeros(2, 20), torch.zeros(2, 4))


@pytest.mark.parametrize("cov", ["lowrank:3", "mixture:3"])
def test_the_engine_scores_the_same_with_the_kernels_off(cov: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the compiled rows (no compiler, DAB_CPU_KERNELS=0) the engine takes its ATen form: the same costs."""
    model = small_model("prob", covariance=cov).eval()
    text, frames, mask, _ = random_inputs()
    on = Scorer(model).score(text, frames, mask).cost
    monkeypatch.setattr(gaussian_engine, "get_kernels", lambda: eager_kernels("turned off by the test"))
    off = Scorer(model).score(text, frames, mask).cost
    np.testing.assert_allclose(on, off, rtol=1e-5, atol=1e-4)
