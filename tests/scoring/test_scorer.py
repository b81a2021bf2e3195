"""Scorer: engines built once and kept, rebuilt when the weights change, and the same numbers as score_all and
the plain reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dab_pipeline.scoring import Scorer, score_all, score_all_reference
from dab_pipeline.scoring import scorer as scorer_module
from dab_pipeline.scoring.reference import score_query

from ..helpers.models import random_inputs, small_model

F_ = 5


@pytest.fixture()
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch hint of every engine a Scorer builds (a spy on scorer.build_engine)."""
    seen: list[int] = []
    real = scorer_module.build_engine

    def spy(model, device, mm_dtype, batch_hint=1024):
        seen.append(batch_hint)
        return real(model, device, mm_dtype, batch_hint=batch_hint)

    monkeypatch.setattr(scorer_module, "build_engine", spy)
    return seen


def assert_close(fast: np.ndarray, ref: np.ndarray, variant: str) -> None:
    """Within 1e-4 of the reference (cosine costs relative to max(|cost|, 0.01): they cross zero)."""
    floor = 1e-2 if variant in ("xpool", "bridge") else 1e-12
    assert (np.abs(fast - ref) / np.maximum(np.abs(ref), floor)).max() <= 1e-4


@pytest.mark.parametrize("variant", ["xpool", "prob", "bridge", "dab"])
def test_a_kept_scorer_builds_each_engine_once_and_scores_like_score_all(variant: str, builds: list[int]) -> None:
    model = small_model(variant)
    text, frames, mask, gt = random_inputs(q=9, v=8, frames=F_)
    ref = score_all_reference(model, text, frames, mask, gt=gt)
    scorer = Scorer(model)
    first = scorer.score(text, frames, mask, gt=gt, k=3)
    again = scorer.score(text, frames, mask, gt=gt, k=3)
    short = scorer.score(text, frames, mask, shortlist=4)  # the same grid: the same engine
    assert builds == [9 * 8]
    one = scorer.score(text[:1], frames, mask)  # another batch hint: a second engine
    scorer.score(text, frames, mask)
    assert builds == [9 * 8, 8]
    plain = score_all(model, text, frames, mask, gt=gt, k=3)
    # score_all is a Scorer of the same options and grid: the same engine and tiles, bit-equal on any CPU
    for res in (first, again):
        np.testing.assert_array_equal(res.cost, plain.cost)
        np.testing.assert_array_equal(res.topk_indices, plain.topk_indices)
        assert_close(res.cost, ref.cost, variant)
        for name in ("text_var", "bridged_var", "video_var"):
            got, want = getattr(res, name), getattr(ref, name)
            assert (got is None) == (want is None), name
            if want is not None:
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(short.cost, score_all(model, text, frames, mask, shortlist=4).cost)  # likewise
    assert_close(one.cost, ref.cost[:1], variant)
    assert scorer.prepare(9, 8, F_)["block_pairs"] == first.info["block_pairs"]


def test_weights_changed_in_place_rebuild_the_engines(builds: list[int]) -> None:
    model = small_model("dab")
    text, frames, mask, _ = random_inputs(q=6, v=5, frames=F_)
    scorer = Scorer(model)
    before = scorer.score(text, frames, mask).cost
    with torch.no_grad():  # an optimiser step: the weights move in place
        for p in model.parameters():
            p.mul_(1.05)
    after = scorer.score(text, frames, mask).cost
    assert len(builds) == 2 and not np.allclose(after, before)
    assert_close(after, score_all_reference(model, text, frames, mask).cost, "dab")
    model.load_state_dict(small_model("dab", seed=7).state_dict())  # a checkpoint loaded into the same model
    reloaded = scorer.score(text, frames, mask).cost
    assert len(builds) == 3
    assert_close(reloaded, score_all_reference(model, text, frames, mask).cost, "dab")
    scorer.score(text, frames, mask)
    assert len(builds) == 3  # unchanged since: kept


def test_weights_or_modules_assigned_anew_rebuild_the_engines(builds: list[int]) -> None:
    """A parameter, a submodule or a buffer assigned (not written in place) after a call: the next call walks the
    model again and scores the new weights; a call to a model that is unchanged walks nothing."""
    model = small_model("dab")
    text, frames, mask, _ = random_inputs(q=6, v=5, frames=F_)
    scorer = Scorer(model)
    scorer.score(text, frames, mask)
    other = small_model("dab", seed=7)
    model.prob.mu_head.weight = torch.nn.Parameter(other.prob.mu_head.weight.detach().clone())  # a new Parameter
    got = scorer.score(text, frames, mask).cost
    assert len(builds) == 2
    assert_close(got, score_all_reference(model, text, frames, mask).cost, "dab")
    model.prob.logvar_head = other.prob.logvar_head  # a new submodule, with its weights
    got = scorer.score(text, frames, mask).cost
    assert len(builds) == 3
    assert_close(got, score_all_reference(model, text, frames, mask).cost, "dab")
    model.train()  # the training flag is seen without a walk: eval during the call, restored after
    scorer.score(text, frames, mask)
    assert model.training and len(builds) == 3
    # changes that fire no torch hook: a conversion that replaces buffers, then a write into one; a dict written
    model.double()
    model.float()
    scorer.score(text, frames, mask)
    with torch.no_grad():
        model.bridge.chi.mul_(1.5)
    got = scorer.score(text, frames, mask).cost
    assert_close(got, score_all_reference(model, text, frames, mask).cost, "dab")
    model.prob._modules["mu_head"] = small_model("dab", seed=9).prob.mu_head
    got = scorer.score(text, frames, mask).cost
    assert_close(got, score_all_reference(model, text, frames, mask).cost, "dab")
    n = len(builds)
    scorer.score(text, frames, mask)
    assert len(builds) == n  # unchanged since: kept


def test_engines_are_bounded_and_freed_on_close(builds: list[int]) -> None:
    model = small_model("dab")
    text, frames, mask, _ = random_inputs(q=6, v=5, frames=F_)
    with Scorer(model) as scorer:
        for q in range(1, scorer_module.MAX_ENGINES + 2):  # one shape more than it keeps
            scorer.score(text[:q], frames, mask)
        assert len(builds) == scorer_module.MAX_ENGINES + 1
        scorer.score(text[:1], frames, mask)  # the oldest was dropped
        assert len(builds) == scorer_module.MAX_ENGINES + 2
        scorer.score(text[: scorer_module.MAX_ENGINES + 1], frames, mask)  # the newest is kept
        assert len(builds) == scorer_module.MAX_ENGINES + 2
    scorer.score(text[:1], frames, mask)  # closed: built again
    assert len(builds) == scorer_module.MAX_ENGINES + 3


def test_score_query_is_one_row_of_the_grid() -> None:
    # one query's shortlist through the engines' one-text path (tests/scoring/test_one_query.py)
    model = small_model("dab")
    text, frames, mask, _ = random_inputs(q=3, v=6, frames=F_)
    exact = Scorer(model).score_query(text[1], frames, mask)
    np.testing.assert_allclose(exact, score_all_reference(model, text, frames, mask).cost[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(exact, score_query(model.eval(), text[1], frames, mask), rtol=1e-5, atol=1e-6)
