"""DAB model: config validation, schedule, pooling, encoder, bridge, variants, training signal."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.model import (
    VARIANTS,
    DABModel,
    DistributionBridge,
    ModelConfig,
    beta_schedule,
    bridge_macs_per_pair_step,
    resolve_tau,
    sinusoidal_embedding,
    step_sizes,
)
from dab_pipeline.model.costs import kl_diag_gaussian

from ..helpers.models import perturb

D, F_ = 16, 4


def small_cfg(**kw) -> ModelConfig:
    base = dict(embed_dim=D, steps=4, drift_hidden=32, time_embed_dim=8, dropout=0.0)
    base.update(kw)
    return ModelConfig(**base)


def batch(b: int = 5, f: int = F_, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    text = torch.randn(b, D, generator=gen) * 3
    frames = torch.randn(b, f, D, generator=gen) * 3
    mask = torch.ones(b, f, dtype=torch.bool)
    mask[1, -1] = False  # one short video
    mask[3, 1:] = False  # and a one-frame video
    return text, frames, mask


def train_loss(model: DABModel, out):
    """The loss the trainer computes: the variant's loss over the batch's costs at the model's temperature."""
    from dab_pipeline.model.losses import contrastive_loss, loss_of

    return contrastive_loss(loss_of(model.cfg.spec), out.cost, model.temperature())


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("variant", "dabb", "xpool | prob | bridge | dab"),
        ("cost", "kl2", "kl | w2"),
        ("steps", 0, "steps"),
        ("steps", 2000, "total_steps=1000"),
        ("num_heads", 3, "divisor"),
        ("time_embed_dim", 7, "even"),
        ("drift_layers", 1, "drift_layers"),
        ("dropout", 1.0, "dropout"),
        ("logvar_init", 5.0, "logvar_init"),
        ("beta_min", 0.0, "beta_min"),
        ("chi_max", 1.5, "chi_max"),
        ("tau", -1.0, "tau"),
    ],
)
def test_config_validation_names_field_and_valid_values(field: str, value, fragment: str) -> None:
    with pytest.raises(ConfigError) as exc:
        ModelConfig(**{field: value})
    assert f"model.{field}=" in str(exc.value)
    assert fragment in str(exc.value)


def test_default_config_is_the_paper_setting() -> None:
    cfg = ModelConfig()
    assert (cfg.embed_dim, cfg.steps, cfg.total_steps, cfg.beta_min, cfg.beta_max) == (512, 32, 1000, 1e-4, 2e-2)
    assert (cfg.chi_min, cfg.chi_max, cfg.logvar_init, cfg.dropout) == (0.2, 0.6, -2.0, 0.3)
    assert resolve_tau(cfg) == 8.0
    assert resolve_tau(dataclasses.replace(cfg, cost="w2")) == 2.0
    assert resolve_tau(dataclasses.replace(cfg, tau=0.5)) == 0.5


# ----------------------------------------------------------------------------- schedule & FLOPs


def test_betas_follow_the_paper_formula() -> None:
    betas = beta_schedule(1000, 1e-4, 2e-2)
    assert betas.shape == (1000,)
    assert betas[0].item() == pytest.approx(1e-4 + (2e-2 - 1e-4) / 1000)
    assert betas[-1].item() == pytest.approx(2e-2)


@pytest.mark.parametrize("steps", [1, 2, 8, 32, 64, 1000])
def test_step_sizes_within_bounds_and_monotone(steps: int) -> None:
    cfg = ModelConfig(steps=steps)
    chi = step_sizes(cfg)
    assert chi.shape == (steps,)
    assert (chi >= 0.2 - 1e-6).all() and (chi <= 0.6 + 1e-6).all()
    assert (chi[1:] > chi[:-1]).all()
    if steps > 1:
        assert chi[0].item() == pytest.approx(0.2) and chi[-1].item() == pytest.approx(0.6)
    # same values before normalisation: sqrt(1 - prod(1 - beta)) over the first T' steps
    raw = torch.sqrt(1 - torch.cumprod(1 - beta_schedule(1000, 1e-4, 2e-2), 0))[:steps]
    if steps > 1:
        expect = 0.2 + 0.4 * (raw - raw.min()) / (raw.max() - raw.min())
        torch.testing.assert_close(chi, expect.float())


