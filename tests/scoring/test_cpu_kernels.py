"""The compiled CPU kernels (kernels/cpu_kernels.py, csrc/dab_cpu.cpp) against their eager specs, and the fallback."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.scoring import build_engine, score_all, score_all_reference
from dab_pipeline.scoring.kernels import cpu as cpu_kernels
from dab_pipeline.scoring.kernels.cpu import eager_kernels, get_kernels
from dab_pipeline.scoring.kernels.eager import (
    add_silu_bf16_eager,
    bridge_update_eager,
    kl_rows_eager,
    one_frames_eager,
    one_heads_eager,
    one_token_eager,
    pair_heads_eager,
    silu_bf16_eager,
)

from ..helpers.kernels import fused_kernels, rows_view

BF16_REL = 2**-8  # one bf16 rounding step, relative


@pytest.fixture(scope="module")
def fused() -> cpu_kernels.Kernels:
    return fused_kernels()


def test_silu_matches_aten_to_bf16_rounding(fused: cpu_kernels.Kernels) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(37, 100, generator=gen) * 6).to(torch.bfloat16)
    x[0, :6] = torch.tensor([0.0, -0.0, 30.0, -30.0, 200.0, -200.0]).to(torch.bfloat16)
    ref = F.silu(x.float())
    got = rows_view(x.clone(), 13)
    fused.silu_bf16_(got)
    err = (got.float() - ref).abs() / ref.abs().clamp_min(1e-3)
    assert err.max() <= 2 * BF16_REL
    assert got[0, 5].float().abs() < 1e-30  # silu(-200) ~ -3e-85: no garbage from exp's range limits


@pytest.mark.parametrize("mb", [1, 5, 37])  # one text for all rows, a grid's M texts, one text a row
def test_add_silu_matches_the_eager_spec(fused: cpu_kernels.Kernels, mb: int) -> None:
    gen = torch.Generator().manual_seed(6)
    a = (torch.randn(37, 100, generator=gen) * 4).to(torch.bfloat16)
    b = torch.randn(mb, 100, generator=gen) * 4
    want = torch.empty(37, 100, dtype=torch.bfloat16)
    add_silu_bf16_eager(want, a, b)
    by_hand = F.silu((a.float() + b.repeat(-(-37 // mb), 1)[:37]).to(torch.bfloat16).float())
    torch.testing.assert_close(want.float(), by_hand, rtol=BF16_REL, atol=1e-6)
    got = rows_view(torch.zeros(37, 100, dtype=torch.bfloat16), 11)
    fused.add_silu_bf16_(got, rows_view(a, 3), rows_view(b, 2))
    err = (got.float() - want.float()).abs() / want.float().abs().clamp_min(1e-3)
    assert err.max() <= 2 * BF16_REL


def test_bridge_update_matches_the_eager_spec(fused: cpu_kernels.Kernels) -> None:
    gen = torch.Generator().manual_seed(1)
    p, d = 29, 40
    for width in (2 * d, d):  # the Gaussian bridge ([mu, logvar / 2]) and the point bridge ([x])
        st = torch.randn(p, width, generator=gen) * 3
        delta = (torch.randn(p, width, generator=gen) * 4).to(torch.bfloat16)
        for write_s in (True, False):
            st_ref, st_got = st.clone(), rows_view(st.clone(), 5)
            s_ref = torch.zeros(p, width, dtype=torch.bfloat16)
            s_got = rows_view(s_ref.clone(), 7)
            bridge_update_eager(st_ref, delta, s_ref, 0.37, -2.5, 2.0, d, write_s)
            fused.bridge_update_(st_got, rows_view(delta, 3), s_got, 0.37, -2.5, 2.0, d, write_s)
            torch.testing.assert_close(st_got, st_ref, rtol=1e-6, atol=1e-6)
            if write_s:
                torch.testing.assert_close(s_got.float(), s_ref.float(), rtol=2 * BF16_REL, atol=0)


def heads_case(d: int, h: int, seed: int, runs: tuple[int, ...]) -> tuple:
    """A pair_heads_ input: rows grouped by video with the given run lengths (a video may have none)."""
    gen = torch.Generator().manual_seed(seed)
    n_v, k = len(runs), 7
    vidx = torch.cat([torch.full((n,), v, dtype=torch.long) for v, n in enumerate(runs)])
    p = vidx.shape[0]
    coef = torch.randn(p, k, generator=gen)
    g = torch.rand(p, generator=gen) + 0.2
    basis = torch.randn(n_v, k, 3 * d + h, generator=gen) * 2
    vtok = torch.randn(n_v, d, generator=gen)
    return coef, g, basis, vidx, vtok


def run_heads(fn, case: tuple, lo: float, hi: float, pad: int = 0) -> tuple[torch.Tensor, ...]:
    coef, g, basis, vidx, vtok = case
    p, d, h = coef.shape[0], vtok.shape[1], basis.shape[2] - 3 * vtok.shape[1]
    outs = [
        torch.full((p, d), 7.0),
        torch.full((p, d), 7.0),
        torch.zeros(p, d, dtype=torch.bfloat16),
        torch.zeros(p, h, dtype=torch.bfloat16),
    ]
    if pad:
        outs = [rows_view(o, pad) for o in outs]
    fn(rows_view(coef, pad) if pad else coef, g, basis, vidx, vtok, lo, hi, *outs)
    return tuple(outs)


@pytest.mark.parametrize("d,h", [(32, 48), (24, 40)])  # the vector path, and the portable one (not multiples of 16)
def test_pair_heads_matches_the_eager_spec(fused: cpu_kernels.Kernels, d: int, h: int) -> None:
    # runs of 1 to 6 rows per video cover every row-block size, and a video with no rows
    case = heads_case(d, h, seed=2, runs=(5, 1, 0, 6, 2, 3, 4))
    mu_ref, lv_ref, sig_ref, tgt_ref = run_heads(pair_heads_eager, case, -4.0, 3.0)
    mu, lv, sig, tgt = run_heads(fused.pair_heads_, case, -4.0, 3.0, pad=5)
    torch.testing.assert_close(mu, mu_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lv, lv_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sig.float(), sig_ref.float(), rtol=2 * BF16_REL, atol=0)
    torch.testing.assert_close(tgt.float(), tgt_ref.float(), rtol=2 * BF16_REL, atol=1e-5)
    assert lv.min() >= -4.0 and lv.max() <= 3.0 and (lv == -4.0).any() and (lv == 3.0).any()  # both clamps bite


@pytest.mark.parametrize("d,h", [(32, 32), (64, 32), (32, 40)])  # the vector path; the portable one (H % 16 != 0)
def test_pair_heads_writes_a_blocked_sigma(fused: cpu_kernels.Kernels, d: int, h: int) -> None:
    # 21 rows -> Pp = 32: sigma tile-blocked (2, D/32, 16, 32) for the AMX products, padding rows 0
    case = heads_case(d, h, seed=6, runs=(4, 9, 1, 7))
    p = case[0].shape[0]
    _, _, sig_rows, _ = run_heads(pair_heads_eager, case, -4.0, 3.0)
    for fn in (pair_heads_eager, fused.pair_heads_):
        coef, g, basis, vidx, vtok = case
        sig = torch.full((2, d // 32, 16, 32), 7.0).to(torch.bfloat16)
        outs = [torch.empty(p, d), torch.empty(p, d), sig, torch.empty(p, h, dtype=torch.bfloat16)]
        fn(coef, g, basis, vidx, vtok, -4.0, 3.0, *outs)
        rows = sig.permute(0, 2, 1, 3).reshape(32, d)  # (Pp, D)
        torch.testing.assert_close(rows[:p].float(), sig_rows.float(), rtol=2 * BF16_REL, atol=0)
        assert (rows[p:] == 0).all()


def test_pair_heads_eager_is_the_model_function() -> None:
    # the spec itself, against one video's product done by hand
    d = 8
    case = heads_case(d, 16, seed=5, runs=(3, 2))
    coef, g, basis, vidx, vtok = case
    mu, lv, sig, tgt = run_heads(pair_heads_eager, case, -2.0, 2.0)
    out = torch.einsum("pk,pkn->pn", coef, basis[vidx])  # (P, 3D + H)
    want_lv = ((out[:, 2 * d : 3 * d].clamp(-2, 2) + out[:, :d] / g[:, None] + vtok[vidx]) / 2).clamp(-2, 2)
    torch.testing.assert_close(mu, out[:, d : 2 * d])
    torch.testing.assert_close(lv, want_lv)
    torch.testing.assert_close(sig, torch.exp(want_lv / 2).to(torch.bfloat16))
    torch.testing.assert_close(tgt, out[:, 3 * d :].to(torch.bfloat16))


def test_pair_heads_rejects_a_video_out_of_range(fused: cpu_kernels.Kernels) -> None:
    coef, g, basis, vidx, vtok = heads_case(16, 16, seed=0, runs=(2, 2))
    vidx = vidx.clone()
    vidx[-1] = 2
    with pytest.raises(RuntimeError, match="vidx out of range"):
        run_heads(fused.pair_heads_, (coef, g, basis, vidx, vtok), -1.0, 1.0)


def test_kl_rows_matches_the_eager_spec_and_torch_distributions(fused: cpu_kernels.Kernels) -> None:
    gen = torch.Generator().manual_seed(3)
    p, d = 17, 33
    mu_v, lv_v = torch.randn(p, d, generator=gen), torch.randn(p, d, generator=gen)
    st = torch.cat([torch.randn(p, d, generator=gen), 0.5 * torch.randn(p, d, generator=gen)], dim=1)
    got = fused.kl_rows(rows_view(mu_v, 2), rows_view(lv_v, 6), rows_view(st, 1))
    ref = kl_rows_eager(mu_v, lv_v, st)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    dist = torch.distributions
    q = dist.Normal(mu_v.double(), torch.exp(0.5 * lv_v.double()))
    pt = dist.Normal(st[:, :d].double(), torch.exp(st[:, d:].double()))
    torch.testing.assert_close(got.double(), dist.kl_divergence(q, pt).sum(dim=1), rtol=1e-5, atol=1e-5)


def test_nan_passes_through_every_kernel(fused: cpu_kernels.Kernels) -> None:
    nan = float("nan")
    inf = float("inf")
    x = torch.tensor([[nan, 1.0, inf] + [0.5] * 13]).to(torch.bfloat16)
    fused.silu_bf16_(x)
    assert torch.isnan(x[0, 0]) and not torch.isnan(x[0, 1:]).any() and x[0, 2] == inf  # silu(inf) = inf
    st = torch.tensor([[nan, 1.0, nan, 9.0]])
    s = torch.zeros(1, 4, dtype=torch.bfloat16)
    fused.bridge_update_(st, torch.zeros(1, 4, dtype=torch.bfloat16), s, 0.5, -2.0, 2.0, 2, True)
    assert torch.isnan(st[0, 0]) and torch.isnan(st[0, 2]) and torch.isnan(s[0, 0]) and torch.isnan(s[0, 2])
    assert st[0, 3] == 2.0  # the finite logvar entry is still clamped
    for d in (16, 3):  # the vector path and the portable one
        coef = torch.ones(2, 1)
        basis = torch.zeros(1, 1, 3 * d + 16)
        basis[0, 0, 2 * d] = nan  # row 0's raw logvar, column 0
        g = torch.tensor([1.0, nan])  # row 1: every logvar through tok_g / g
        mu, lv, sig, tgt = run_heads(
            fused.pair_heads_, (coef, g, basis, torch.zeros(2, dtype=torch.long), torch.zeros(1, d)), -1.0, 1.0
        )
        assert torch.isnan(lv[0, 0]) and torch.isnan(sig[0, 0].float()) and (lv[0, 1:] == 0.0).all()
        assert torch.isnan(lv[1]).all() and torch.isnan(sig[1].float()).all() and not torch.isnan(mu).any()
    cost = fused.kl_rows(torch.tensor([[nan, 0.0]]), torch.zeros(1, 2), torch.zeros(1, 4))
    assert torch.isnan(cost).all()


def test_kernels_reject_wrong_dtypes(fused: cpu_kernels.Kernels) -> None:
    with pytest.raises(RuntimeError, match="bfloat16|BFloat16"):
        fused.silu_bf16_(torch.zeros(2, 4))


def test_turned_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAB_CPU_KERNELS", "0")
    k = get_kernels()
    assert not k.fused and "DAB_CPU_KERNELS" in k.reason
    assert k.silu_bf16_ is silu_bf16_eager


def test_no_compiler_falls_back_with_the_reason(tmp_path) -> None:
    # a fresh process, an empty cache and no compiler: the eager kernels, and why
    env = {**os.environ, "DAB_KERNEL_CACHE": str(tmp_path), "CXX": "/nonexistent/c++", "DAB_CPU_KERNELS": "auto"}
    code = "from dab_pipeline.scoring.kernels.cpu import get_kernels; k = get_kernels(); print(k.fused, '|', k.reason)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    fused_flag, reason = out.stdout.strip().split(" | ", 1)
    assert fused_flag == "False" and "no C++ compiler" in reason and "/nonexistent/c++" in reason


def _model(variant: str, steps: int = 3) -> DABModel:
    torch.manual_seed(0)
    model = DABModel(ModelConfig(embed_dim=32, variant=variant, steps=steps, drift_hidden=48, time_embed_dim=8))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return model.eval()


def _data(q: int = 13, v: int = 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    mask = torch.ones(v, 6, dtype=torch.bool)
    mask[1, 2:] = False
    return torch.randn(q, 32, generator=gen), torch.randn(v, 6, 32, generator=gen), mask


@pytest.mark.parametrize("variant", ["dab", "bridge"])
def test_bf16_engine_with_fused_and_eager_kernels_agree(
    variant: str, fused: cpu_kernels.Kernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(variant)
    text, frames, mask = _data()
    eng = build_engine(model, torch.device("cpu"), torch.bfloat16)
    if eng.onednn is None:
        pytest.skip("this torch build has no oneDNN bf16 linears")
    res_fused = score_all(model, text, frames, mask, dtype="bfloat16", memory_budget=1 << 16)
    assert res_fused.info["products"] in ("onednn", "amx") and res_fused.info["kernels"].startswith("fused")
    monkeypatch.setattr(cpu_kernels, "_cached", eager_kernels("test"))
    res_eager = score_all(model, text, frames, mask, dtype="bfloat16", memory_budget=1 << 16)
    assert res_eager.info["kernels"].startswith("eager")
    ref = score_all_reference(model, text, frames, mask).cost
    floor = 0.5 if variant == "bridge" else 1e-12
    for res in (res_fused, res_eager):
        rel = np.abs(res.cost - ref) / np.maximum(np.abs(ref), floor)
        assert rel.max() < 2e-2
    rel = np.abs(res_fused.cost - res_eager.cost) / np.maximum(np.abs(ref), floor)
    assert rel.max() < 2e-2
    assert res_fused.info["sub_blocks"] > 1  # the budget really split the grid


def test_bf16_shortlist_and_diagnostics_use_the_same_path(fused: cpu_kernels.Kernels) -> None:
    model = _model("dab")
    text, frames, mask = _data()
    gt = torch.arange(13) % 9
    exact = score_all(model, text, frames, mask, dtype="bfloat16", gt=gt)
    short = score_all(model, text, frames, mask, dtype="bfloat16", shortlist=4)
    kept = np.isfinite(short.cost)
    assert kept.sum(axis=1).tolist() == [4] * 13
    np.testing.assert_allclose(short.cost[kept], exact.cost[kept], rtol=1e-5)
    assert exact.bridged_var is not None and np.isfinite(exact.bridged_var).all()


def test_kernels_reject_mismatched_shapes(fused: cpu_kernels.Kernels) -> None:
    with pytest.raises(RuntimeError, match=r"st must be \(3, 8\), got \(3, 6\)"):
        fused.kl_rows(torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(3, 6))
    with pytest.raises(RuntimeError, match=r"delta must be \(2, 4\)"):
        fused.bridge_update_(
            torch.zeros(2, 4),
            torch.zeros(2, 5, dtype=torch.bfloat16),
            torch.zeros(2, 4, dtype=torch.bfloat16),
            0.1,
            -1.0,
            1.0,
            2,
            True,
        )


def frames_case(k: int, f: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k videos of f frames: CLIP-like features, two short videos and one without a real frame."""
    gen = torch.Generator().manual_seed(seed)
    frames = torch.randn(k, f, d, generator=gen) * 2 + 0.5
    mask = torch.ones(k, f, dtype=torch.bool)
    mask[2, 3:] = False
    mask[5] = False
    mask[7, 1:] = False
    return frames, mask


