"""Low-rank and mixture covariances (issue 36, part 2): the option's parser and the costs.

Every cost runs in float64 on seeded random inputs against a reference: ``torch.distributions``
(``LowRankMultivariateNormal`` + ``kl_divergence``), today's diagonal KL, the formula computed
naively from diagonal KLs, or a Monte-Carlo estimate with ``MixtureSameFamily``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import (
    Categorical,
    Independent,
    LowRankMultivariateNormal,
    MixtureSameFamily,
    Normal,
    kl_divergence,
)

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.model.costs import kl_diag_gaussian
from dab_pipeline.model.covariance import (
    CovarianceSpec,
    kl_diag_grid,
    kl_diag_to_mixture,
    kl_lowrank_gaussian,
    kl_lowrank_grid,
    kl_lowrank_shared_text,
    kl_mixture_grid,
    parse_covariance,
)

F64 = torch.float64


def _gauss(gen: torch.Generator, *shape: int, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, log-variance (..., D) and a factor (..., D, rank) of moderate size."""
    mu = torch.randn(*shape, generator=gen, dtype=F64)
    logvar = torch.empty(*shape, dtype=F64).uniform_(-3.0, 1.0, generator=gen)
    u = 0.5 * torch.randn(*shape, rank, generator=gen, dtype=F64)
    return mu, logvar, u


def _lowrank(mu: torch.Tensor, logvar: torch.Tensor, u: torch.Tensor) -> LowRankMultivariateNormal:
    return LowRankMultivariateNormal(mu, cov_factor=u, cov_diag=logvar.exp())


# --------------------------------------------------------------------------------------------- parser


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("diag", CovarianceSpec("diag", 0, 1)),
        ("lowrank:1", CovarianceSpec("lowrank", 1, 1)),
        ("lowrank:8", CovarianceSpec("lowrank", 8, 1)),
        ("mixture:2", CovarianceSpec("mixture", 0, 2)),
        ("mixture:4", CovarianceSpec("mixture", 0, 4)),
    ],
)
def test_parse_covariance_valid_forms_round_trip(spec: str, expected: CovarianceSpec) -> None:
    parsed = parse_covariance(spec)
    assert parsed == expected
    assert str(parsed) == spec  # what config.json records


