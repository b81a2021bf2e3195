"""PAC and X-Pool InfoNCE against explicit references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.model.losses import contrastive_loss, infonce_loss, loss_of, pac_loss


def test_pac_equals_bidirectional_cross_entropy() -> None:
    gen = torch.Generator().manual_seed(0)
    cost = torch.rand(9, 9, generator=gen, dtype=torch.float64) * 50
    tau = 3.5
    target = torch.arange(9)
    ref = F.cross_entropy(-cost / tau, target) + F.cross_entropy((-cost / tau).T, target)
    torch.testing.assert_close(pac_loss(cost, tau), ref)


def test_pac_matches_the_paper_formula_term_by_term() -> None:
    gen = torch.Generator().manual_seed(1)
    c = torch.rand(5, 5, generator=gen, dtype=torch.float64) * 10
    tau, b = 0.7, 5
    total = 0.0
    for i in range(b):
        row = sum(math.exp(-c[i, j].item() / tau) for j in range(b))
        col = sum(math.exp(-c[j, i].item() / tau) for j in range(b))
        e = math.exp(-c[i, i].item() / tau)
        total += math.log(e / row) + math.log(e / col)
    assert pac_loss(c, tau).item() == pytest.approx(-total / b, rel=1e-12)


def test_pac_tensor_tau_gets_gradient() -> None:
    cost = torch.rand(4, 4)
    log_tau = torch.zeros((), requires_grad=True)
    pac_loss(cost, log_tau.exp()).backward()
    assert log_tau.grad is not None and log_tau.grad.abs() > 0


def test_infonce_is_xpool_average() -> None:
    gen = torch.Generator().manual_seed(2)
    sim = torch.rand(6, 6, generator=gen) * 2 - 1
    logits = sim * 100.0  # CLIP's logit_scale * cos
    target = torch.arange(6)
    ref = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))
    torch.testing.assert_close(infonce_loss(-sim, torch.tensor(1 / 100.0)), ref)


def test_losses_reject_non_square() -> None:
    with pytest.raises(ValueError, match="square"):
        pac_loss(torch.zeros(3, 4), 1.0)
    with pytest.raises(ValueError, match="square"):
        infonce_loss(torch.zeros(3), 1.0)


@pytest.mark.parametrize("variant", ["xpool", "prob", "bridge", "dab"])
def test_each_variant_trains_with_its_spec_s_loss_and_temperature(variant: str) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(embed_dim=8, variant=variant, steps=2, drift_hidden=8, time_embed_dim=4, dropout=0.0)
    model = DABModel(cfg)
    out = model(torch.randn(3, 8), torch.randn(3, 2, 8), torch.ones(3, 2, dtype=torch.bool))
    if variant in ("xpool", "bridge"):
        assert loss_of(cfg.spec) is infonce_loss
        ref = infonce_loss(out.cost, 1 / model.log_logit_scale.exp())
    else:
        assert loss_of(cfg.spec) is pac_loss
        ref = pac_loss(out.cost, model.tau())
    torch.testing.assert_close(contrastive_loss(loss_of(cfg.spec), out.cost, model.temperature()), ref)