@pytest.mark.parametrize("d,heads", [(64, 1), (32, 2), (40, 1)])  # the vector paths; a portable tail (D % 16 != 0)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_frames_matches_its_eager_spec(fused: cpu_kernels.Kernels, d: int, heads: int, dtype: torch.dtype) -> None:
    k, f = 11, 7
    frames, mask = frames_case(k, f, d, seed=3)
    qk = torch.randn(heads, d, generator=torch.Generator().manual_seed(4)) * 0.3
    out = {}
    for name, fn in (("eager", one_frames_eager), ("fused", fused.one_frames_)):
        nbar, n = torch.full((k, heads, d), float("nan")), torch.full((k, f, d), float("nan"), dtype=dtype)
        fn(frames, mask, qk, 1e-5, nbar, n)
        out[name] = (nbar, n.float())
    torch.testing.assert_close(out["fused"][0], out["eager"][0], rtol=1e-5, atol=1e-5)
    # float32 sums in another order: a bf16 frame may round the other way
    torch.testing.assert_close(
        out["fused"][1], out["eager"][1], rtol=BF16_REL if dtype == torch.bfloat16 else 1e-5, atol=1e-5
    )
    moved = frames.clone()
    moved[2, 3:] = 100.0  # padded frames carry no weight
    nbar = torch.empty(k, heads, d)
    fused.one_frames_(moved, mask, qk, 1e-5, nbar, torch.empty(k, f, d, dtype=dtype))
    # the same kernel on the same shapes; a padded frame's weight is 0, so it adds exact zeros: bit-equal on any CPU
    torch.testing.assert_close(nbar[2], out["fused"][0][2], rtol=0, atol=0)


