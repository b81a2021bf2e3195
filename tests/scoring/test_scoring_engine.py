"""The fast scoring engine (score_all) against the plain reference on seeded random models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.core.events import Event
from dab_pipeline.model import DABModel, ModelConfig, bridge_macs_per_pair_step
from dab_pipeline.scoring import (
    ENGINES,
    default_memory_budget,
    engine_macs,
    pair_bytes,
    reference_macs,
    score_all,
    score_all_reference,
    topk_smallest,
)

from ..helpers.models import random_inputs, small_model

D, F_ = 16, 5
Q, V = 11, 7


def make(variant: str, cost: str = "kl", seed: int = 0, **kw) -> DABModel:
    return small_model(variant, cost=cost, seed=seed, **kw)


def data(seed: int = 0, q: int = Q, v: int = V, f: int = F_) -> tuple[torch.Tensor, ...]:
    return random_inputs(q, v, f, D, seed)


def assert_matches(fast: np.ndarray, ref: np.ndarray, variant: str, rtol: float = 1e-4) -> None:
    """Every cost within rtol of the reference, and the same best video for every query.

    Cosine costs live in [-1, 1] and cross zero, where a relative error is
    meaningless: they are compared relative to max(|cost|, 0.01).
    """
    assert fast.dtype == np.float32 and fast.shape == ref.shape
    floor = 1e-2 if variant in ("xpool", "bridge") else 1e-12
    rel = np.abs(fast - ref) / np.maximum(np.abs(ref), floor)
    assert rel.max() <= rtol, f"max relative error {rel.max():.2e}"
    np.testing.assert_array_equal(fast.argmin(axis=1), ref.argmin(axis=1))


VARIANT_COSTS = [(v, c) for v in ("xpool", "prob", "bridge", "dab") for c in ("kl", "w2")]


@pytest.mark.parametrize("variant,cost", VARIANT_COSTS)
@pytest.mark.parametrize("chunks", [(None, None), (4, 3), (5, 2), (Q, V), (128, 512)])
def test_engine_equals_reference(variant: str, cost: str, chunks: tuple) -> None:
    model = make(variant, cost)
    text, frames, mask, _ = data()
    ref = score_all_reference(model, text, frames, mask, text_chunk=4, video_chunk=3).cost
    res = score_all(model, text, frames, mask, text_chunk=chunks[0], video_chunk=chunks[1])
    assert_matches(res.cost, ref, variant)


@pytest.mark.parametrize("variant", ["xpool", "prob", "bridge", "dab"])
@pytest.mark.parametrize(
    "kw", [{"num_heads": 2}, {"num_heads": 4}, {"drift_layers": 2}, {"drift_layers": 4}, {"steps": 1}, {"steps": 7}]
)
def test_engine_equals_reference_across_configs(variant: str, kw: dict) -> None:
    model = make(variant, seed=3, **kw)
    text, frames, mask, _ = data(seed=4)
    ref = score_all_reference(model, text, frames, mask).cost
    assert_matches(score_all(model, text, frames, mask, text_chunk=3, video_chunk=4).cost, ref, variant)


@pytest.fixture()
def pair_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of pairs in every sub-block the engine runs (a spy on every registered engine's pairs)."""
    seen: list[int] = []

    def spy_on(original):
        def spy(self, ts, vs, keep=None, want_var=False):
            seen.append(len(vs) * ts.q.shape[1] if keep is None else len(keep))
            return original(self, ts, vs, keep, want_var)

        return spy

    for name in ENGINES:
        cls = ENGINES.get(name)
        if "pairs" in cls.__dict__:  # the constant-drift engines inherit theirs (spied on their base)
            monkeypatch.setattr(cls, "pairs", spy_on(cls.__dict__["pairs"]))
    return seen


