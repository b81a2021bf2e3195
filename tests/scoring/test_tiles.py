"""Sub-block sizes from measured rates: the choice, its cache, and that scoring is unchanged by it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline.runtime.capabilities import onednn_bf16
from dab_pipeline.scoring import planning, score_all, tiles, tune_blocks

from ..helpers.models import random_inputs, small_model


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAB_KERNEL_CACHE", str(tmp_path / "cache" / "kernels"))
    monkeypatch.setattr(tiles, "_memo", {})


def square(cap: int) -> tuple[int, int]:
    t = int(cap**0.5)
    return t, cap // t


def test_picks_the_fastest_shape_and_caches_it() -> None:
    model = small_model("dab")
    rate = {square(256): 3.0, square(512): 2.0, square(768): 1.0, square(1024): 1.5}  # seconds a pair, made up
    asked: list[tuple[int, int]] = []

    def measure(tq: int, tv: int) -> float:
        asked.append((tq, tv))
        return rate[(tq, tv)]

    caps = [256, 512, 768, 1024]
    cpu = torch.device("cpu")
    assert tiles.tuned_pairs(model, cpu, torch.bfloat16, 4, caps, square, (300, 300), measure=measure) == 768
    assert sorted(asked) == sorted(rate)  # each sub-block shape measured once
    tiles._memo.clear()  # a new process: the file answers, nothing is measured
    assert (
        tiles.tuned_pairs(
            model, cpu, torch.bfloat16, 4, caps, square, (300, 300), measure=lambda *a: pytest.fail("measured again")
        )
        == 768
    )
    assert tiles.tiles_cache_path().is_file()
    # less free RAM, fewer caps: the cached rates answer; a new cap's shape alone is measured
    assert (
        tiles.tuned_pairs(
            model,
            cpu,
            torch.bfloat16,
            4,
            [256, 512],
            square,
            (300, 300),
            measure=lambda *a: pytest.fail("measured again"),
        )
        == 512
    )
    more: list[tuple[int, int]] = []
    assert (
        tiles.tuned_pairs(
            model,
            cpu,
            torch.bfloat16,
            4,
            caps + [2048],
            square,
            (300, 300),
            measure=lambda tq, tv: more.append((tq, tv)) or 0.1,
        )
        == 2048
    )
    assert more == [square(2048)]
    other = small_model("dab", steps=5)  # another shape: its own key
    assert tiles.tile_key(other, 4, torch.bfloat16) != tiles.tile_key(model, 4, torch.bfloat16)


def test_a_new_kernel_build_measures_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # bf16 rates depend on the compiled kernels (their source and flags): another build, another key
    model = small_model("dab")
    key, key32 = tiles.tile_key(model, 4, torch.bfloat16), tiles.tile_key(model, 4, torch.float32)
    monkeypatch.setattr(tiles, "build_key", lambda: "another-build")
    assert tiles.tile_key(model, 4, torch.bfloat16) != key
    assert tiles.tile_key(model, 4, torch.float32) == key32  # float32 runs ATen's products, not the kernels


def test_caps_that_cut_the_same_sub_block_are_measured_once() -> None:
    model = small_model("dab")
    asked: list[tuple[int, int]] = []
    got = tiles.tuned_pairs(
        model,
        torch.device("cpu"),
        torch.float32,
        4,
        [100, 120, 140],
        lambda cap: (10, 10),
        (50, 50),
        measure=lambda tq, tv: asked.append((tq, tv)) or 1.0,
    )
    assert got == 100 and asked == [(10, 10)]


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAB_TILE_TUNING", "0")
    assert not tiles.tuning_enabled()
    monkeypatch.setenv("DAB_TILE_TUNING", "auto")
    assert tiles.tuning_enabled()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tuned_blocks_score_like_untuned_ones(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    if dtype == "bfloat16" and not onednn_bf16():
        pytest.skip("bf16 products are not native on this CPU")
    model = small_model("dab")
    text, frames, mask, _ = random_inputs(q=250, v=200, frames=4, dim=16)  # 50,000 pairs: tuned
    chosen: list[list[int]] = []

    def smallest(model, dev, mm_dtype, n_f, caps, shape, grid, measure=None) -> int:
        chosen.append(caps)
        assert shape(caps[0])[0] * shape(caps[0])[1] <= caps[0]  # the driver's cut respects the cap
        return caps[0]  # 256 pairs: far from the budget's cut, so the two runs tile differently

    monkeypatch.setattr(planning, "tuned_pairs", smallest)
    tuned = score_all(model, text, frames, mask, dtype=dtype)
    monkeypatch.setenv("DAB_TILE_TUNING", "0")
    plain = score_all(model, text, frames, mask, dtype=dtype)
    assert chosen and tuned.info["block_pairs"] == 256 and plain.info["block_pairs"] > 256
    assert tuned.info["sub_blocks"] > plain.info["sub_blocks"]
    tol = 2e-3 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(tuned.cost, plain.cost, rtol=tol, atol=tol)


def test_no_tuning_below_the_threshold_or_with_a_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model("dab")
    monkeypatch.setattr(planning, "tuned_pairs", lambda *a, **k: pytest.fail("tuned"))
    assert tune_blocks(model, 100, 100, 4, "cpu", "float32") is None  # 10,000 pairs
    assert tune_blocks(model, 300, 300, 4, "cpu", "float32", memory_budget=1 << 20) is None
    assert tune_blocks(small_model("xpool"), 300, 300, 4, "cpu", "float32") is None  # no bridge
    monkeypatch.setenv("DAB_TILE_TUNING", "0")
    assert tune_blocks(model, 300, 300, 4, "cpu", "float32") is None