@pytest.mark.parametrize("d", [64, 40])
def test_one_frames_without_the_normalised_frames_gives_the_same_pooling(fused: cpu_kernels.Kernels, d: int) -> None:
    k, f = 11, 7
    frames, mask = frames_case(k, f, d, seed=13)
    qk = torch.randn(2, d, generator=torch.Generator().manual_seed(14)) * 0.3
    for fn in (one_frames_eager, fused.one_frames_):  # n = None: the video terms come from a cache
        nbar, nbar_n = torch.empty(k, 2, d), torch.empty(k, 2, d)
        fn(frames, mask, qk, 1e-5, nbar, None)
        fn(frames, mask, qk, 1e-5, nbar_n, torch.empty(k, f, d, dtype=torch.bfloat16))
        assert torch.equal(nbar, nbar_n)  # the same pooling computation; n is only also stored: bit-equal on any CPU


@pytest.mark.parametrize("d", [64, 40])
def test_one_frames_takes_a_query_a_video(fused: cpu_kernels.Kernels, d: int) -> None:
    """qk (K, Hh, D): video v pooled by its own query qk[v], as one_frames_ gives it with qk[v] for every video."""
    k, f = 11, 7
    frames, mask = frames_case(k, f, d, seed=23)
    qk = torch.randn(k, 2, d, generator=torch.Generator().manual_seed(24)) * 0.3
    for fn in (one_frames_eager, fused.one_frames_):
        nbar, n = torch.empty(k, 2, d), torch.empty(k, f, d, dtype=torch.bfloat16)
        fn(frames, mask, qk, 1e-5, nbar, n)
        for v in (0, 2, 5, 10):
            one, n1 = torch.empty(k, 2, d), torch.empty(k, f, d, dtype=torch.bfloat16)
            fn(frames, mask, qk[v].contiguous(), 1e-5, one, n1)
            torch.testing.assert_close(nbar[v], one[v], rtol=1e-6, atol=1e-6)
            assert torch.equal(n, n1)  # the normalised frames do not read qk: the same computation, bit-equal
    with pytest.raises(RuntimeError, match="qk"):
        fused.one_frames_(frames, mask, qk[:-1].contiguous(), 1e-5, torch.empty(k, 2, d), None)


