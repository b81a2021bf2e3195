"""Scorer.score_query, one query's shortlist: the engines' one-text path (``Engine.one_query``, no per-video bases)
against the plain reference it replaced, the model's own path (``scoring.score_query``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.scoring import Scorer, build_engine, score_query
from dab_pipeline.scoring import scorer as scorer_module
from dab_pipeline.scoring.kernels.cpu import eager_kernels, get_kernels

from ..helpers.models import random_inputs, small_model

F_ = 5


def inputs(v: int = 9, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three texts and v videos: two short ones (random_inputs) and one without a real frame."""
    text, frames, mask, _ = random_inputs(q=3, v=v, frames=F_, dim=dim, seed=seed)
    mask[6 % v] = False
    return text, frames, mask


@pytest.fixture()
def no_model_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails a test whose Scorer.score_query falls back to the model's own path."""

    def refuse(*args, **kwargs):
        raise AssertionError("Scorer.score_query took the model's path")

    monkeypatch.setattr(scorer_module, "score_query", refuse)


@pytest.mark.parametrize(
    "variant,cfg",
    [
        ("prob", {}),
        ("dab", {}),
        ("dab", {"num_heads": 2, "drift_inputs": "residual"}),  # heads merged one by one; the residual folded
        ("dab", {"cost": "w2"}),
        ("dab", {"drift": "constant"}),  # dab-const: the shifted texts, prob's cost
        ("dab", {"steps": 1}),
    ],
)
def test_float32_is_the_model_path(variant: str, cfg: dict, no_model_path: None) -> None:
    model = small_model(variant, **cfg)
    text, frames, mask = inputs()
    ref = score_query(model.eval(), text[1], frames, mask)
    got = Scorer(model).score_query(text[1], frames, mask)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_blocks_of_videos_and_array_inputs_give_the_same_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model("dab")
    text, frames, mask = inputs(v=11)
    whole = Scorer(model).score_query(text[0], frames, mask)
    monkeypatch.setattr(scorer_module, "ONE_QUERY_CHUNK", 4)  # 11 videos: blocks of 4, 4 and 3
    blocks = Scorer(model).score_query(text[0].numpy(), frames.numpy(), mask.numpy())
    np.testing.assert_allclose(blocks, whole, rtol=1e-6, atol=1e-7)
    assert Scorer(model).score_query(text[0], frames[:0], mask[:0]).shape == (0,)
    with pytest.raises(ValueError, match="mask shape"):
        Scorer(model).score_query(text[0], frames, mask[:, :2])


@pytest.mark.parametrize("variant", ["xpool", "bridge"])
def test_variants_without_a_one_text_path_take_the_model_path(variant: str) -> None:
    model = small_model(variant)
    text, frames, mask = inputs()
    got = Scorer(model).score_query(text[2], frames, mask)
    # the Scorer calls this very function on the same inputs: the same computation, bit-equal on any CPU
    np.testing.assert_array_equal(got, score_query(model.eval(), text[2], frames, mask))


def test_layer_norms_that_differ_take_the_model_path() -> None:
    # the one-text path normalises the frames once for both LayerNorms that read them: it needs their eps equal
    model = small_model("dab")
    model.token_unc.ln.eps = 1e-3
    text, frames, mask = inputs()
    got = Scorer(model).score_query(text[0], frames, mask)
    # the Scorer calls this very function on the same inputs: the same computation, bit-equal on any CPU
    np.testing.assert_array_equal(got, score_query(model.eval(), text[0], frames, mask))


def test_a_scorer_leaves_the_training_flag_and_keeps_one_engine() -> None:
    model = small_model("dab").train()
    text, frames, mask = inputs()
    scorer = Scorer(model)
    first = scorer.score_query(text[0], frames, mask)
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    for q in range(3):
        scorer.score_query(text[q], frames, mask)
    assert not model.training and len(scorer._engines) == 1
    # the same engine on the same inputs (the Scorer scores in eval mode either way): bit-equal on any CPU
    np.testing.assert_array_equal(scorer.score_query(text[0], frames, mask), first)


def amx_sized_model(steps: int = 3) -> DABModel:
    """D = 32, drift 64: every width a multiple of 32, so the bridge runs on AMX where the CPU has it."""
    torch.manual_seed(0)
    model = DABModel(ModelConfig(embed_dim=32, num_heads=2, drift_hidden=64, time_embed_dim=8, steps=steps)).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(torch.randn(prm.shape, generator=gen) * 0.05)
    return model