@pytest.mark.parametrize(
    "spec",
    [
        *(
            "lowrank:0",
            "lowrank:x",
            "mixture:1",
            "mixture:0",
            "cholesky",
            "",
            "lowrank",
            "diag:2",
            "lowrank:-1",
            "Diag",
        ),
        # issue 50, 1: past the compiled kernels' limits (a whole epoch trained, then a traceback), or huge
        *("lowrank:17", "lowrank:1000", "lowrank:99999999999999999999", "mixture:65", "mixture:100000000000"),
    ],
)
def test_parse_covariance_refuses_with_one_line_naming_the_valid_forms(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_covariance(spec)
    message = str(info.value)
    assert "\n" not in message
    assert "diag, lowrank:R (1 <= R <= 16), mixture:K (2 <= K <= 64)" in message
    assert repr(spec) in message


# --------------------------------------------------------------------------------------------- low-rank KL


def test_lowrank_kl_pair_matches_torch_distributions() -> None:
    gen = torch.Generator().manual_seed(10)
    q = _gauss(gen, 12, rank=3)
    p = _gauss(gen, 12, rank=3)
    ours = kl_lowrank_gaussian(*q, *p)  # ()
    ref = kl_divergence(_lowrank(*q), _lowrank(*p))
    torch.testing.assert_close(ours, ref, rtol=1e-8, atol=0.0)


def test_lowrank_kl_batch_matches_torch_distributions_with_different_ranks() -> None:
    gen = torch.Generator().manual_seed(11)
    q = _gauss(gen, 7, 16, rank=2)
    p = _gauss(gen, 7, 16, rank=4)
    ours = kl_lowrank_gaussian(*q, *p)  # (7,)
    ref = kl_divergence(_lowrank(*q), _lowrank(*p))  # (7,)
    assert ours.shape == (7,)
    torch.testing.assert_close(ours, ref, rtol=1e-8, atol=0.0)


def test_lowrank_kl_grid_matches_torch_distributions_pair_by_pair() -> None:
    gen = torch.Generator().manual_seed(12)
    mu_v, lv_v, u_v = _gauss(gen, 5, 16, rank=3)  # videos: the Q side of KL(Q_v || P_t)
    mu_t, lv_t, u_t = _gauss(gen, 4, 16, rank=2)  # texts: the P side
    grid = kl_lowrank_grid(mu_v, lv_v, u_v, mu_t, lv_t, u_t)  # (4, 5)
    assert grid.shape == (4, 5)
    for i in range(4):
        for j in range(5):
            ref = kl_divergence(_lowrank(mu_v[j], lv_v[j], u_v[j]), _lowrank(mu_t[i], lv_t[i], u_t[i]))
            torch.testing.assert_close(grid[i, j], ref, rtol=1e-8, atol=0.0)


@pytest.mark.parametrize("ranks", [(3, 2), (1, 4)])
def test_the_engines_shared_text_lowrank_kl_matches_torch_distributions_pair_by_pair(ranks) -> None:
    """The engine's block form (videos per pair (B, M, ...), U rank-major; texts (M, ...) shared by the rows)."""
    gen = torch.Generator().manual_seed(15)
    mu_v, lv_v, u_v = _gauss(gen, 3, 4, 16, rank=ranks[0])  # (B, M, D), U (B, M, D, R): one video Gaussian a pair
    mu_t, lv_t, u_t = _gauss(gen, 4, 16, rank=ranks[1])  # (M, D), (M, D, R_t)
    block = kl_lowrank_shared_text(mu_v, lv_v, u_v.mT.contiguous(), mu_t, lv_t, u_t)  # (B, M)
    assert block.shape == (3, 4)
    for b in range(3):
        for m in range(4):
            ref = kl_divergence(_lowrank(mu_v[b, m], lv_v[b, m], u_v[b, m]), _lowrank(mu_t[m], lv_t[m], u_t[m]))
            torch.testing.assert_close(block[b, m], ref, rtol=1e-8, atol=0.0)
    torch.testing.assert_close(block, kl_lowrank_gaussian(mu_v, lv_v, u_v, mu_t, lv_t, u_t), rtol=1e-10, atol=1e-10)


def test_lowrank_kl_with_zero_factors_is_todays_diagonal_kl() -> None:
    gen = torch.Generator().manual_seed(13)
    mu_q, lv_q, _ = _gauss(gen, 6, 16)
    mu_p, lv_p, _ = _gauss(gen, 6, 16)
    zero = torch.zeros(6, 16, 2, dtype=F64)
    # the batch adds corrections that are exactly 0 at U = 0, so it is today's value bit for bit
    assert torch.equal(
        kl_lowrank_gaussian(mu_q, lv_q, zero, mu_p, lv_p, zero), kl_diag_gaussian(mu_q, lv_q, mu_p, lv_p)
    )
    # the grid, same direction as costs.py's registered cost: rows texts (P), columns videos (Q)
    grid = kl_lowrank_grid(mu_q, lv_q, zero, mu_p, lv_p, zero)  # (6 texts, 6 videos)
    torch.testing.assert_close(grid, kl_diag_gaussian(mu_q[None], lv_q[None], mu_p[:, None], lv_p[:, None]))
    torch.testing.assert_close(grid, kl_diag_grid(mu_q, lv_q, mu_p, lv_p), rtol=1e-12, atol=1e-12)


def test_lowrank_kl_grid_equals_the_batch_pair_by_pair_and_is_directional() -> None:
    gen = torch.Generator().manual_seed(14)
    mu_v, lv_v, u_v = _gauss(gen, 6, 20, rank=4)
    mu_t, lv_t, u_t = _gauss(gen, 3, 20, rank=4)
    grid = kl_lowrank_grid(mu_v, lv_v, u_v, mu_t, lv_t, u_t)  # (3, 6)
    batch = kl_lowrank_gaussian(mu_v[None], lv_v[None], u_v[None], mu_t[:, None], lv_t[:, None], u_t[:, None])
    torch.testing.assert_close(grid, batch, rtol=1e-10, atol=1e-10)
    flipped = kl_lowrank_gaussian(mu_t[:, None], lv_t[:, None], u_t[:, None], mu_v[None], lv_v[None], u_v[None])
    assert not torch.allclose(grid, flipped)  # KL(video || text), not the other way


def test_lowrank_kl_grid_chunked_equals_unchunked() -> None:
    gen = torch.Generator().manual_seed(15)
    mu_v, lv_v, u_v = _gauss(gen, 11, 8, rank=2)
    mu_t, lv_t, u_t = _gauss(gen, 7, 8, rank=3)
    whole = kl_lowrank_grid(mu_v, lv_v, u_v, mu_t, lv_t, u_t, chunk=64)
    for chunk in (1, 3, 5):  # blocks that do not divide Q = 7 or V = 11
        torch.testing.assert_close(kl_lowrank_grid(mu_v, lv_v, u_v, mu_t, lv_t, u_t, chunk=chunk), whole)


def test_lowrank_kl_is_zero_on_itself() -> None:
    gen = torch.Generator().manual_seed(16)
    g = _gauss(gen, 5, 10, rank=3)
    torch.testing.assert_close(kl_lowrank_gaussian(*g, *g), torch.zeros(5, dtype=F64), rtol=0.0, atol=1e-12)


def test_factor_gradient_is_nonzero_at_small_random_u() -> None:
    gen = torch.Generator().manual_seed(17)
    mu_q, lv_q, u_q = _gauss(gen, 4, 12, rank=2)
    mu_p, lv_p, u_p = _gauss(gen, 4, 12, rank=2)
    u_q, u_p = (0.01 * u_q).requires_grad_(), (0.01 * u_p).requires_grad_()  # a "small random" initialisation
    kl_lowrank_gaussian(mu_q, lv_q, u_q, mu_p, lv_p, u_p).sum().backward()
    assert u_q.grad is not None and u_p.grad is not None
    assert u_q.grad.abs().max() > 1e-4 and u_p.grad.abs().max() > 1e-4


def test_factor_gradient_vanishes_at_u_zero_so_heads_must_not_start_there() -> None:
    # documented property (issue 36): the cost sees U only through U U^T, so d/dU = 2 (dKL/dSigma) U = 0 at U = 0
    gen = torch.Generator().manual_seed(18)
    mu_q, lv_q, _ = _gauss(gen, 4, 12)
    mu_p, lv_p, _ = _gauss(gen, 4, 12)
    u_q, u_p = (
        torch.zeros(4, 12, 2, dtype=F64, requires_grad=True),
        torch.zeros(4, 12, 2, dtype=F64, requires_grad=True),
    )
    kl_lowrank_gaussian(mu_q, lv_q, u_q, mu_p, lv_p, u_p).sum().backward()
    assert u_q.grad is not None and u_p.grad is not None
    assert torch.count_nonzero(u_q.grad) == 0 and torch.count_nonzero(u_p.grad) == 0


# --------------------------------------------------------------------------------------------- mixtures


def _mixture(gen: torch.Generator, *shape: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Components (..., K, D) and weight logits (..., K)."""
    mu, logvar, _ = _gauss(gen, *shape[:-1], k, shape[-1])
    return mu, logvar, torch.randn(*shape[:-1], k, generator=gen, dtype=F64)


def _naive_variational(mu_q, lv_q, mu_p, lv_p, logits) -> float:  # one pair: q (D,), p (K, D), logits (K,)
    weights = [math.exp(x) for x in logits.tolist()]
    total = sum(weights)
    kls = [kl_diag_gaussian(mu_q, lv_q, mu_p[k], lv_p[k]).item() for k in range(len(weights))]
    return -math.log(sum(w / total * math.exp(-kl) for w, kl in zip(weights, kls)))


def test_mixture_cost_matches_its_formula_from_diagonal_kls_pair_and_batch() -> None:
    gen = torch.Generator().manual_seed(20)
    mu_q, lv_q, _ = _gauss(gen, 5, 6)
    mu_p, lv_p, logits = _mixture(gen, 5, 6, k=3)
    batch = kl_diag_to_mixture(mu_q, lv_q, mu_p, lv_p, logits)  # (5,)
    assert batch.shape == (5,)
    for n in range(5):
        ref = _naive_variational(mu_q[n], lv_q[n], mu_p[n], lv_p[n], logits[n])
        assert batch[n].item() == pytest.approx(ref, rel=1e-10)
        assert kl_diag_to_mixture(mu_q[n], lv_q[n], mu_p[n], lv_p[n], logits[n]).item() == pytest.approx(ref, rel=1e-10)


def test_mixture_grid_matches_the_formula_and_the_batch_and_chunks() -> None:
    gen = torch.Generator().manual_seed(21)
    mu_v, lv_v, _ = _gauss(gen, 7, 6)
    mu_t, lv_t, logits = _mixture(gen, 4, 6, k=2)
    grid = kl_mixture_grid(mu_v, lv_v, mu_t, lv_t, logits)  # (4, 7)
    assert grid.shape == (4, 7)
    for i in range(4):
        for j in range(7):
            assert grid[i, j].item() == pytest.approx(_naive_variational(mu_v[j], lv_v[j], mu_t[i], lv_t[i], logits[i]))
    batch = kl_diag_to_mixture(mu_v[None], lv_v[None], mu_t[:, None], lv_t[:, None], logits[:, None])  # (4, 7)
    torch.testing.assert_close(grid, batch, rtol=1e-12, atol=1e-12)
    for chunk in (1, 3):
        torch.testing.assert_close(kl_mixture_grid(mu_v, lv_v, mu_t, lv_t, logits, chunk=chunk), grid)


def test_mixture_cost_is_exact_for_one_component_and_for_coinciding_components() -> None:
    gen = torch.Generator().manual_seed(22)
    mu_q, lv_q, _ = _gauss(gen, 5, 8)
    mu_p, lv_p, _ = _gauss(gen, 5, 1, 8)
    exact = kl_diag_gaussian(mu_q, lv_q, mu_p[:, 0], lv_p[:, 0])  # (5,)
    torch.testing.assert_close(kl_diag_to_mixture(mu_q, lv_q, mu_p, lv_p, torch.zeros(5, 1, dtype=F64)), exact)
    # K = 3 copies of one component, any weights: the mixture is that component, and so is the cost
    mu3, lv3 = mu_p.expand(5, 3, 8), lv_p.expand(5, 3, 8)
    logits = torch.randn(5, 3, generator=gen, dtype=F64)
    torch.testing.assert_close(kl_diag_to_mixture(mu_q, lv_q, mu3, lv3, logits), exact, rtol=1e-12, atol=1e-12)


def _monte_carlo_kl(mu_q, lv_q, mu_p, lv_p, logits, n: int = 200_000) -> tuple[float, float]:
    """E_Q[log Q - log P_mix] by sampling Q, with its standard error."""
    q = Independent(Normal(mu_q, torch.exp(0.5 * lv_q)), 1)
    mix = MixtureSameFamily(Categorical(logits=logits), Independent(Normal(mu_p, torch.exp(0.5 * lv_p)), 1))
    with torch.random.fork_rng():  # leave the global generator as other tests expect it
        torch.manual_seed(0)
        x = q.sample((n,))  # (n, D)
    ratio = q.log_prob(x) - mix.log_prob(x)  # (n,)
    return ratio.mean().item(), ratio.std().item() / math.sqrt(n)


def _two_components(spread: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K = 2 components in D = 4, means +-spread apart on axis 0 (a little on axis 1), unequal weights."""
    mu = torch.zeros(2, 4, dtype=F64)
    mu[0, 0], mu[1, 0], mu[1, 1] = -spread, spread, 0.3
    logvar = torch.tensor([[0.0, -0.5, 0.2, 0.0], [0.3, 0.0, -0.2, 0.1]], dtype=F64) + math.log(0.5)
    return mu, logvar, torch.tensor([0.3, -0.3], dtype=F64)


@pytest.mark.parametrize(
    "case, spread, offset, var_q, max_gap",
    [
        # Q near one of two well-separated components: the responsibilities hardly vary under Q,
        # so the approximation is tight (gap observed ~0: -0.002 +- 0.0016 nats); 0.01 nats
        ("separated", 4.0, -3.7, 0.4, 0.01),
        # heavily overlapping components (means 0.5 apart, std ~0.7) under a narrower Q: the
        # responsibilities vary with x, gap observed 0.045 nats (10% of the KL); 0.1 bounds it at ~2x.
        # (With Q as broad as the components the gap grows to 0.1-0.4 nats, 40-50%: an approximation.)
        ("overlapping", 0.25, 0.1, 0.3, 0.1),
        # Q straddles two separated components: the documented weak case, gap observed ~2.8 nats;
        # only the upper-bound property holds, and the test says so by asserting the gap is large
        ("straddling", 4.0, 0.0, 0.6, math.inf),
    ],
)
def test_mixture_cost_is_an_upper_bound_on_the_monte_carlo_kl(
    case: str, spread: float, offset: float, var_q: float, max_gap: float
) -> None:
    mu_p, lv_p, logits = _two_components(spread)
    mu_q = torch.tensor([offset, -0.1, 0.1, 0.3], dtype=F64)
    lv_q = torch.full((4,), math.log(var_q), dtype=F64)
    approx = kl_diag_to_mixture(mu_q, lv_q, mu_p, lv_p, logits).item()
    true_kl, se = _monte_carlo_kl(mu_q, lv_q, mu_p, lv_p, logits)
    # 200k samples give se ~ 0.002-0.008 nats; 5 se keeps the seeded test far from chance failures
    assert approx >= true_kl - 5 * se, "Jensen: the variational cost bounds KL(Q || mixture) from above"
    assert approx - true_kl <= max_gap + 5 * se
    if case == "straddling":
        assert approx - true_kl > 1.0


def test_mixture_cost_equals_the_monte_carlo_kl_when_components_coincide() -> None:
    mu_p, lv_p, _ = _two_components(0.0)
    mu_p[1], lv_p[1] = mu_p[0], lv_p[0]  # two identical components: the mixture is one Gaussian
    logits = torch.tensor([1.0, -1.0], dtype=F64)
    mu_q, lv_q = torch.tensor([0.5, -0.2, 0.1, 0.3], dtype=F64), torch.full((4,), math.log(0.6), dtype=F64)
    true_kl, se = _monte_carlo_kl(mu_q, lv_q, mu_p, lv_p, logits)
    assert kl_diag_to_mixture(mu_q, lv_q, mu_p, lv_p, logits).item() == pytest.approx(true_kl, abs=5 * se)


def test_identical_components_get_identical_gradients_so_initialisation_must_break_symmetry() -> None:
    # documented property (issue 36): the cost is symmetric in the components, so components (and
    # logits) that start equal receive equal gradients and never separate; heads must start them apart
    gen = torch.Generator().manual_seed(23)
    mu_q, lv_q, _ = _gauss(gen, 6, 8)
    one_mu, one_lv, _ = _gauss(gen, 6, 1, 8)
    mu_p = one_mu.repeat(1, 3, 1).requires_grad_()  # (6, 3, 8): three identical components
    lv_p = one_lv.repeat(1, 3, 1).requires_grad_()
    logits = torch.zeros(6, 3, dtype=F64, requires_grad=True)
    kl_diag_to_mixture(mu_q, lv_q, mu_p, lv_p, logits).sum().backward()
    assert mu_p.grad is not None and lv_p.grad is not None and logits.grad is not None
    for k in (1, 2):
        torch.testing.assert_close(mu_p.grad[:, k], mu_p.grad[:, 0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(lv_p.grad[:, k], lv_p.grad[:, 0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(logits.grad, torch.zeros_like(logits), rtol=0.0, atol=1e-12)
    # a small random perturbation is enough to give the components different gradients
    mu_p2 = (one_mu.repeat(1, 3, 1) + 0.01 * torch.randn(6, 3, 8, generator=gen, dtype=F64)).requires_grad_()
    kl_diag_to_mixture(mu_q, lv_q, mu_p2, lv_p, logits).sum().backward()
    assert mu_p2.grad is not None
    assert not torch.allclose(mu_p2.grad[:, 1], mu_p2.grad[:, 0], rtol=1e-3, atol=1e-6)


def test_a_rank_above_the_feature_width_is_refused_when_the_config_is_built() -> None:
    from dab_pipeline.model import ModelConfig

    with pytest.raises(ConfigError, match="rank R must be at most the feature width embed_dim=8"):
        ModelConfig(embed_dim=8, variant="prob", covariance="lowrank:12")
    assert ModelConfig(embed_dim=16, variant="prob", covariance="lowrank:16").covariance == "lowrank:16"


def test_cli_train_refuses_lowrank_17_before_training(tmp_path) -> None:
    from dab_pipeline.testing import random_store

    from ..helpers.runner import invoke

    store = random_store(tmp_path / "s.h5", dim=32)
    out = invoke(
        [
            "train",
            "--features",
            store,
            "--out",
            tmp_path / "run",
            "--variant",
            "prob",
            "--set",
            "model.covariance=lowrank:17",
        ]
    )
    assert out.exit_code != 0 and "lowrank:R (1 <= R <= 16)" in out.output and "Traceback" not in out.output
    assert not (tmp_path / "run" / "checkpoints").exists()
