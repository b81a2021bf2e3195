"""All-pairs scoring of a low-rank or mixture model (issue 36): the Scorer routes it through the model's own path in
bounded blocks, equal to a naive per-pair loop; the fast engines refuse it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.scoring import Scorer, build_engine, score_all
from dab_pipeline.scoring.covariance import covariance_chunks

from ..helpers.models import random_inputs, small_model


@pytest.fixture(scope="module", params=["lowrank:2", "mixture:2"])
def lowrank(request):
    return small_model("prob", covariance=request.param).eval()


def _naive(model, text, frames, mask) -> np.ndarray:
    out = np.empty((len(text), len(frames)), np.float32)
    with torch.no_grad():
        for i in range(len(text)):
            ts = model.encode_text(text[i : i + 1])
            for j in range(len(frames)):
                out[i, j] = float(model.pair_costs(ts, model.encode_video(frames[j : j + 1], mask[j : j + 1]))[0, 0])
    return out


def test_scorer_on_a_lowrank_model_equals_a_per_pair_loop_in_small_blocks(lowrank) -> None:
    text, frames, mask, gt = random_inputs()
    per_pair = 4 * 16 * (3 * 2 + 12) if lowrank.cfg.covariance == "lowrank:2" else 4 * 16 * (12 + 6 * 2)
    budget = per_pair * 6  # six pairs a block: many blocks
    assert covariance_chunks(lowrank, 11, 7, torch.device("cpu"), budget) == (2, 3)
    res = Scorer(lowrank, memory_budget=budget).score(text, frames, mask, gt=gt, topk=3)
    np.testing.assert_allclose(res.cost, _naive(lowrank, text, frames, mask), rtol=1e-5, atol=1e-5)
    assert res.info["engine"] == f"reference ({lowrank.cfg.covariance})"
    np.testing.assert_array_equal(res.topk_indices[:, 0], res.cost.argmin(1))
    assert res.video_var is not None and res.video_var.shape == (11,)
    np.testing.assert_allclose(score_all(lowrank, text, frames, mask).cost, res.cost, rtol=1e-6, atol=1e-6)


def test_a_lowrank_shortlist_scores_its_candidates_and_inf_elsewhere(lowrank) -> None:
    text, frames, mask, _ = random_inputs()
    full = score_all(lowrank, text, frames, mask).cost
    res = Scorer(lowrank).score(text, frames, mask, shortlist=3)
    kept = np.isfinite(res.cost)
    assert res.shortlist == 3 and (kept.sum(1) == 3).all()
    np.testing.assert_allclose(res.cost[kept], full[kept], rtol=1e-5, atol=1e-5)


def test_the_fast_engines_refuse_a_lowrank_model(lowrank) -> None:
    with pytest.raises(ConfigError, match="diagonal Gaussians only"):
        build_engine(lowrank, torch.device("cpu"), torch.float32)
