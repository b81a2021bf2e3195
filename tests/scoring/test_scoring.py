"""Chunked reference scoring against the unchunked per-pair computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dab_pipeline.core.events import Event
from dab_pipeline.model import DABModel
from dab_pipeline.scoring import ScoreResult, score_all, score_all_reference

from ..helpers.models import random_inputs, small_model

D, F_ = 16, 5
Q, V = 11, 7


def make(variant: str, seed: int = 0) -> DABModel:
    return small_model(variant, seed=seed)


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return random_inputs(Q, V, F_, D, seed)


def unchunked(model: DABModel, text, frames, mask) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return model.pair_costs(model.encode_text(text), model.encode_video(frames, mask)).numpy()


@pytest.mark.parametrize("variant", ["xpool", "prob", "bridge", "dab"])
@pytest.mark.parametrize("chunks", [(1, 1), (3, 2), (4, 5), (Q, V), (128, 512)])
def test_chunked_equals_unchunked(variant: str, chunks: tuple[int, int]) -> None:
    model = make(variant)
    text, frames, mask, _ = data()
    ref = unchunked(model, text, frames, mask)
    res = score_all(model, text, frames, mask, text_chunk=chunks[0], video_chunk=chunks[1])
    assert isinstance(res, ScoreResult)
    assert res.cost.dtype == np.float32 and res.cost.shape == (Q, V)
    np.testing.assert_allclose(res.cost, ref, rtol=1e-5, atol=1e-4)


def test_blocks_are_bounded_by_the_chunk_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make("dab")
    text, frames, mask, _ = data()
    seen: list[tuple[int, int]] = []
    original = model.pair_costs

    def spy(ts, vs):
        seen.append((len(ts), len(vs)))
        return original(ts, vs)

    monkeypatch.setattr(model, "pair_costs", spy)
    score_all_reference(model, text, frames, mask, text_chunk=4, video_chunk=3)
    assert max(s[0] for s in seen) <= 4 and max(s[1] for s in seen) <= 3
    assert sum(a * b for a, b in seen) == Q * V  # every pair exactly once


def test_diagnostics_for_ground_truth_pairs() -> None:
    model = make("dab")
    text, frames, mask, gt = data()
    res = score_all(model, text, frames, mask, text_chunk=4, video_chunk=3, gt=gt)
    model.eval()
    with torch.no_grad():
        ts, vs = model.encode_text(text), model.encode_video(frames, mask)
        terms = model.pair_terms(ts, vs)
    q = torch.arange(Q)
    np.testing.assert_allclose(res.text_var, ts.logvar.exp().mean(-1).numpy(), rtol=1e-5)
    np.testing.assert_allclose(res.bridged_var, terms.bridged_logvar[q, gt].exp().mean(-1).numpy(), rtol=1e-5)
    np.testing.assert_allclose(res.video_var, terms.video_logvar[q, gt].exp().mean(-1).numpy(), rtol=1e-5)
    assert res.text_var.shape == res.bridged_var.shape == res.video_var.shape == (Q,)


def test_prob_variant_bridged_var_is_text_var() -> None:
    model = make("prob")
    text, frames, mask, gt = data()
    res = score_all(model, text, frames, mask, text_chunk=5, video_chunk=2, gt=gt.numpy())
    np.testing.assert_allclose(res.bridged_var, res.text_var, rtol=1e-6)


def test_padding_a_video_with_masked_garbage_keeps_its_costs() -> None:
    model = make("dab")
    text, frames, mask, _ = data()
    gen = torch.Generator().manual_seed(3)
    padded = torch.cat([frames, torch.randn(V, 4, D, generator=gen) * 100], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(V, 4, dtype=torch.bool)], dim=1)
    a = score_all(model, text, frames, mask, text_chunk=4, video_chunk=3).cost
    b = score_all(model, text, padded, padded_mask, text_chunk=4, video_chunk=3).cost
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_numpy_inputs_progress_and_mode_restored() -> None:
    model = make("bridge")
    model.train()
    text, frames, mask, _ = data()
    events: list[Event] = []
    ro = frames.numpy().copy()
    ro.setflags(write=False)  # like a memory-mapped store
    res = score_all(
        model, text.numpy().astype(np.float64), ro, mask.numpy(), text_chunk=5, video_chunk=4, progress=events.append
    )
    assert model.training  # the caller's mode is restored
    np.testing.assert_allclose(res.cost, unchunked(model, text, frames, mask), rtol=1e-5, atol=1e-4)
    kinds = [e.kind for e in events]
    assert kinds[0] == "start" and events[0].total == 3 * 2 and kinds[-1] == "end"
    assert sum(e.n for e in events if e.kind == "advance") == 6


def test_input_errors() -> None:
    model = make("dab")
    text, frames, mask, gt = data()
    with pytest.raises(ValueError, match="text must be"):
        score_all(model, text[:, :8], frames, mask)
    with pytest.raises(ValueError, match="mask must be"):
        score_all(model, text, frames, mask[:, :2])
    with pytest.raises(ValueError, match="chunk"):
        score_all(model, text, frames, mask, text_chunk=0)
    with pytest.raises(ValueError, match="gt indexes"):
        score_all(model, text, frames, mask, gt=gt + V)