@pytest.mark.parametrize("d", [64, 40])  # AVX512-BF16's pair products on bf16 rows; the float32 copies (D % 32 != 0)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_matches_its_eager_spec(fused: cpu_kernels.Kernels, d: int, dtype: torch.dtype) -> None:
    k, f = 11, 7
    frames, mask = frames_case(k, f, d, seed=5)
    n = F.layer_norm(frames, (d,)).to(dtype)
    p = (torch.randn(k, f, d, generator=torch.Generator().manual_seed(6)) * 0.3).to(dtype)
    out = {}
    for name, fn in (("eager", one_token_eager), ("fused", fused.one_token_)):
        xo, s = torch.full((k, d), float("nan")), torch.full((k,), float("nan"))
        fn(p, n, mask, xo, s)
        out[name] = (xo, s)
    torch.testing.assert_close(out["fused"][0], out["eager"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["fused"][1], out["eager"][1], rtol=1e-6, atol=1e-6)
    assert out["fused"][1][5] == 0 and torch.allclose(out["fused"][1][mask.any(dim=1)], torch.ones(k - 1))


def test_one_norm_and_pooled_match_their_eager_specs(fused: cpu_kernels.Kernels) -> None:
    k, d = 21, 64
    gen = torch.Generator().manual_seed(8)
    y = (torch.randn(k, d, generator=gen) * 3 + 1).to(torch.bfloat16)
    y[4] = 0  # a constant row: its variance is 0, only eps keeps it finite
    g, b, gp, bp = (torch.randn(d, generator=gen) for _ in range(4))
    xo = torch.randn(k, d, generator=gen)
    outs = {}
    for name, kern in (("eager", eager_kernels("test")), ("fused", fused)):
        a = torch.empty(k, d, dtype=torch.bfloat16)
        kern.one_norm_(y, g, b, 1e-5, a)
        vx, h = torch.empty(k, 2 * d, dtype=torch.bfloat16), torch.empty(k, d, dtype=torch.bfloat16)
        kern.one_pooled_(y, g, b, 1e-5, gp, bp, 1e-5, xo, vx, h)
        outs[name] = (a.float(), vx.float(), h.float())
    for got, want in zip(outs["fused"], outs["eager"]):  # float32 inside, rounded to bf16 once
        torch.testing.assert_close(got, want, rtol=BF16_REL, atol=1e-3)
    assert torch.equal(outs["fused"][1][:, d:], xo.to(torch.bfloat16).float())


@pytest.mark.parametrize("blocked,hidden", [(True, 64), (False, 64), (False, 0)])  # AMX, oneDNN, prob (no target)
def test_one_heads_matches_its_eager_spec(fused: cpu_kernels.Kernels, blocked: bool, hidden: int) -> None:
    k, d, lo, hi = 21, 64, -4.0, 3.0
    gen = torch.Generator().manual_seed(9)
    heads = (torch.randn(k, 2 * d + hidden, generator=gen) * 3).to(torch.bfloat16)
    tokp = (torch.randn(k, d, generator=gen) * 2).to(torch.bfloat16)
    s, tok_e, b1 = torch.ones(k), torch.randn(d, generator=gen), torch.randn(d, generator=gen)
    s[3] = 0.0  # a video without a real frame
    outs = {}
    for name, fn in (("eager", one_heads_eager), ("fused", fused.one_heads_)):
        mu, lv = torch.empty(k, d), torch.empty(k, d)
        sigma = torch.full((2, d // 32, 16, 32) if blocked else (k, d), 7.0).to(torch.bfloat16)
        target = torch.empty(k, hidden, dtype=torch.bfloat16) if hidden else None
        fn(heads, tokp, s, tok_e, b1, lo, hi, mu, lv, sigma if hidden else None, target)
        outs[name] = (mu, lv, sigma, target)
    (mu, lv, sig, tgt), (mu_e, lv_e, sig_e, tgt_e) = outs["fused"], outs["eager"]
    assert torch.equal(mu, mu_e) and (tgt is None or torch.equal(tgt, tgt_e))  # copies of heads' columns: exact
    torch.testing.assert_close(lv, lv_e, rtol=1e-6, atol=1e-6)
    assert lv.min() == lo and lv.max() == hi  # both clamps bite
    if hidden:
        torch.testing.assert_close(sig.float(), sig_e.float(), rtol=2 * BF16_REL, atol=0)
        if blocked:
            assert (sig.permute(0, 2, 1, 3).reshape(32, d)[k:] == 0).all()  # padding rows: 0


@pytest.mark.parametrize("d", [64, 40])
def test_one_heads_takes_a_row_of_video_terms_per_video(fused: cpu_kernels.Kernels, d: int) -> None:
    """b1 (K, D): each video's cached term in place of s tok_e + b1; the same as b1 (D,) where the rows are equal."""
    k, lo, hi = 21, -4.0, 3.0
    gen = torch.Generator().manual_seed(19)
    heads = (torch.randn(k, 2 * d, generator=gen) * 3).to(torch.bfloat16)
    tokp = (torch.randn(k, d, generator=gen) * 2).to(torch.bfloat16)
    s, tok_e, b1 = torch.ones(k), torch.randn(d, generator=gen), torch.randn(d, generator=gen)
    rows = torch.randn(k, d, generator=gen)
    outs = {}
    for name, fn in (("eager", one_heads_eager), ("fused", fused.one_heads_)):
        per_row, shared, as_rows = (torch.empty(k, d) for _ in range(3))
        fn(heads, tokp, torch.zeros(k), tok_e, rows, lo, hi, torch.empty(k, d), per_row, None, None)
        fn(heads, tokp, s, tok_e, b1, lo, hi, torch.empty(k, d), shared, None, None)
        fn(
            heads,
            tokp,
            torch.zeros(k),
            tok_e,
            (tok_e + b1).expand(k, d).contiguous(),
            lo,
            hi,
            torch.empty(k, d),
            as_rows,
            None,
            None,
        )
        torch.testing.assert_close(as_rows, shared, rtol=1e-6, atol=1e-6)
        outs[name] = per_row
    want = (heads[:, d:].float().clamp(lo, hi) + tokp.float() + rows).mul(0.5).clamp(lo, hi)
    torch.testing.assert_close(outs["eager"], want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(outs["fused"], want, rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="b1"):
        fused.one_heads_(heads, tokp, s, tok_e, rows[:-1], lo, hi, torch.empty(k, d), torch.empty(k, d), None, None)