def test_bridge_applies_steps_from_coarse_to_fine() -> None:
    bridge = DistributionBridge(small_cfg(steps=6))
    assert bridge.timesteps.tolist() == [6, 5, 4, 3, 2, 1]
    assert (bridge.chi[1:] < bridge.chi[:-1]).all()
    assert bridge.chi[0].item() == pytest.approx(0.6)


def test_sinusoidal_embedding() -> None:
    t = torch.tensor([0.0, 3.0])
    e = sinusoidal_embedding(t, 8)
    assert e.shape == (2, 8)
    k = torch.arange(4, dtype=torch.float64)
    torch.testing.assert_close(e[1, :4], torch.sin(3.0 / 10000 ** (2 * k / 8)).float())
    torch.testing.assert_close(e[1, 4:], torch.cos(3.0 / 10000 ** (2 * k / 8)).float())


def test_bridge_macs_match_the_papers_flops() -> None:
    cfg = ModelConfig()
    macs = bridge_macs_per_pair_step(cfg)
    assert macs == 2176 * 1024 + 1024 * 1024 + 1024 * 1024 + 2 * 128 * 128 == 4_358_144
    # Table 4: FLOPs (x1e12) over 1000 x 1000 pairs, 2 FLOPs per multiply-add
    for steps, tflops in [(8, 69.73), (16, 139.47), (32, 278.93), (64, 557.85)]:
        assert 2 * macs * steps * 1e6 / 1e12 == pytest.approx(tflops, rel=1e-4)
    assert bridge_macs_per_pair_step(dataclasses.replace(cfg, variant="prob")) == 0
    # and it counts what the module actually holds
    bridge = DistributionBridge(cfg)
    linear_macs = sum(m.weight.numel() for m in bridge.modules() if isinstance(m, torch.nn.Linear))
    assert linear_macs == macs


# ----------------------------------------------------------------------------- pooling


def test_pooling_starts_from_identity_projections() -> None:
    model = DABModel(small_cfg(variant="xpool"))
    for name in ("q_proj", "k_proj", "v_proj", "out_proj", "linear_proj"):
        lin = getattr(model.pool, name)
        torch.testing.assert_close(lin.weight, torch.eye(D))
        assert (lin.bias == 0).all()