@pytest.mark.parametrize("kernels,products", [("compiled", "amx"), ("eager", "amx"), ("compiled", "onednn")])
def test_bf16_is_close_to_the_float32_reference(kernels: str, products: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # bf16 products before the bridge too (the model's path under autocast did the same): within the tolerance the
    # engine's bf16 grid is held to (test_amx), compiled per-frame kernels or their eager specs alike, the bridge
    # on AMX tiles (where the CPU has them) or oneDNN's products
    if products == "onednn":
        monkeypatch.setenv("DAB_AMX", "0")
    model = amx_sized_model()
    eng = build_engine(model, torch.device("cpu"), torch.bfloat16)
    if eng.onednn is None:
        pytest.skip("this torch build has no oneDNN bf16 linears")
    assert products == "amx" or eng.bridge_runner.amx is None
    if kernels == "compiled" and not get_kernels().fused:
        pytest.skip(f"compiled kernels unavailable here: {get_kernels().reason}")
    if kernels == "eager":
        monkeypatch.setattr(type(eng), "one_kernels", lambda self: eager_kernels("test"))
    text, frames, mask = inputs(v=40, dim=32)
    ref = score_query(model, text[1], frames, mask)
    got = Scorer(model, dtype="bfloat16").score_query(text[1], frames, mask)
    assert (np.abs(got - ref) / np.abs(ref)).max() < 2e-2
    grid = Scorer(model, dtype="bfloat16").score(text, frames, mask).cost[1]
    assert (np.abs(got - grid) / np.abs(ref)).max() < 2e-2


def test_compiled_and_eager_kernels_give_the_same_bf16_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    if not get_kernels().fused:
        pytest.skip(f"compiled kernels unavailable here: {get_kernels().reason}")
    model = amx_sized_model(steps=2)
    text, frames, mask = inputs(v=40, dim=32)
    compiled = Scorer(model, dtype="bfloat16").score_query(text[0], frames, mask)
    eng_class = type(build_engine(model, torch.device("cpu"), torch.float32))
    monkeypatch.setattr(eng_class, "one_kernels", lambda self: eager_kernels("test"))
    eager = Scorer(model, dtype="bfloat16").score_query(text[0], frames, mask)
    # the same arithmetic but for float32 sums in another order, which can move a bf16 rounding of a frame
    np.testing.assert_allclose(compiled, eager, rtol=5e-3)


@pytest.mark.parametrize(
    "variant,cfg",
    [
        ("prob", {}),
        ("prob", {"covariance": "mixture:2"}),  # a batch's queries a text a call (one_pairs), each with the terms
        ("dab", {}),
        ("dab", {"num_heads": 2}),
        ("dab", {"drift": "constant"}),
    ],
)
def test_cached_video_terms_give_the_costs_computed_without_them(variant: str, cfg: dict, no_model_path: None) -> None:
    """Scorer.video_terms are the model's token-branch terms; score_query / score_queries with them (float32, or
    float16 as an index keeps them) give what they give without."""
    model = small_model(variant, **cfg)
    text, frames, mask = inputs(v=11)
    scorer = Scorer(model)
    assert scorer.takes_video_terms()
    terms = scorer.video_terms(frames, mask)
    with torch.no_grad():
        want_terms = model.token_unc.video_term(frames, mask)
    np.testing.assert_allclose(terms, want_terms.numpy(), rtol=1e-6, atol=1e-6)
    # 4 + 4 + 3 videos: products of other shapes, which may differ by a rounding (they do on Zen 3 and Zen 5)
    np.testing.assert_allclose(scorer.video_terms(frames, mask, chunk=4), terms, rtol=1e-6, atol=1e-6)
    plain = scorer.score_query(text[1], frames, mask)
    np.testing.assert_allclose(scorer.score_query(text[1], frames, mask, terms), plain, rtol=1e-5, atol=1e-6)
    half = scorer.score_query(text[1], frames, mask, terms.astype(np.float16))
    np.testing.assert_allclose(half, plain, rtol=2e-3, atol=1e-4)  # the terms rounded to float16
    lists = [np.array([3, 0, 7]), np.arange(11)]
    both = scorer.score_queries(text[:2], frames, mask, lists, terms)
    for i, rows in enumerate(lists):
        np.testing.assert_allclose(both[i], scorer.score_query(text[i], frames[rows], mask[rows]), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="terms"):
        scorer.score_query(text[1], frames, mask, terms[:-1])
    with pytest.raises(ValueError, match="must be"):  # frames without their videos' axis, a mask of another shape
        scorer.video_terms(frames[0], mask)
    with pytest.raises(ValueError, match="must be"):
        scorer.video_terms(frames, mask[:-1])


def test_cached_video_terms_in_bf16_and_models_without_a_token_branch() -> None:
    model = amx_sized_model(steps=2)
    text, frames, mask = inputs(v=40, dim=32)
    scorer = Scorer(model, dtype="bfloat16")
    terms = scorer.video_terms(frames, mask)
    plain = scorer.score_query(text[0], frames, mask)
    cached = scorer.score_query(text[0], frames, mask, terms)
    # the cached terms skip the bf16 token products: closer to float32, within the bf16 path's own tolerance
    ref = score_query(model, text[0], frames, mask)
    assert (np.abs(cached - ref) / np.abs(ref)).max() < 2e-2
    np.testing.assert_allclose(cached, plain, rtol=5e-3)
    xpool, (text, frames, mask) = small_model("xpool"), inputs()
    assert Scorer(xpool).video_terms(frames, mask) is None  # no token branch: nothing to cache
    assert not Scorer(xpool).takes_video_terms()
    for cov in ("lowrank:2", "mixture:2"):  # re-ranked by the model's own path, which computes the terms itself
        other = Scorer(small_model("dab", covariance=cov))
        assert not other.takes_video_terms() and other.video_terms(frames, mask) is None
    assert not Scorer(small_model("prob", covariance="lowrank:2")).takes_video_terms()
    assert Scorer(small_model("prob", covariance="mixture:2")).takes_video_terms()  # its one-text path, a text a call
    got = Scorer(xpool).score_query(text[0], frames, mask, np.zeros((9, 16), np.float32))  # the model's path
    np.testing.assert_allclose(got, score_query(xpool.eval(), text[0], frames, mask), rtol=1e-5)