@pytest.mark.parametrize("variant", ["xpool", "prob", "bridge", "dab"])
def test_tiny_memory_budget_splits_into_many_sub_blocks(variant: str, pair_blocks: list[int]) -> None:
    model = make(variant, "w2" if variant == "dab" else "kl")
    text, frames, mask, _ = data(q=13, v=9)
    budget = 5 * pair_bytes(model.cfg, F_)  # at most 5 pairs of work at a time
    seen = pair_blocks
    res = score_all(model, text, frames, mask, memory_budget=budget)
    assert max(seen) <= 5 and sum(seen) == 13 * 9  # every pair exactly once, never a bigger block
    assert res.info["sub_blocks"] == len(seen)
    seen.clear()
    # explicit outer chunks are still cut to the budget inside
    res2 = score_all(model, text, frames, mask, text_chunk=13, video_chunk=9, memory_budget=budget)
    assert max(seen) <= 5 and sum(seen) == 13 * 9
    ref = score_all_reference(model, text, frames, mask).cost
    assert_matches(res.cost, ref, variant)
    assert_matches(res2.cost, ref, variant)


@pytest.mark.parametrize("variant,cost", [("bridge", "kl"), ("dab", "kl"), ("dab", "w2")])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_deeper_drift_in_both_dtypes(variant: str, cost: str, dtype: str) -> None:
    model = make(variant, cost, drift_layers=4)
    text, frames, mask, _ = data()
    ref = score_all_reference(model, text, frames, mask).cost
    res = score_all(model, text, frames, mask, text_chunk=4, video_chunk=5, dtype=dtype)
    if dtype == "float32":
        assert_matches(res.cost, ref, variant)
    else:
        floor = 0.5 if variant == "bridge" else 1e-12
        assert (np.abs(res.cost - ref) / np.maximum(np.abs(ref), floor)).max() < 2e-2


@pytest.mark.parametrize("variant", ["prob", "dab"])
def test_diagnostics_equal_the_reference(variant: str) -> None:
    model = make(variant)
    text, frames, mask, gt = data()
    ref = score_all_reference(model, text, frames, mask, gt=gt)
    res = score_all(model, text, frames, mask, gt=gt, memory_budget=3 * pair_bytes(model.cfg, F_))
    for name in ("text_var", "bridged_var", "video_var"):
        np.testing.assert_allclose(getattr(res, name), getattr(ref, name), rtol=1e-5)
        assert getattr(res, name).shape == (Q,)


@pytest.mark.parametrize("variant", ["xpool", "bridge"])
def test_cosine_variants_have_no_diagnostics(variant: str) -> None:
    text, frames, mask, gt = data()
    res = score_all(make(variant), text, frames, mask, gt=gt)
    assert res.text_var is None and res.bridged_var is None and res.video_var is None


def test_fully_padded_and_padded_garbage_videos() -> None:
    model = make("dab")
    text, frames, mask, _ = data()
    mask[4] = False  # invalid but possible: the reference pools uniformly, finite
    gen = torch.Generator().manual_seed(9)
    padded = torch.cat([frames, torch.randn(V, 3, D, generator=gen) * 100], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(V, 3, dtype=torch.bool)], dim=1)
    ref = score_all_reference(model, text, frames, mask).cost
    assert np.isfinite(ref).all()
    assert_matches(score_all(model, text, frames, mask).cost, ref, "dab")
    padded_ref = score_all_reference(model, text, padded, padded_mask).cost
    assert_matches(score_all(model, text, padded, padded_mask, text_chunk=4, video_chunk=5).cost, padded_ref, "dab")


@pytest.mark.parametrize("variant", ["bridge", "dab"])
def test_bfloat16_is_close_to_the_reference(variant: str) -> None:
    model = make(variant)
    text, frames, mask, _ = data(q=20, v=12)
    ref = score_all_reference(model, text, frames, mask).cost
    res = score_all(model, text, frames, mask, dtype="bfloat16", text_chunk=6, video_chunk=5)
    # bf16 keeps ~3 significant digits: cosine costs within 0.01 (absolute), KL within 2%
    floor = 0.5 if variant == "bridge" else 1e-12
    rel = np.abs(res.cost - ref) / np.maximum(np.abs(ref), floor)
    assert rel.max() < 2e-2
    assert np.mean(res.cost.argmin(1) == ref.argmin(1)) >= 0.9
    assert res.info["dtype"] == "bfloat16"