def _naive_pool(model: DABModel, text: torch.Tensor, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """X-Pool's block for one (text, video) pair at a time, written out step by step."""
    p = model.pool
    q_all, v_all = text.shape[0], frames.shape[0]
    out = torch.empty(q_all, v_all, D)
    for i in range(q_all):
        t = p.ln_in(text[i])
        q = p.q_proj(t)
        for j in range(v_all):
            real = frames[j][mask[j]]
            x = p.ln_in(real)
            k, v = p.k_proj(x), p.v_proj(x)
            w = torch.softmax(k @ q / math.sqrt(D), dim=0)
            a = p.ln_attn(p.out_proj(w @ v))
            out[i, j] = p.ln_out(a + p.linear_proj(a))
    return out


def test_pooling_matches_naive_per_pair_reference() -> None:
    model = perturb(DABModel(small_cfg(variant="xpool"))).eval()
    text, frames, mask = batch()
    with torch.no_grad():
        ts, vs = model.encode_text(text), model.encode_video(frames, mask)
        grid = model.pool.pool(ts.q, vs.k, vs.v, vs.mask, grid=True)
        aligned = model.pool.pool(ts.q, vs.k, vs.v, vs.mask, grid=False)
        ref = _naive_pool(model, text, frames, mask)
    torch.testing.assert_close(grid, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(aligned, torch.diagonal(ref, dim1=0, dim2=1).T, rtol=1e-5, atol=1e-5)


def test_xpool_cost_is_negative_cosine_to_pooled_video() -> None:
    model = perturb(DABModel(small_cfg(variant="xpool"))).eval()
    text, frames, mask = batch()
    with torch.no_grad():
        cost = model(text, frames, mask).cost
        ref = -F.cosine_similarity(text[:, None], _naive_pool(model, text, frames, mask), dim=-1)
    torch.testing.assert_close(cost, ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- encoder & clamps


def test_probabilistic_encoder_init_and_clamps() -> None:
    model = DABModel(small_cfg(variant="prob"))
    enc = model.prob
    assert (enc.logvar_head.bias == -2.0).all()
    x = torch.randn(6, D)
    mu, lv = enc(x)
    assert mu.shape == lv.shape == (6, D)
    # the encoder normalises first, so the feature's scale does not matter
    torch.testing.assert_close(enc(x * 1e4)[0], mu, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        enc.logvar_head.bias.fill_(1e4)
        assert (enc(x)[1] == 2.0).all()
        enc.logvar_head.bias.fill_(-1e4)
        assert (enc(x)[1] == -6.0).all()


@pytest.mark.parametrize("variant", ["prob", "dab"])
def test_logvar_clamps_hold_under_extreme_inputs(variant: str) -> None:
    model = perturb(DABModel(small_cfg(variant=variant)), scale=1.0).eval()
    text, frames, mask = batch()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(50.0)  # drives every head far outside the clamp range
        out = model(text * 1e6, frames * 1e6, mask)
    for lv in (out.text_logvar, out.video_logvar_diag, out.bridged_logvar_diag):
        assert torch.isfinite(lv).all()
        assert lv.min() >= -6.0 and lv.max() <= 2.0
    # (means are not clamped -- the paper clips only log-variances -- so no claim on the cost here)


def test_bridge_clamps_logvar_along_the_trajectory() -> None:
    cfg = small_cfg()
    bridge = DistributionBridge(cfg)
    with torch.no_grad():
        bridge.drift[-1].bias.fill_(-1e3)  # d_logvar = -1e3 pushes logvar up without bound
    mu, lv = bridge(torch.zeros(3, D), torch.zeros(3, D), torch.zeros(3, D), torch.zeros(3, D))
    assert (lv == cfg.logvar_max).all()
    # the mean moved by sum(chi) * 1e3
    torch.testing.assert_close(mu, torch.full((3, D), 1e3 * bridge.chi.sum().item()))


# ----------------------------------------------------------------------------- bridge


def test_bridge_is_identity_at_initialisation() -> None:
    gen = torch.Generator().manual_seed(0)
    bridge = DistributionBridge(small_cfg())
    mu_t, lv_t = torch.randn(3, 1, D, generator=gen), torch.rand(3, 1, D, generator=gen) - 3
    mu_v, lv_v = torch.randn(1, 4, D, generator=gen), torch.rand(1, 4, D, generator=gen) - 3
    mu, lv = bridge(mu_t, lv_t, mu_v, lv_v)
    torch.testing.assert_close(mu, mu_t.expand(3, 4, D))
    torch.testing.assert_close(lv, lv_t.expand(3, 4, D))
    point = DistributionBridge(small_cfg(variant="bridge"), point=True)
    torch.testing.assert_close(point.forward_point(mu_t, mu_v), mu_t.expand(3, 4, D))


def test_dab_model_bridge_identity_at_init() -> None:
    model = DABModel(small_cfg(variant="dab")).eval()
    prob = DABModel(small_cfg(variant="prob")).eval()
    prob.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("bridge.")})
    text, frames, mask = batch()
    with torch.no_grad():
        out = model(text, frames, mask)
        out_prob = prob(text, frames, mask)
    torch.testing.assert_close(out.bridged_mu_diag, out.text_mu)
    torch.testing.assert_close(out.bridged_logvar_diag, out.text_logvar)
    torch.testing.assert_close(out.cost, out_prob.cost)


def _explicit_bridge(bridge, cfg, residual: bool = False) -> None:
    """The bridge's T' steps written out as the paper's drift on the concatenated inputs, checked against it."""
    gen = torch.Generator().manual_seed(1)
    mu_t, lv_t = torch.randn(3, D, generator=gen), torch.rand(3, D, generator=gen) - 2
    mu_v, lv_v = torch.randn(3, D, generator=gen), torch.rand(3, D, generator=gen) - 2
    with torch.no_grad():
        mu, lv = bridge(mu_t, lv_t, mu_v, lv_v)
        chi = step_sizes(cfg)
        m, l = mu_t.clone(), lv_t.clone()
        for s in range(cfg.steps, 0, -1):
            e = bridge.time_mlp(sinusoidal_embedding(torch.tensor([float(s)]), cfg.time_embed_dim))  # (1, d_t)
            parts = [m, torch.exp(l / 2), mu_v, torch.exp(lv_v / 2)] + ([mu_v - m] if residual else [])
            delta = bridge.drift(torch.cat([*parts, e.expand(3, -1)], dim=-1))
            m = m - chi[s - 1] * delta[:, :D]
            l = (l - chi[s - 1] * delta[:, D:]).clamp(cfg.logvar_min, cfg.logvar_max)
    torch.testing.assert_close(mu, m, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lv, l, rtol=1e-5, atol=1e-5)


def test_bridge_matches_an_explicit_concat_loop() -> None:
    """The split first layer must equal the paper's drift on [mu_t, sigma_t, mu_v, sigma_v, e_t]."""
    cfg = small_cfg(steps=5)
    _explicit_bridge(perturb(DistributionBridge(cfg), scale=0.3), cfg)


# ----------------------------------------------------------------------------- variants


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_shapes(variant: str) -> None:
    model = DABModel(small_cfg(variant=variant))
    text, frames, mask = batch(b=5)
    out = model(text, frames, mask)
    assert out.cost.shape == (5, 5)
    if variant in ("prob", "dab"):
        for t in (out.text_logvar, out.video_logvar_diag, out.bridged_logvar_diag, out.video_mu_diag):
            assert t.shape == (5, D)
    else:
        assert out.text_logvar is None and out.video_logvar_diag is None


def test_variants_build_only_what_they_use() -> None:
    names = {v: {n.split(".")[0] for n, _ in DABModel(small_cfg(variant=v)).named_parameters()} for v in VARIANTS}
    assert names["xpool"] == {"pool", "log_logit_scale"}
    assert names["bridge"] == {"pool", "log_logit_scale", "bridge"}
    assert names["prob"] == {"pool", "prob", "token_unc"}
    assert names["dab"] == {"pool", "prob", "token_unc", "bridge"}
    assert "log_tau" in dict(DABModel(small_cfg(learn_tau=True)).named_parameters())
    with pytest.raises(ConfigError):
        DABModel(small_cfg(variant="xpool")).tau()


def test_dab_cost_is_kl_of_video_against_bridged_text() -> None:
    model = perturb(DABModel(small_cfg(variant="dab"))).eval()
    text, frames, mask = batch()
    with torch.no_grad():
        ts, vs = model.encode_text(text), model.encode_video(frames, mask)
        terms = model.pair_terms(ts, vs)
        ref = kl_diag_gaussian(terms.video_mu, terms.video_logvar, terms.bridged_mu, terms.bridged_logvar)
        aligned = model.pair_terms(ts, vs, grid=False)
    torch.testing.assert_close(terms.cost, ref)
    torch.testing.assert_close(aligned.cost, torch.diagonal(terms.cost), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        aligned.bridged_logvar, torch.diagonal(terms.bridged_logvar, dim1=0, dim2=1).T, rtol=1e-5, atol=1e-5
    )


def test_video_logvar_fuses_base_and_token_terms() -> None:
    model = perturb(DABModel(small_cfg(variant="prob"))).eval()
    text, frames, mask = batch()
    with torch.no_grad():
        out = model(text, frames, mask)
        v_c = torch.diagonal(_naive_pool(model, text, frames, mask), dim1=0, dim2=1).T  # (B, D)
        _, base = model.prob(v_c)
        tu = model.token_unc
        h_bar = []
        for j in range(text.shape[0]):
            x = tu.ln(frames[j][mask[j]])
            w = torch.softmax(tu.q_proj(x) @ tu.k_proj(x).T / math.sqrt(D), dim=-1)
            h_bar.append(tu.out_proj(w @ tu.v_proj(x)).mean(0))
        tok = tu.w1(torch.stack(h_bar)) + tu.w2(v_c)
        ref = (0.5 * (base + tok)).clamp(-6.0, 2.0)
    torch.testing.assert_close(out.video_logvar_diag, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_masked_garbage_frames_do_not_change_costs(variant: str) -> None:
    model = perturb(DABModel(small_cfg(variant=variant))).eval()
    text, frames, mask = batch()
    gen = torch.Generator().manual_seed(9)
    garbage = torch.randn(frames.shape[0], 3, D, generator=gen) * 1e3
    padded = torch.cat([frames, garbage], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(frames.shape[0], 3, dtype=torch.bool)], dim=1)
    # and overwrite the already-masked frames too
    padded[:, :F_][~mask] = 1e4
    with torch.no_grad():
        a = model(text, frames, mask)
        b = model(text, padded, padded_mask)
    torch.testing.assert_close(a.cost, b.cost, rtol=1e-5, atol=1e-4)


def test_pair_diagnostics_match_grid_diagonal() -> None:
    model = perturb(DABModel(small_cfg(variant="dab"))).eval()
    text, frames, mask = batch()
    gt = torch.tensor([2, 0, 4, 1, 3])
    with torch.no_grad():
        ts, vs = model.encode_text(text), model.encode_video(frames, mask)
        diag = model.pair_diagnostics(ts, vs, gt)
        terms = model.pair_terms(ts, vs)
    q = torch.arange(5)
    torch.testing.assert_close(diag.text_var, ts.logvar.exp().mean(-1))
    torch.testing.assert_close(diag.bridged_var, terms.bridged_logvar[q, gt].exp().mean(-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(diag.video_var, terms.video_logvar[q, gt].exp().mean(-1), rtol=1e-5, atol=1e-6)
    assert DABModel(small_cfg(variant="xpool")).pair_diagnostics(ts, vs).text_var is None


def test_input_shape_errors() -> None:
    model = DABModel(small_cfg())
    with pytest.raises(ValueError, match="embed_dim=16"):
        model.encode_text(torch.zeros(2, 8))
    with pytest.raises(ValueError, match="mask shape"):
        model.encode_video(torch.zeros(2, 3, D), torch.ones(2, 4, dtype=torch.bool))


# ----------------------------------------------------------------------------- training signal


OPTIONS = [{"variant": v} for v in VARIANTS] + [
    {"variant": "dab", "drift": "constant"},
    {"variant": "bridge", "drift": "constant"},
    {"variant": "dab", "drift_inputs": "residual"},
    {"variant": "bridge", "drift_inputs": "residual"},
    {"variant": "dab", "variance": "fixed"},
    {"variant": "prob", "variance": "fixed"},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
def test_every_parameter_gets_a_gradient(options: dict) -> None:
    torch.manual_seed(0)
    model = DABModel(small_cfg(dropout=0.3, learn_tau=True, **options))
    text, frames, mask = batch()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}  # fixed variances: frozen
    train_loss(model, model(text, frames, mask)).backward()
    for name, p in params.items():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), name
    # zero-initialised drift heads block the gradient to the layers below them on the
    # first step only; after one update every parameter must receive signal
    torch.optim.SGD(model.parameters(), lr=0.05).step()
    model.zero_grad()
    train_loss(model, model(text, frames, mask)).backward()
    silent = [n for n, p in params.items() if p.grad is None or p.grad.abs().max() == 0]
    assert not silent, f"no gradient reached {silent}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_overfits_16_pairs(variant: str) -> None:
    torch.manual_seed(0)
    b = 16
    text = torch.randn(b, D)
    frames = torch.randn(b, F_, D)
    mask = torch.ones(b, F_, dtype=torch.bool)
    mask[::3, -1] = False
    model = DABModel(small_cfg(variant=variant))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        loss = train_loss(model, model(text, frames, mask))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        cost = model.pair_costs(model.encode_text(text), model.encode_video(frames, mask))
    r1 = (cost.argmin(dim=1) == torch.arange(b)).float().mean().item()
    assert r1 == 1.0, f"{variant}: train R@1 {r1:.3f} after 150 steps (loss {loss.item():.4f})"


def test_point_bridge_variant_equals_xpool_at_init() -> None:
    torch.manual_seed(0)
    xpool = DABModel(small_cfg(variant="xpool")).eval()
    bridge = DABModel(small_cfg(variant="bridge")).eval()
    bridge.load_state_dict(xpool.state_dict(), strict=False)
    text, frames, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(bridge(text, frames, mask).cost, xpool(text, frames, mask).cost)


@pytest.mark.parametrize("variant", ["xpool", "bridge", "prob", "dab"])
def test_costs_and_loss_stay_float32_under_bf16_autocast(variant: str) -> None:
    torch.manual_seed(0)
    model = DABModel(ModelConfig(embed_dim=32, variant=variant, steps=2, drift_hidden=16, time_embed_dim=8)).eval()
    text, frames = torch.randn(6, 32), torch.randn(6, 4, 32)
    mask = torch.ones(6, 4, dtype=torch.bool)
    with torch.no_grad():
        ref = model(text, frames, mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(text, frames, mask)
            loss = train_loss(model, out)
    assert out.cost.dtype == torch.float32 and loss.dtype == torch.float32
    # only the products before the cost ran in bf16: the cost is close to float32's, not bf16-rounded
    rel = ((out.cost - ref.cost).abs().max() / ref.cost.abs().max()).item()
    assert rel < 0.05, rel


# ----------------------------------------------------------------------------- bridge state under autocast


def test_bridge_carries_its_state_in_float32_under_autocast() -> None:
    """Under bf16 autocast the encoders hand the bridge bf16 Gaussians; the T' updates must still accumulate in
    float32 (as the scoring engine does), or a 32-step trajectory drifts by bf16 rounding at every step."""
    cfg = small_cfg(steps=32)
    bridge = perturb(DistributionBridge(cfg), scale=0.05)
    gen = torch.Generator().manual_seed(1)
    ins = [
        torch.randn(20, D, generator=gen) * 3,
        torch.rand(20, D, generator=gen) - 2,
        torch.randn(20, D, generator=gen) * 3,
        torch.rand(20, D, generator=gen) - 2,
    ]
    ins16 = [x.bfloat16() for x in ins]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        mu, lv = bridge(*ins16)
        mu_ref, lv_ref = bridge(*[x.float() for x in ins16])  # the same values, handed over in float32
    assert mu.dtype == lv.dtype == torch.float32
    # bf16 -> float32 is exact, after which both run the same float32 computation: bit-equal on any CPU
    torch.testing.assert_close(mu, mu_ref, rtol=0, atol=0)
    torch.testing.assert_close(lv, lv_ref, rtol=0, atol=0)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_model_under_autocast_scores_like_the_bf16_engine(device: str) -> None:
    """Training under amp bf16 and scoring with the bf16 engine compute the same trajectory up to the bf16
    rounding of the products before the bridge (measured on CPU: 2.6 % of the mean cost, 16 % with a bf16
    state)."""
    from dab_pipeline.scoring import score_all

    torch.manual_seed(0)
    model = DABModel(ModelConfig(embed_dim=64, variant="dab", steps=32, drift_hidden=128, time_embed_dim=16)).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.bridge.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    text, frames = torch.randn(24, 64, generator=gen), torch.randn(20, 6, 64, generator=gen)
    mask = torch.ones(20, 6, dtype=torch.bool)
    model.to(device)
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        terms = model.pair_terms(
            model.encode_text(text.to(device)), model.encode_video(frames.to(device), mask.to(device))
        )
    assert terms.bridged_mu.dtype == terms.bridged_logvar.dtype == torch.float32
    engine = torch.as_tensor(score_all(model, text, frames, mask, dtype="bfloat16", device=device).cost)
    assert ((terms.cost.cpu() - engine).abs().max() / engine.abs().mean()).item() < 0.06


# ----------------------------------------------------------------------------- controls and study options


def test_fixed_variances_stay_at_their_initial_value_and_train_nothing() -> None:
    from dab_pipeline.stages.train.config import optimizer_groups

    for variant in ("prob", "dab"):
        torch.manual_seed(0)
        model = DABModel(small_cfg(variant=variant, variance="fixed"))
        text, frames, mask = batch()
        frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        assert frozen and all(n.startswith(("prob.logvar_head.", "token_unc.")) for n in frozen)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
        for _ in range(3):
            loss = train_loss(model, model(text, frames, mask))
            opt.zero_grad()
            loss.backward()
            opt.step()
        out = model(text, frames, mask)
        init = model.cfg.logvar_init
        assert torch.all(out.text_logvar == init) and torch.all(out.video_logvar_diag == init)
        groups = optimizer_groups(model, None, _train_cfg())
        trained = {id(p) for g in groups for p in g["params"]}
        assert not any(id(p) in trained for p in model.parameters() if not p.requires_grad)


def _train_cfg(**kw):
    from pathlib import Path

    from dab_pipeline.stages.train.config import TrainConfig

    return TrainConfig(features=Path("x.h5"), out=Path("run"), **kw)


def test_a_constant_drift_shifts_every_pair_alike_and_starts_as_prob() -> None:
    torch.manual_seed(0)
    prob = DABModel(small_cfg(variant="prob")).eval()
    torch.manual_seed(0)
    const = DABModel(small_cfg(variant="dab", drift="constant")).eval()
    const.load_state_dict(prob.state_dict(), strict=False)
    text, frames, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(const(text, frames, mask).cost, prob(text, frames, mask).cost)
        perturb(const.bridge, scale=0.3)  # a trained constant: the drift network on its time embedding alone
        ts = const.encode_text(text)
        terms = const.pair_terms(ts, const.encode_video(frames, mask))
        delta = const.bridge.total_shift()
    assert terms.bridged_mu.shape == (5, 5, D) and delta.abs().min() > 0
    shift = terms.bridged_mu - ts.mu[:, None]  # (Q, V, D)
    torch.testing.assert_close(shift, const.bridge.shift_mu.expand_as(shift))
    want_lv = (ts.logvar[:, None] + const.bridge.shift_logvar).clamp(const.cfg.logvar_min, const.cfg.logvar_max)
    torch.testing.assert_close(terms.bridged_logvar, want_lv.expand_as(terms.bridged_logvar))
    # the same network as the real drift, so the same parameters and learning dynamics
    real = DABModel(small_cfg(variant="dab"))
    assert [p.shape for p in const.bridge.parameters()] == [p.shape for p in real.bridge.parameters()]
    # an explicit shift (the evaluation's constant control) is exact
    want_mu, want_lv2 = torch.linspace(-1, 1, D), torch.linspace(0.5, -0.5, D)
    const.bridge.set_shift(want_mu, want_lv2)
    torch.testing.assert_close(const.bridge.shift_mu, want_mu, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(const.bridge.shift_logvar, want_lv2, rtol=1e-5, atol=1e-6)


def test_residual_drift_input_matches_an_explicit_concat_loop() -> None:
    """drift_inputs="residual": the drift sees [mu_t, sigma_t, mu_v, sigma_v, mu_v - mu_t, e_t]."""
    cfg = small_cfg(steps=5, drift_inputs="residual")
    bridge = perturb(DistributionBridge(cfg), scale=0.3)
    assert bridge.drift[0].in_features == 5 * D + cfg.time_embed_dim
    _explicit_bridge(bridge, cfg, residual=True)


def test_sum_normalised_step_sizes_integrate_over_unit_time() -> None:
    for steps in (1, 8, 32):
        chi = step_sizes(ModelConfig(steps=steps, chi_norm="sum"))
        paper = step_sizes(ModelConfig(steps=steps))
        assert abs(chi.sum().item() - 1.0) < 1e-5 and torch.all(chi > 0)
        if steps > 1:  # proportional to the paper's raw sqrt(1 - alpha_bar), not to its min-max map
            raw = torch.sqrt(1 - torch.cumprod(1 - beta_schedule(1000, 1e-4, 2e-2), 0))[:steps].float()
            torch.testing.assert_close(chi, raw / raw.sum())
            assert not torch.allclose(chi / chi.sum(), paper / paper.sum())


def test_a_random_drift_output_init_leaves_the_identity() -> None:
    gen = torch.Generator().manual_seed(1)
    mu_t, lv_t = torch.randn(3, D, generator=gen), torch.rand(3, D, generator=gen) - 2
    mu_v, lv_v = torch.randn(3, D, generator=gen), torch.rand(3, D, generator=gen) - 2
    with torch.no_grad():
        for init, moved in ((0.0, False), (0.01, True)):
            torch.manual_seed(0)
            mu, _ = DistributionBridge(small_cfg(drift_init=init))(mu_t, lv_t, mu_v, lv_v)
            assert (not torch.equal(mu, mu_t)) == moved  # a zero drift: mu_t - chi * 0 is mu_t on any CPU


def test_bridge_lr_puts_the_bridge_in_its_own_group() -> None:
    from dab_pipeline.stages.train.config import optimizer_groups

    model = DABModel(small_cfg(variant="dab"))
    groups = {g["name"]: g for g in optimizer_groups(model, None, _train_cfg(bridge_lr=3e-3))}
    assert groups["bridge"]["lr"] == 3e-3 and groups["new"]["lr"] == 1e-4
    assert {id(p) for p in groups["bridge"]["params"]} == {id(p) for p in model.bridge.parameters()}
    assert not {id(p) for p in groups["new"]["params"]} & {id(p) for p in model.bridge.parameters()}
    assert "bridge" not in {g["name"] for g in optimizer_groups(model, None, _train_cfg())}


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("variance", "none", "learned | fixed"),
        ("drift", "linear", "mlp | constant"),
        ("drift_inputs", "diff", "paper | residual"),
        ("chi_norm", "max", "minmax | sum"),
        ("drift_init", -1.0, ">= 0"),
    ],
)
def test_control_options_are_validated(field: str, value, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        ModelConfig(**{field: value})
