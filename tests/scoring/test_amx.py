"""The bridge's products on AMX tiles (kernels/csrc/dab_amx.cpp) against plain products and the oneDNN path.

Skipped where the CPU has no AMX-BF16 or the kernels could not be built (the CI log says which).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.scoring import build_engine, score_all, score_all_reference
from dab_pipeline.scoring.kernels.cpu import amx_ops, get_kernels
from dab_pipeline.scoring.kernels.eager import bridge_update_eager

BF16_REL = 2**-8  # one rounding to bf16: at most half an ulp, 2^-8 of the value
SILU_APPROX = 2e-4  # the epilogue's SiLU: 2^t to 7.6e-5 and a 14-bit reciprocal
F32_SUMS = 1e-5  # float32 sums of bf16 products in another order: relative to the largest, well under this


@pytest.fixture(scope="module")
def ops():
    k = get_kernels()
    if not k.fused:
        pytest.skip(f"compiled kernels unavailable here: {k.reason}")
    found = amx_ops()
    if found is None:
        pytest.skip("no AMX-BF16 on this CPU (or DAB_AMX=0): the oneDNN path runs")
    return found


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def unblock(x: torch.Tensor, rows: int) -> torch.Tensor:
    """(Pp/16, K/32, 16, 32) -> (rows, K), the first ``rows`` rows."""
    tm, tk = x.shape[:2]
    return x.permute(0, 2, 1, 3).reshape(tm * 16, tk * 32)[:rows]


def case(p: int, k: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(p, k, generator=gen)).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    return x, w, torch.randn(n, generator=gen)


def test_block_rows_pads_and_tiles(ops) -> None:
    x = torch.arange(45 * 64, dtype=torch.float32).view(45, 64).to(torch.bfloat16)
    xb = ops.amx_block_rows(x)
    assert tuple(xb.shape) == (3, 2, 16, 32)  # 45 rows -> 48, in 16 x 32 tiles
    assert torch.equal(xb[1, 1], x[16:32, 32:64])
    assert torch.equal(unblock(xb, 45), x) and (unblock(xb, 48)[45:] == 0).all()


@pytest.mark.parametrize("p,k,n", [(45, 96, 64), (32, 512, 288), (1, 32, 32)])  # padding, several k-chunks, one row
@pytest.mark.parametrize("with_target", [False, True])
def test_linear_silu_matches_a_plain_product(ops, p: int, k: int, n: int, with_target: bool) -> None:
    x, w, bias = case(p, k, n)
    target = (torch.randn(p, n) * 2).to(torch.bfloat16) if with_target else None
    got = unblock(ops.amx_linear_silu(ops.amx_block_rows(x), ops.amx_pack_weight(w), bias, target), p).float()
    pre = x.float() @ w.float().T + bias  # float32 until SiLU's result is rounded to bf16 (oneDNN rounds it twice)
    if target is not None:
        pre = pre + target.float()
    want = F.silu(pre)
    err = (got - want).abs() / want.abs().clamp_min(1e-2)
    assert err.max() <= BF16_REL + SILU_APPROX  # one rounding to bf16, and SiLU's approximation


@pytest.mark.parametrize("mb", [1, 5, 45])
def test_add_silu_blocked_matches_the_row_major_kernel(ops, mb: int) -> None:
    gen = torch.Generator().manual_seed(7)
    a = (torch.randn(45, 64, generator=gen) * 4).to(torch.bfloat16)
    b = torch.randn(mb, 64, generator=gen) * 4
    want = torch.empty(45, 64, dtype=torch.bfloat16)
    get_kernels().add_silu_bf16_(want, a, b)
    got = ops.amx_add_silu_blocked(a, b)
    assert tuple(got.shape) == (3, 2, 16, 32)
    # the same intrinsics in the same order (dab_amx.cpp promises it): bit for bit on any CPU with AMX
    torch.testing.assert_close(unblock(got, 45), want, rtol=0, atol=0)
    assert (unblock(got, 48)[45:] == 0).all()


def rows_of(buf_rows: int, p: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A (p, n) bf16 target as the first rows of a (buf_rows, n) buffer whose other rows hold a sentinel."""
    buf = torch.full((buf_rows, n), 7.0).to(torch.bfloat16)
    buf[:p] = (torch.randn(p, n, generator=torch.Generator().manual_seed(seed)) * 3).to(torch.bfloat16)
    return buf, buf[:p]