def test_topk_is_the_ranked_best_of_each_row() -> None:
    model = make("dab")
    text, frames, mask, _ = data()
    res = score_all(model, text, frames, mask, k=4)
    order = np.argsort(res.cost, axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(res.topk_indices, order)
    np.testing.assert_array_equal(res.topk_costs, np.take_along_axis(res.cost, order, axis=1))
    assert res.topk_indices.dtype == np.int64 and res.topk_costs.dtype == np.float32
    wide = score_all(model, text, frames, mask, k=100)  # more than V: every video, ranked
    np.testing.assert_array_equal(wide.topk_indices, np.argsort(wide.cost, axis=1, kind="stable"))
    assert score_all(model, text, frames, mask).topk_indices is None


def test_topk_smallest_breaks_ties_by_index_and_puts_nan_last() -> None:
    cost = np.array([[3.0, 1.0, 1.0, np.nan, 0.5], [2.0, 2.0, 2.0, 2.0, 2.0]], dtype=np.float32)
    idx, vals = topk_smallest(cost, 3)
    np.testing.assert_array_equal(idx, [[4, 1, 2], [0, 1, 2]])
    np.testing.assert_array_equal(vals, [[0.5, 1.0, 1.0], [2.0, 2.0, 2.0]])
    idx, _ = topk_smallest(cost, 5)
    assert idx[0, -1] == 3  # NaN last


def first_stage(text: torch.Tensor, frames: torch.Tensor, mask: torch.Tensor, k: int) -> np.ndarray:
    """The shortlist's cheap stage, written out: cosine of the text and the mean of the real frames."""
    m = mask.float()[..., None]
    mean = (frames * m).sum(1) / m.sum(1).clamp_min(1)
    sim = torch.nn.functional.normalize(text, dim=-1) @ torch.nn.functional.normalize(mean, dim=-1).T
    return torch.topk(sim, k, dim=1).indices.numpy()


@pytest.mark.parametrize("variant", ["xpool", "dab"])
def test_shortlist_scores_exactly_the_first_stage_candidates(variant: str) -> None:
    model = make(variant)
    text, frames, mask, _ = data(q=9, v=8)
    ref = score_all_reference(model, text, frames, mask).cost
    res = score_all(
        model, text, frames, mask, shortlist=3, k=2, memory_budget=4 * pair_bytes(model.cfg, F_, aligned=True)
    )
    assert res.shortlist == 3
    cand = first_stage(text, frames, mask, 3)
    scored = np.isfinite(res.cost)
    expect = np.zeros_like(scored)
    np.put_along_axis(expect, cand, True, axis=1)
    np.testing.assert_array_equal(scored, expect)
    floor = 1e-2 if variant == "xpool" else 1e-12
    rel = np.abs(res.cost[scored] - ref[scored]) / np.maximum(np.abs(ref[scored]), floor)
    assert rel.max() <= 1e-4
    assert np.isfinite(res.topk_costs).all() and set(res.topk_indices[0]) <= set(cand[0])
    full = score_all(model, text, frames, mask, shortlist=100)  # K >= V is exact mode
    assert_matches(full.cost, ref, variant)


def test_progress_and_training_flag_and_weights_untouched() -> None:
    model = make("dab")
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    text, frames, mask, _ = data()
    events: list[Event] = []
    a = score_all(
        model,
        text.numpy().astype(np.float64),
        frames.numpy(),
        mask.numpy(),
        text_chunk=5,
        video_chunk=4,
        progress=events.append,
    )
    assert model.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    b = score_all(model, text, frames, mask, text_chunk=5, video_chunk=4)
    # the same computation on the same float32 values (float64 -> float32 is exact here): bit-equal on any CPU
    np.testing.assert_array_equal(a.cost, b.cost)  # deterministic, no state carried over
    assert events[0].kind == "start" and events[0].total == 3 * 2 and events[-1].kind == "end"
    assert sum(e.n for e in events if e.kind == "advance") == 6
    events.clear()
    score_all(model, text, frames, mask, progress=events.append)
    assert sum(e.n for e in events if e.kind == "advance") == events[0].total


def test_argument_errors() -> None:
    model = make("dab")
    text, frames, mask, _ = data()
    with pytest.raises(ConfigError, match="dtype"):
        score_all(model, text, frames, mask, dtype="float16")
    with pytest.raises(ConfigError, match="k must be a positive integer"):
        score_all(model, text, frames, mask, k=0)
    with pytest.raises(ConfigError, match="shortlist"):
        score_all(model, text, frames, mask, shortlist=0)
    with pytest.raises(ConfigError, match="memory_budget"):
        score_all(model, text, frames, mask, memory_budget=0)
    with pytest.raises(ValueError, match="chunk"):
        score_all(model, text, frames, mask, video_chunk=0)
    with pytest.raises(ValueError, match="frames must be"):
        score_all(model, text, frames[..., :8], mask)


def test_mac_counts_of_the_default_model() -> None:
    cfg = ModelConfig()  # D=512, drift 1024, T'=32
    ref, eng = reference_macs(cfg, 12), engine_macs(cfg, 12)
    step = 2 * 512 * 1024 + 1024 * 1024 + 1024 * 2 * 512  # state block, hidden, output: 3,145,728
    assert step == 3_145_728 and bridge_macs_per_pair_step(cfg) == 4_358_144
    assert ref["paper_per_pair"] == ref["pooling_heads_per_pair"] + 32 * 4_358_144
    assert ref["per_pair"] == ref["pooling_heads_per_pair"] + 2 * 512 * 1024 + 32 * step
    # engine: the first step's state block is per text, the mu_v block of the target is in a basis
    assert eng["bridge_per_pair"] == 32 * step - 2 * 512 * 1024 + 512 * 1024
    assert eng["pooling_heads_per_pair"] < ref["pooling_heads_per_pair"] / 20
    assert eng["per_pair"] < ref["per_pair"]
    assert engine_macs(ModelConfig(variant="xpool"), 12)["bridge_per_pair"] == 0


def test_default_memory_budget_is_bounded() -> None:
    b = default_memory_budget("cpu")
    assert 16 * 2**20 <= b <= 64 * 2**20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("variant", ["xpool", "dab"])
def test_cuda_engine_equals_cpu_reference(variant: str) -> None:
    model = make(variant)
    text, frames, mask, gt = data()
    ref = score_all_reference(model, text, frames, mask, gt=gt)
    res = score_all(model, text, frames, mask, gt=gt, device="cuda")
    assert_matches(res.cost, ref.cost, variant)
    res16 = score_all(model, text, frames, mask, device="cuda", dtype="bfloat16")
    assert np.mean(res16.cost.argmin(1) == ref.cost.argmin(1)) >= 0.9


@pytest.mark.parametrize("budget_pairs", [None, 1, 7])
def test_shortlist_rows_with_uneven_candidates(budget_pairs, pair_blocks: list[int]) -> None:
    model = make("dab", "w2", seed=5)
    text, frames, mask, _ = data(seed=6, q=12, v=10)
    text[:6] = text[0]  # six identical queries: their candidates pile onto the same videos
    k = 4
    seen = pair_blocks
    budget = None if budget_pairs is None else budget_pairs * pair_bytes(model.cfg, F_, aligned=True)
    res = score_all(model, text, frames, mask, shortlist=k, memory_budget=budget, video_chunk=3)
    assert sum(seen) == 12 * k  # every candidate pair exactly once, padding never scored
    ref = score_all_reference(model, text, frames, mask).cost
    cand = first_stage(text, frames, mask, k)
    for qi in range(12):
        row = res.cost[qi]
        assert np.isfinite(row).sum() == k and set(np.flatnonzero(np.isfinite(row))) == set(cand[qi])
        np.testing.assert_allclose(row[cand[qi]], ref[qi, cand[qi]], rtol=1e-4)


def test_tiles_are_equal_bounded_and_respect_the_video_cap() -> None:
    from dab_pipeline.scoring import inner_tiles

    # the default plan of a 256 x 256 split at the 64 MiB bf16 budget: 7 x 7 tiles of 37 x 37,
    # not 41 x 41 with a 10-wide remainder, and the cap on videos per chunk does not thin them
    assert inner_tiles(256, 256, 1718, video_cap=45) == (37, 37)
    rng = np.random.default_rng(0)
    for _ in range(300):
        n_t, n_v, p_max = (int(x) for x in rng.integers(1, 400, 3))
        cap = int(rng.integers(1, 400))
        tq, tv = inner_tiles(n_t, n_v, p_max, video_cap=cap)
        assert 1 <= tq <= n_t and 1 <= tv <= min(n_v, cap)
        assert tq * tv <= p_max
        for n, t in ((n_t, tq), (n_v, tv)):
            k = -(-n // t)  # tiles along this axis: all of size t but the last, which is >= t - k + 1
            assert n - (k - 1) * t >= t - k + 1


def test_even_cuts_cover_the_range_in_pieces_within_one_of_each_other() -> None:
    from dab_pipeline.scoring.planning import even_cuts

    # 256 texts by at most 37: seven pieces of 36 or 37, none of 34 (a P = 34 x 34 sub-block)
    assert sorted({b - a for a, b in even_cuts(256, 37)}) == [36, 37]
    rng = np.random.default_rng(1)
    for _ in range(300):
        n, size = int(rng.integers(1, 2000)), int(rng.integers(1, 300))
        cuts = even_cuts(n, size)
        lengths = [b - a for a, b in cuts]
        assert len(cuts) == -(-n // size)  # no more pieces than full ones would need
        assert [a for a, _ in cuts[1:]] == [b for _, b in cuts[:-1]] and cuts[0][0] == 0 and cuts[-1][1] == n
        assert max(lengths) <= size and max(lengths) - min(lengths) <= 1


# --------------------------------------------------------------------------- controls and study options

BRIDGE_OPTIONS = [{"drift": "constant"}, {"drift_inputs": "residual"}, {"chi_norm": "sum"}, {"drift_init": 0.05}]
CONTROLS = [
    ("prob", {"variance": "fixed"}),
    ("dab", {"variance": "fixed"}),
    ("dab", {"variance": "fixed", "drift": "constant"}),
] + [(v, kw) for v in ("bridge", "dab") for kw in BRIDGE_OPTIONS]


@pytest.mark.parametrize("variant,kw", CONTROLS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_equals_reference_for_the_controls(variant: str, kw: dict, dtype: str) -> None:
    model = make(variant, seed=5, **kw)
    text, frames, mask, _ = data(seed=6)
    ref = score_all_reference(model, text, frames, mask).cost
    res = score_all(model, text, frames, mask, dtype=dtype)
    if dtype == "float32":
        assert_matches(res.cost, ref, variant)
    else:  # the bridge's products in bf16 (docs/performance.md): a looser match
        floor = 1e-2 if variant == "bridge" else 1e-12
        assert (np.abs(res.cost - ref) / np.maximum(np.abs(ref), floor)).max() < 0.05


def test_a_constant_drift_runs_no_step_per_pair() -> None:
    model = make("dab", drift="constant")
    assert bridge_macs_per_pair_step(model.cfg) == 0
    assert engine_macs(model.cfg, F_)["per_pair"] == engine_macs(make("prob").cfg, F_)["per_pair"]
    assert pair_bytes(model.cfg, F_) == pair_bytes(make("prob").cfg, F_)
