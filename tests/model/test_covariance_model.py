"""`model.covariance` in the model (issue 36, part 1): the option, its refusals, the low-rank heads of `prob`,
and the default (diag) model unchanged."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from torch.distributions import LowRankMultivariateNormal, kl_divergence

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.core.overrides import apply_overrides
from dab_pipeline.model import DABModel, ModelConfig, pac_loss
from dab_pipeline.runs.config import TrainConfig

TINY = dict(embed_dim=16, steps=2, total_steps=10, time_embed_dim=8, drift_hidden=12)

# Recorded from the code before model.covariance existed (seed 0 model, seed 1 inputs): a sha256 of the
# state_dict's keys and shapes, and two sums over its values (each key's sum and sum of squares, weighted by the
# key's place) taken where that code's float32 state had the sha256 recorded then (prob 1541e5dd..., dab
# 1bebb3e7...). Sums, not the bytes: torch's uniform_ rounds differently on other instruction sets (the bridge's
# weights move by 3e-8 with ATEN_CPU_CAPABILITY=default), and the sums see that only at 1e-8 while another
# init moves them by far more. And the (3, 4) cost matrix (prob and dab agree: dab's drift starts at 0).
BEFORE_STATE = {
    "prob": (
        "b3ec92b51a782315b5acbfb6d347d052418b751c67abd5fd14e38b87adac5f1b",
        -222.91561979055405,
        5656.4515986719225,
    ),
    "dab": ("a2c43cce1900d959d4c339464f45d89ad3c70bf63306502948e947ba1681eca9", -434.2899036250674, 6251.528231947932),
}
BEFORE_COSTS = [
    [26.503128051757812, 23.259246826171875, 23.908302307128906, 10.199834823608398],
    [15.591861724853516, 46.161983489990234, 36.36031723022461, 21.784481048583984],
    [106.80792236328125, 22.40001678466797, 31.360191345214844, 46.9302978515625],
]


def _model(variant: str, seed: int = 0, **kw) -> DABModel:
    torch.manual_seed(seed)
    return DABModel(ModelConfig(variant=variant, **{**TINY, **kw})).eval()


def _inputs():
    g = torch.Generator().manual_seed(1)
    text, frames = torch.randn(3, 16, generator=g), torch.randn(4, 5, 16, generator=g)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1, 3:] = False
    return text, frames, mask


def _state_fingerprint(model: DABModel) -> tuple[str, float, float]:
    """(sha256 of the keys and shapes, sum over keys of i * sum(values), sum over keys of i * sum(values**2))."""
    keys, s1, s2 = hashlib.sha256(), 0.0, 0.0
    for i, (k, v) in enumerate(model.state_dict().items(), start=1):
        keys.update(f"{k}{tuple(v.shape)}".encode())
        x = v.detach().double()
        s1, s2 = s1 + i * float(x.sum()), s2 + i * float((x * x).sum())
    return keys.hexdigest(), s1, s2


@pytest.mark.parametrize("variant", ["prob", "dab"])
@pytest.mark.parametrize("kw", [{}, {"covariance": "diag"}])
def test_the_default_model_is_unchanged(variant: str, kw: dict) -> None:
    model = _model(variant, **kw)
    assert model.cfg.covariance == "diag" and model.prob is not None and model.prob.factor_head is None
    keys, s1, s2 = _state_fingerprint(model)
    want_keys, want_s1, want_s2 = BEFORE_STATE[variant]
    assert keys == want_keys  # the same parameters and buffers, of the same shapes
    assert s1 == pytest.approx(want_s1, rel=1e-7) and s2 == pytest.approx(want_s2, rel=1e-7)
    text, frames, mask = _inputs()
    with torch.no_grad():
        cost = model.pair_costs(model.encode_text(text), model.encode_video(frames, mask))
    torch.testing.assert_close(cost, torch.tensor(BEFORE_COSTS), rtol=1e-6, atol=1e-6)
    assert model.encode_text(text).factor is None


def test_covariance_is_set_with_set_and_recorded() -> None:
    cfg = apply_overrides(
        TrainConfig(features=Path("s.h5"), out=Path("o")), ["model.variant=prob", "model.covariance=lowrank:4"]
    )
    assert cfg.model.covariance == "lowrank:4"
    assert ModelConfig().covariance == "diag"
    with pytest.raises(ConfigError, match="valid: diag, lowrank:R"):
        apply_overrides(
            TrainConfig(features=Path("s.h5"), out=Path("o")), ["model.variant=prob", "model.covariance=lowrank:0"]
        )


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"variant": "xpool"}, "not available for variant 'xpool'"),
        ({"variant": "bridge"}, "not available for variant 'bridge'"),
        ({"variant": "prob", "variance": "fixed"}, "variance=fixed"),
        ({"variant": "prob", "cost": "w2"}, "cost=w2"),
        ({"variant": "xpool", "covariance": "mixture:2"}, "not available for variant 'xpool'"),
        ({"variant": "prob", "covariance": "mixture:2", "cost": "w2"}, "variational KL of Hershey and Olsen"),
        ({"variant": "dab", "covariance": "mixture:2", "variance": "fixed"}, "variance=fixed"),
        ({"variant": "prob", "covariance": "mixture:1"}, "valid: diag, lowrank:R"),
        ({"variant": "prob", "covariance": "cholesky"}, "valid: diag, lowrank:R"),
    ],
)
def test_what_cannot_take_a_covariance_is_refused_in_one_line(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        ModelConfig(**{"covariance": "lowrank:4", **kw})
    assert "\n" not in str(info.value)


def test_the_fixvar_controls_keep_diag() -> None:
    assert ModelConfig(variant="prob", variance="fixed").covariance == "diag"
    with pytest.raises(ConfigError, match="fixed-variance control fixes every covariance"):
        ModelConfig(variant="prob", variance="fixed", covariance="lowrank:2")


def test_lowrank_heads_predict_u_small_random_and_u_learns_from_the_first_step() -> None:
    model = _model("prob", covariance="lowrank:3").train()
    text, frames, mask = _inputs()
    ts = model.encode_text(text)
    assert ts.factor is not None and ts.factor.shape == (3, 16, 3)
    ratio = (ts.factor.square().sum(-1).mean() / ts.logvar.exp().mean()).detach()
    assert 0.0 < float(ratio) < 0.2  # small, not zero
    frames3 = frames[:3]
    out = model(text, frames3, mask[:3])
    pac_loss(out.cost, model.tau()).backward()
    grad = model.prob.factor_head.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0.0


def test_lowrank_cost_is_kl_video_to_text_and_grid_equals_aligned() -> None:
    model = _model("prob", covariance="lowrank:2")
    text, frames, mask = _inputs()
    with torch.no_grad():
        ts, vs = model.encode_text(text), model.encode_video(frames, mask)
        grid = model.pair_terms(ts, vs, grid=True)
        aligned = model.pair_terms(ts.select(slice(0, 3)), vs.select(slice(0, 3)), grid=False)
    torch.testing.assert_close(aligned.cost, torch.diagonal(grid.cost), rtol=1e-5, atol=1e-5)
    f64 = lambda x: x.double()  # noqa: E731
    for i, j in [(0, 0), (1, 3), (2, 1)]:
        q = LowRankMultivariateNormal(
            f64(grid.video_mu[i, j]), f64(grid.video_factor[i, j]), f64(grid.video_logvar[i, j]).exp()
        )
        p = LowRankMultivariateNormal(f64(ts.mu[i]), f64(ts.factor[i]), f64(ts.logvar[i]).exp())
        assert float(grid.cost[i, j]) == pytest.approx(float(kl_divergence(q, p)), rel=1e-4)


def _dab_lowrank(**kw) -> DABModel:
    # a drift that moves the text from the start (drift_init > 0), so the bridged Gaussian differs from the text's
    return _model("dab", covariance="lowrank:2", drift_init=0.05, **kw)


def test_dab_lowrank_costs_are_the_bridged_text_with_its_u_carried_unchanged() -> None:
    model = _dab_lowrank()  # float32: the bridge carries its state in float32; the reference below is float64
    text, frames, mask = _inputs()
    with torch.no_grad():
        ts, vs = model.encode_text(text), model.encode_video(frames, mask)
        grid = model.pair_terms(ts, vs, grid=True)
        aligned = model.pair_terms(ts.select(slice(0, 3)), vs.select(slice(0, 3)), grid=False)
        # the naive computation: the bridge on (mu, logvar) exactly as for diag, then the low-rank KL
        mu_b, lv_b = model.bridge(ts.mu[:, None], ts.logvar[:, None], grid.video_mu, grid.video_logvar)
    assert grid.cost.shape == (3, 4) and grid.text_factor is not None
    assert not torch.allclose(mu_b, ts.mu[:, None].expand_as(mu_b))  # the bridge did move the text
    torch.testing.assert_close(grid.bridged_mu, mu_b)
    torch.testing.assert_close(grid.bridged_logvar, lv_b)
    torch.testing.assert_close(aligned.cost, torch.diagonal(grid.cost), rtol=1e-5, atol=1e-5)
    f64 = lambda x: x.double()  # noqa: E731
    for i in range(3):
        for j in range(4):
            q = LowRankMultivariateNormal(
                f64(grid.video_mu[i, j]), f64(grid.video_factor[i, j]), f64(grid.video_logvar[i, j]).exp()
            )
            p = LowRankMultivariateNormal(f64(mu_b[i, j]), f64(ts.factor[i]), f64(lv_b[i, j]).exp())
            assert float(grid.cost[i, j]) == pytest.approx(float(kl_divergence(q, p)), rel=1e-4)


@pytest.mark.parametrize("kw", [{}, {"drift": "constant"}])
def test_dab_lowrank_u_learns_from_the_first_step(kw: dict) -> None:
    model = _model("dab", covariance="lowrank:3", **kw).train()  # drift_init 0: the bridge starts as the identity
    text, frames, mask = _inputs()
    out = model(text, frames[:3], mask[:3])
    pac_loss(out.cost, model.tau()).backward()
    grad = model.prob.factor_head.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0.0
    assert model.bridge is not None and any(p.grad is not None for p in model.bridge.parameters())


# ---------------------------------------------------------------------------------------------
# mixture:K (the text as K diagonal components)


def _naive_mixture_cost(mu_v, lv_v, mu_k, lv_k, logits) -> float:
    """-log sum_k pi_k exp(-KL(Q_v || P_k)) in float64, the KLs written out per dimension."""
    mu_v, lv_v, mu_k, lv_k, logits = (x.double() for x in (mu_v, lv_v, mu_k, lv_k, logits))
    kl = 0.5 * (lv_k - lv_v + (lv_v.exp() + (mu_v - mu_k) ** 2) / lv_k.exp() - 1).sum(-1)  # (K,)
    return float(-torch.logsumexp(torch.log_softmax(logits, -1) - kl, -1))


def test_mixture_components_start_apart_and_each_learns_its_own_way_from_the_first_step() -> None:
    model = _model("prob", covariance="mixture:3").train()
    text, frames, mask = _inputs()
    ts = model.encode_text(text)
    assert ts.mix_mu.shape == (3, 3, 16) and ts.mix_logits.shape == (3, 3)
    # about one nat apart at the start: distinct, not far (sigma^2 = e^logvar_init)
    gap = (ts.mix_mu[:, 0] - ts.mix_mu[:, 1]).square().sum(-1) / (2 * ts.mix_logvar[:, 0].exp().mean(-1))
    assert bool(((gap > 0.1) & (gap < 10)).all()), gap
    torch.testing.assert_close(ts.mix_logits, torch.zeros(3, 3))  # uniform weights
    out = model(text, frames[:3], mask[:3])
    pac_loss(out.cost, model.tau()).backward()
    head = model.mixture
    grads = head.offset.bias.grad.view(3, 16)  # (K, D): one row per component
    assert all(float(g.abs().sum()) > 0 for g in grads)
    assert not torch.allclose(grads[0], grads[1]) and not torch.allclose(grads[1], grads[2])  # symmetry broken
    assert float(head.weight.weight.grad.abs().sum()) > 0 and float(head.logvar_offset.weight.grad.abs().sum()) > 0


@pytest.mark.parametrize("variant", ["prob", "dab"])
def test_mixture_cost_is_the_variational_kl_of_the_components_and_grid_equals_aligned(variant: str) -> None:
    kw = {"drift_init": 0.05} if variant == "dab" else {}
    model = _model(variant, covariance="mixture:2", **kw)
    text, frames, mask = _inputs()
    with torch.no_grad():
        ts, vs = model.encode_text(text), model.encode_video(frames, mask)
        grid = model.pair_terms(ts, vs, grid=True)
        aligned = model.pair_terms(ts.select(slice(0, 3)), vs.select(slice(0, 3)), grid=False)
        torch.testing.assert_close(aligned.cost, torch.diagonal(grid.cost), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(aligned.component, torch.diagonal(grid.component))
        for i, j in [(0, 0), (1, 3), (2, 1)]:
            mu_v, lv_v = grid.video_mu[i, j], grid.video_logvar[i, j]
            mu_k, lv_k = ts.mix_mu[i], ts.mix_logvar[i]  # (K, D)
            if variant == "dab":  # each component bridged on its own toward this video
                pairs = [model.bridge(mu_k[k], lv_k[k], mu_v, lv_v) for k in range(2)]
                mu_k, lv_k = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
            want = _naive_mixture_cost(mu_v, lv_v, mu_k, lv_k, ts.mix_logits[i])
            assert float(grid.cost[i, j]) == pytest.approx(want, rel=1e-5, abs=1e-5)
            kl = 0.5 * (lv_k - lv_v + (lv_v.exp() + (mu_v - mu_k) ** 2) / lv_k.exp() - 1).sum(-1)
            assert int(grid.component[i, j]) == int((torch.log_softmax(ts.mix_logits[i], -1) - kl).argmax())
    assert variant == "prob" or not torch.allclose(grid.bridged_mu[0, 0], ts.mu[0])  # the drift moved it


def test_a_mixture_texts_mean_and_variance_are_its_moments() -> None:
    model = _model("prob", covariance="mixture:3")
    text, _, _ = _inputs()
    with torch.no_grad():
        ts = model.encode_text(text)
    samples = []
    g = torch.Generator().manual_seed(3)
    for i in range(3):  # Monte-Carlo moments of the mixture, 200k draws
        pi = torch.softmax(ts.mix_logits[i].double(), -1)
        k = torch.multinomial(pi, 200_000, replacement=True, generator=g)
        x = ts.mix_mu[i].double()[k] + ts.mix_logvar[i].double()[k].mul(0.5).exp() * torch.randn(
            200_000, 16, generator=g, dtype=torch.float64
        )
        samples.append((x.mean(0), x.var(0)))
    for i, (m, v) in enumerate(samples):
        torch.testing.assert_close(ts.mu[i].double(), m, atol=0.01, rtol=0)
        torch.testing.assert_close(ts.logvar[i].double().exp(), v, atol=0, rtol=0.02)
