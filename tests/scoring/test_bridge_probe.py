"""The bridge diagnostics: its shift per pair, the constant-bridge control, and `dab evaluate`'s report of them,
on hand-built models whose bridge is constant, or pair-dependent, by construction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline.core.events import Event
from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.runs.costfile import CostMatrix, write_costs
from dab_pipeline.runs.run_folder import RunFolder
from dab_pipeline.scoring import constant_bridge, probe_bridge, score_all
from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate
from dab_pipeline.store import open_store
from dab_pipeline.testing import random_store

from ..helpers.models import hand_made_run, perturb
from ..helpers.runner import invoke

D, F_ = 16, 4


def make_constant(model: DABModel) -> DABModel:
    """A drift whose output layer has no weight: every step adds the same bias, whatever the pair."""
    last = model.bridge.drift[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.linspace(-0.3, 0.3, last.bias.numel()))
    return model


def make_pulling(model: DABModel) -> DABModel:
    """A drift that moves mu_t toward mu_v by chi of their difference at each step: pair-dependent by construction.

    Two-layer drift with 2D hidden units: h = SiLU([mu_v - mu_t, mu_t - mu_v]), and since
    SiLU(r) - SiLU(-r) = r, the output layer [-I, I] gives d_mu = mu_t - mu_v; everything
    else (sigma blocks, time embedding, log-variance rows) is zero.
    """
    bridge, d = model.bridge, model.cfg.embed_dim
    first, last = bridge.drift[0], bridge.drift[-1]
    eye = torch.eye(d)
    with torch.no_grad():
        for p in (*bridge.parameters(),):
            p.zero_()
        first.weight[:d, :d], first.weight[:d, 2 * d : 3 * d] = -eye, eye  # mu_v - mu_t
        first.weight[d:, :d], first.weight[d:, 2 * d : 3 * d] = eye, -eye  # mu_t - mu_v
        last.weight[:d, :d], last.weight[:d, d:] = -eye, eye
    return model


def pulling_cfg(**kw) -> ModelConfig:
    return ModelConfig(embed_dim=D, variant="dab", steps=4, drift_layers=2, drift_hidden=2 * D, time_embed_dim=8, **kw)


def inputs(seed: int = 0, q: int = 9, v: int = 8):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(q, D, generator=gen) * 2,
        torch.randn(v, F_, D, generator=gen) * 2,
        torch.ones(v, F_, dtype=torch.bool),
    )


def perturbed(cfg: ModelConfig) -> DABModel:
    torch.manual_seed(0)
    return perturb(DABModel(cfg), seed=1).eval()


def test_a_constant_bridge_has_no_pair_dependent_shift_and_its_control_is_itself() -> None:
    model = make_constant(perturbed(pulling_cfg()))
    text, frames, mask = inputs()
    probe = probe_bridge(model, text, frames, mask)
    assert probe.pair_dependent["mu"] < 1e-9 and probe.pair_dependent["logvar"] < 1e-9
    chi = model.bridge.chi.sum().item()
    np.testing.assert_allclose(probe.mean_shift_mu, -chi * model.bridge.drift[-1].bias[:D].detach().numpy(), atol=1e-5)
    control = constant_bridge(model, probe.mean_shift_mu, probe.mean_shift_logvar)
    np.testing.assert_allclose(
        score_all(control, text, frames, mask).cost, score_all(model, text, frames, mask).cost, rtol=1e-4
    )


def test_a_pulling_bridge_is_pair_dependent() -> None:
    model = make_pulling(perturbed(pulling_cfg()))
    text, frames, mask = inputs()
    with torch.no_grad():  # the construction does what it says: mu_v + prod(1 - chi) (mu_t - mu_v)
        ts, vs = model.encode_text(text), model.encode_video(frames, mask)
        terms = model.pair_terms(ts, vs)
        keep = torch.prod(1 - model.bridge.chi)
        want = terms.video_mu + keep * (ts.mu[:, None] - terms.video_mu)
    torch.testing.assert_close(terms.bridged_mu, want, rtol=1e-4, atol=1e-4)
    probe = probe_bridge(model, text, frames, mask)
    assert probe.pair_dependent["mu"] > 0.5 and probe.shares["mu"]["interaction"] > 0.01
    assert probe.pair_dependent["logvar"] != probe.pair_dependent["logvar"] or probe.pair_dependent["logvar"] < 1e-9
    assert probe.texts.tolist() == list(range(9)) and probe.videos.tolist() == list(range(8))


def test_the_probe_grid_is_a_seeded_sample_of_big_splits() -> None:
    from dab_pipeline.scoring import probe_grid

    t, v = probe_grid(1000, 300, side=64, seed=3)
    assert len(t) == len(v) == 64 and np.all(np.diff(t) > 0) and t.max() < 1000 and v.max() < 300
    assert np.array_equal(probe_grid(1000, 300, side=64, seed=3)[0], t)


def test_the_point_bridge_is_probed_in_x() -> None:
    model = perturbed(ModelConfig(embed_dim=D, variant="bridge", steps=3, drift_hidden=24, time_embed_dim=8))
    text, frames, mask = inputs()
    probe = probe_bridge(model, text, frames, mask)
    assert set(probe.shares) == {"mu"} and probe.mean_shift_logvar is None and 0 < probe.pair_dependent["mu"] < 1
    control = constant_bridge(model, probe.mean_shift_mu, None)
    assert control.cfg.drift == "constant" and control.cfg.variant == "bridge"
    assert np.isfinite(score_all(control, text, frames, mask).cost).all()


def _save(run: Path, model: DABModel) -> None:
    RunFolder(run).save_checkpoint(RunFolder.BEST, {"model": model.state_dict(), "heads": None, "epoch": 1})


@pytest.fixture(scope="module")
def bridge_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run folders (config, best.pt, costs_test.h5) of a constant bridge, a pulling bridge and a drift=constant
    model, on a random store (dim 32)."""
    from dab_pipeline.runs.load import load_run

    root = tmp_path_factory.mktemp("bridge")
    store = random_store(root / "store.h5", dim=32)
    with open_store(store) as st:
        test = st.load_split("test")
    specs = {
        "constant": ({}, make_constant),
        "pulling": ({"drift_layers": 2, "drift_hidden": 64}, make_pulling),
        "const-drift": ({"drift": "constant"}, None),
    }
    runs = {}
    for name, (kw, edit) in specs.items():
        run, model = hand_made_run(root / name, store, variant="dab", model_kw=kw)
        if edit is not None:
            _save(run, edit(model))
        cost = score_all(load_run(run).model, test.text, test.frames, test.frame_mask).cost
        write_costs(
            RunFolder(run).costs_path("test", "h5"),
            CostMatrix(
                cost=cost,
                query_ids=np.asarray(test.caption_ids),
                video_ids=np.asarray(test.video_ids),
                gt=np.asarray(test.caption_video, np.int64),
                kind="cost",
                attrs={"split": "test", "variant": "dab", "store": str(store)},
            ),
        )
        runs[name] = run
    return runs


