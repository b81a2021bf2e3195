"""Sub-block sizes from measured rates: the choice, its cache, and that scoring is unchanged by it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline.runtime.capabilities import onednn_bf16
from dab_pipeline.scoring import score_all
from dab_pipeline.scoring import tiles
from dab_pipeline.testing import random_inputs, small_model


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAB_KERNEL_CACHE", str(tmp_path / "cache" / "kernels"))
    monkeypatch.setattr(tiles, "_memo", {})


def test_picks_the_fastest_candidate_within_the_budget_and_caches_it() -> None:
    model = small_model("dab")
    rate = {256: 3.0, 512: 2.0, 768: 1.0, 1024: 1.5, 2048: 0.5}  # seconds a pair, made up; 2048 is over p_max
    asked: list[int] = []

    def measure(p: int) -> float:
        asked.append(p)
        return rate.get(p, 9.0)

    assert tiles.tuned_pairs(model, torch.device("cpu"), torch.bfloat16, 4, p_max=1100, measure=measure) == 768
    assert max(asked) <= 1100 and 2048 not in asked
    tiles._memo.clear()  # a new process: the file answers, nothing is measured
    assert tiles.tuned_pairs(model, torch.device("cpu"), torch.bfloat16, 4, p_max=1100,
                             measure=lambda p: pytest.fail("measured again")) == 768
    assert tiles.tiles_cache_path().is_file()
    other = small_model("dab", steps=5)  # another shape: its own key
    assert tiles.tile_key(other, 4, torch.bfloat16) != tiles.tile_key(model, 4, torch.bfloat16)


def test_a_budget_below_every_candidate_uses_the_budget() -> None:
    model = small_model("dab")
    assert tiles.tuned_pairs(model, torch.device("cpu"), torch.bfloat16, 4, p_max=100, measure=lambda p: 1.0) == 100


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAB_TILE_TUNING", "0")
    assert not tiles.tuning_enabled()
    monkeypatch.setenv("DAB_TILE_TUNING", "auto")
    assert tiles.tuning_enabled()


@pytest.mark.skipif(not onednn_bf16(), reason="bf16 products are not native on this CPU")
def test_tuned_blocks_score_like_untuned_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model("dab")
    text, frames, mask, _ = random_inputs(q=250, v=200, frames=4, dim=16)  # 50,000 pairs: tuned
    monkeypatch.setattr(tiles, "TUNE_MIN_PAIRS", 50_000)
    tuned = score_all(model, text, frames, mask, dtype="bfloat16")
    monkeypatch.setenv("DAB_TILE_TUNING", "0")
    plain = score_all(model, text, frames, mask, dtype="bfloat16")
    assert tuned.info["block_pairs"] in tiles.CANDIDATES or tuned.info["block_pairs"] == plain.info["block_pairs"]
    np.testing.assert_allclose(tuned.cost, plain.cost, rtol=2e-3, atol=2e-3)
    assert (tuned.cost.argmin(1) == plain.cost.argmin(1)).mean() > 0.95