@pytest.mark.parametrize("mb", [1, 9, 45])  # one text, a grid's texts, a row per pair
def test_linear_add_first_adds_in_place_and_gives_the_first_step(ops, mb: int) -> None:
    x, w, _ = case(45, 64, 96, seed=13)
    buf, target = rows_of(48, 45, 96, seed=14)
    first = torch.randn(mb, 96, generator=torch.Generator().manual_seed(15))
    v = target.float() + x.float() @ w.float().T  # (45, 96): the new target before its rounding
    h = ops.amx_linear_add_first_(ops.amx_block_rows(x), ops.amx_pack_weight(w), target, first)
    assert tuple(h.shape) == (3, 3, 16, 32)
    err = (target.float() - bf16(v)).abs() / v.abs().clamp_min(1e-2)
    assert err.max() <= 2 * BF16_REL  # one rounding of the sum, in place
    want = F.silu(v + first[torch.arange(45) % mb])
    err = (unblock(h, 45).float() - want).abs() / want.abs().clamp_min(1e-2)
    assert err.max() <= BF16_REL + SILU_APPROX
    assert (unblock(h, 48)[45:] == 0).all() and (buf[45:] == 7.0).all()  # padding: zeros, and no target rows


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("p", [600, 100])
def test_many_blocks_any_split(ops, threads: int, p: int) -> None:
    # 600 rows = 38 tiles of 16: on one thread 19 blocks of 32 (3 groups of 8), on two 19 tiles each (9
    # blocks and a 16-row half block), on three 13 / 13 / 12; accumulators of several blocks, the epilogue
    # handed from block to block and across groups, and K = 320: a chunk of 8 tiles, then one of 2.
    # 100 rows (under 256 a thread): on two or three threads each takes every row and a range of the three
    # 32-column panels (1 / 2, or one each) instead
    k, n, d = 320, 96, 32
    pp = -(-p // 16) * 16
    x, w, bias = case(p, k, n, seed=8)
    xb, wp = ops.amx_block_rows(x), ops.amx_pack_weight(w)
    prod = x.float() @ w.float().T
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        h = unblock(ops.amx_linear_silu(xb, wp, bias), p).float()
        buf, target = rows_of(pp, p, n, seed=9)
        ht = unblock(ops.amx_linear_silu(xb, wp, bias, target), p).float()
        st0 = torch.randn(pp, n, generator=torch.Generator().manual_seed(10))
        st, s = st0.clone(), torch.zeros(pp // 16, n // 32, 16, 32, dtype=torch.bfloat16)
        ops.amx_linear_update_(xb, wp, bias, st, s, 0.2, -1.0, 1.0, d, True)
        # per-text rows (row % M) across thread ranges, half blocks and blocks that straddle M
        per_text = {}
        for mb in (7, 45):
            rows = torch.randn(mb, n, generator=torch.Generator().manual_seed(mb))
            added_first = target.clone()
            h0 = ops.amx_linear_add_first_(xb, wp, added_first, rows)
            st_i = torch.full((pp, n), float("nan"))
            ops.amx_linear_update_(xb, wp, bias, st_i, torch.zeros_like(s), 0.2, -1.0, 1.0, d, True, rows)
            per_text[mb] = (rows, added_first, h0, st_i)
    finally:
        torch.set_num_threads(before)

    def close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
        assert ((got - want).abs() / want.abs().clamp_min(1e-2)).max() <= tol

    close(h, F.silu(prod + bias), BF16_REL + SILU_APPROX)
    close(ht, F.silu(prod + bias + target.float()), BF16_REL + SILU_APPROX)
    st_ref, s_ref = st0[:p].clone(), torch.zeros(p, n, dtype=torch.bfloat16)
    bridge_update_eager(st_ref, prod + bias, s_ref, 0.2, -1.0, 1.0, d, True)  # the drift in float32
    torch.testing.assert_close(st[:p], st_ref, rtol=0, atol=0.2 * (prod + bias).abs().max().item() * F32_SUMS)
    torch.testing.assert_close(unblock(s, p).float(), s_ref.float(), rtol=4 * BF16_REL, atol=1e-2)
    for mb, (rows, added_first, h0, st_i) in per_text.items():
        r_of = torch.arange(pp) % mb
        close(added_first.float(), bf16(target.float() + prod), 2 * BF16_REL)  # one rounding of the sum
        close(unblock(h0, p).float(), F.silu(target.float() + prod + rows[r_of[:p]]), BF16_REL + SILU_APPROX)
        assert (unblock(h0, pp)[p:] == 0).all()
        st_ref = rows[r_of].clone()
        bridge_update_eager(
            st_ref,
            F.pad(prod + bias, (0, 0, 0, pp - p)),
            torch.zeros(pp, n, dtype=torch.bfloat16),
            0.2,
            -1.0,
            1.0,
            d,
            False,
        )
        torch.testing.assert_close(st_i[:p], st_ref[:p], rtol=0, atol=0.2 * (prod + bias).abs().max().item() * F32_SUMS)


@pytest.mark.parametrize("write_s", [True, False])
def test_linear_update_matches_the_update_spec(ops, write_s: bool) -> None:
    p, d, hidden = 45, 64, 96
    x, w, bias = case(p, hidden, 2 * d, seed=1)
    pp = 48
    gen = torch.Generator().manual_seed(2)
    st0 = torch.randn(pp, 2 * d, generator=gen)
    st0[p:] = 0.0
    st, s = st0.clone(), torch.zeros(pp // 16, 2 * d // 32, 16, 32, dtype=torch.bfloat16)
    ops.amx_linear_update_(ops.amx_block_rows(x), ops.amx_pack_weight(w), bias, st, s, 0.3, -1.5, 1.0, d, write_s)
    delta = x.float() @ w.float().T + bias  # the drift stays float32 (oneDNN's path rounds it to bf16)
    st_ref, s_ref = st0[:p].clone(), torch.zeros(p, 2 * d, dtype=torch.bfloat16)
    bridge_update_eager(st_ref, delta, s_ref, 0.3, -1.5, 1.0, d, write_s)
    torch.testing.assert_close(st[:p], st_ref, rtol=0, atol=0.3 * delta.abs().max().item() * F32_SUMS)
    assert (st[:p, d:] >= -1.5).all() and (st[:p, d:] <= 1.0).all()
    if write_s:
        torch.testing.assert_close(unblock(s, p).float(), s_ref.float(), rtol=4 * BF16_REL, atol=1e-2)


@pytest.mark.parametrize("init_rows", [1, 7, 45])  # one text, a grid's texts, one a row
def test_update_from_per_text_rows_equals_a_filled_state(ops, init_rows: int) -> None:
    x, w, bias = case(45, 64, 64, seed=11)
    xb, wp = ops.amx_block_rows(x), ops.amx_pack_weight(w)
    init = torch.randn(init_rows, 64, generator=torch.Generator().manual_seed(12))
    filled = init[torch.arange(48) % init_rows].clone()  # (Pp, N): row r holds init[r % Mb]
    s_a, s_b = (torch.zeros(3, 2, 16, 32, dtype=torch.bfloat16) for _ in range(2))
    ops.amx_linear_update_(xb, wp, bias, filled, s_a, 0.4, -1.0, 1.0, 32, True)
    st = torch.full((48, 64), float("nan"))  # never read: every row is written from init
    ops.amx_linear_update_(xb, wp, bias, st, s_b, 0.4, -1.0, 1.0, 32, True, init)
    # the same kernel, products and epilogue; only where a row's old state is read from differs: bit-equal on any CPU
    assert torch.equal(st, filled) and torch.equal(s_a, s_b)


def test_nan_reaches_the_outputs(ops) -> None:
    x, w, bias = case(40, 64, 64, seed=3)
    x[3, 5] = float("nan")
    h = unblock(ops.amx_linear_silu(ops.amx_block_rows(x), ops.amx_pack_weight(w), bias, None), 40).float()
    assert torch.isnan(h[3]).all() and not torch.isnan(h[torch.arange(40) != 3]).any()
    st, s = torch.zeros(48, 64), torch.zeros(3, 2, 16, 32, dtype=torch.bfloat16)
    ops.amx_linear_update_(ops.amx_block_rows(x), ops.amx_pack_weight(w), bias, st, s, 0.5, -1.0, 1.0, 32, True)
    assert torch.isnan(st[3]).all() and torch.isnan(unblock(s, 40)[3].float()).all()
    assert not torch.isnan(st[:40][torch.arange(40) != 3]).any()


def test_ops_reject_bad_shapes(ops) -> None:
    x, w, bias = case(32, 64, 64)
    with pytest.raises(RuntimeError, match="multiples of 32"):
        ops.amx_pack_weight(torch.zeros(48, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="st must be"):
        ops.amx_linear_update_(
            ops.amx_block_rows(x),
            ops.amx_pack_weight(w),
            bias,
            torch.zeros(31, 64),
            torch.zeros(2, 2, 16, 32, dtype=torch.bfloat16),
            0.1,
            -1.0,
            1.0,
            32,
            True,
        )
    with pytest.raises(RuntimeError, match="first must be"):
        ops.amx_linear_add_first_(
            ops.amx_block_rows(x), ops.amx_pack_weight(w), torch.zeros(32, 64, dtype=torch.bfloat16), torch.zeros(4, 32)
        )


@pytest.mark.parametrize(
    "variant,steps,cost", [("dab", 3, "kl"), ("bridge", 2, "kl"), ("dab", 1, "kl"), ("dab", 2, "w2")]
)
def test_engine_on_amx_agrees_with_the_onednn_path(
    ops, variant: str, steps: int, cost: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # w2: the bridge's float32 state comes back to the generic cost (not the KL kernel's fast path)
    torch.manual_seed(0)
    model = DABModel(
        ModelConfig(variant=variant, embed_dim=32, num_heads=2, drift_hidden=64, steps=steps, cost=cost)
    ).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(torch.randn(prm.shape, generator=gen) * 0.05)
    text, frames = torch.randn(13, 32, generator=gen), torch.randn(9, 6, 32, generator=gen)
    mask = torch.ones(9, 6, dtype=torch.bool)
    mask[1, 2:] = False
    eng = build_engine(model, torch.device("cpu"), torch.bfloat16)
    if eng.onednn is None:
        pytest.skip("this torch build has no oneDNN bf16 linears")
    assert eng.bridge_runner is not None and eng.bridge_runner.amx is not None
    on_amx = score_all(model, text, frames, mask, dtype="bfloat16", memory_budget=1 << 16)
    assert on_amx.info["products"] == "amx" and on_amx.info["sub_blocks"] > 1
    short = score_all(model, text, frames, mask, dtype="bfloat16", shortlist=4)  # rows of a shortlist (keep)
    monkeypatch.setenv("DAB_AMX", "0")
    on_onednn = score_all(model, text, frames, mask, dtype="bfloat16", memory_budget=1 << 16)
    assert on_onednn.info["products"] == "onednn"
    ref = score_all_reference(model, text, frames, mask).cost
    floor = 0.5 if variant == "bridge" else 1e-12
    for res in (on_amx, on_onednn):
        assert (np.abs(res.cost - ref) / np.maximum(np.abs(ref), floor)).max() < 2e-2
    assert (np.abs(on_amx.cost - on_onednn.cost) / np.maximum(np.abs(ref), floor)).max() < 2e-2
    kept = np.isfinite(short.cost)
    np.testing.assert_allclose(short.cost[kept], on_amx.cost[kept], rtol=1e-5)