def test_evaluate_reports_a_constant_bridge_and_warns(bridge_runs) -> None:
    events: list[Event] = []
    res = run_evaluate(EvaluateConfig(run=bridge_runs["constant"], plots=False, examples=0), progress=events.append)
    bridge = res["bridge"]
    assert bridge["pair_dependent_share"]["mu"] < 1e-6 and bridge["pair_dependent_share"]["logvar"] < 1e-6
    assert bridge["acts_as_constant"] is True
    assert any(e.kind == "warning" and "acts as a constant shift" in e.message for e in events)
    # the control is the same function here: the same retrieval, the same ranking
    assert bridge["constant_control"]["R@1"] == pytest.approx(res["t2v"]["R@1"])
    assert bridge["constant_control"]["same_top1"] == 100.0
    assert bridge["constant_control"]["rank_correlation"] == pytest.approx(1.0)
    assert bridge["probe"]["pairs"] == 10 * 5 and bridge["probe"]["of"] == [10, 5]
    saved = json.loads((bridge_runs["constant"] / "metrics.json").read_text())["bridge"]
    assert set(saved) >= {"pair_dependent_share", "constant_control", "decomposition", "probe"}
    assert "What the bridge does per pair" in (bridge_runs["constant"] / "report.md").read_text()


def test_evaluate_reports_a_pair_dependent_bridge_without_a_warning(bridge_runs) -> None:
    events: list[Event] = []
    res = run_evaluate(EvaluateConfig(run=bridge_runs["pulling"], plots=False, examples=0), progress=events.append)
    assert res["bridge"]["pair_dependent_share"]["mu"] > 0.5 and res["bridge"]["acts_as_constant"] is False
    assert not any(e.kind == "warning" and "constant shift" in e.message for e in events)
    assert set(res["bridge"]["constant_control"]) >= {"R@1", "MnR", "aurc", "same_top1", "rank_correlation"}
    assert res["bridge"]["constant_control"]["rank_correlation"] < 1.0


def test_a_constant_drift_run_is_constant_by_construction(bridge_runs) -> None:
    res = run_evaluate(EvaluateConfig(run=bridge_runs["const-drift"], plots=False, examples=0))
    assert res["bridge"] == {"drift": "constant", "pair_dependent_share": {"mu": 0.0, "logvar": 0.0}}


def test_the_cli_and_compare_show_the_bridge(bridge_runs, tmp_path: Path) -> None:
    res = invoke(["evaluate", "--run", str(bridge_runs["constant"]), "--no-plots"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # rich wraps at the terminal's width
    assert "pair-dependent share" in text and "replaced by its mean shift" in text
    assert "acts as a constant shift" in text  # the warning (stderr, mixed in by CliRunner)
    invoke(["evaluate", "--run", str(bridge_runs["pulling"]), "--no-plots"])
    out = invoke(
        ["compare", str(bridge_runs["constant"]), str(bridge_runs["pulling"]), "--out", str(tmp_path / "cmp.md")]
    )
    assert out.exit_code == 0, out.output
    md = (tmp_path / "cmp.md").read_text()
    assert "pair-dep. mu" in md and "const. R@1" in md and "0.0 %" in md
