"""All-pairs scoring of a low-rank or mixture model (issue 36): ``prob`` and ``dab-const`` through the fast engine (the
diagonal model's video Gaussian, U's heads folded into its basis, then the covariance's cost), ``dab`` (a bridge a
pair and component) through the model's own path in bounded blocks; each equal to a naive per-pair loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.model import network
from dab_pipeline.model.costs import kl_diag_gaussian
from dab_pipeline.scoring import Scorer, build_engine, pair_bytes, score_all, score_all_reference
from dab_pipeline.scoring.covariance import covariance_chunks, needs_reference

from ..helpers.models import random_inputs, small_model


@pytest.fixture(scope="module", params=["lowrank:2", "mixture:2"])
def lowrank(request):
    """A ``dab`` model of each non-diagonal form: scored through the reference."""
    return small_model("dab", covariance=request.param, drift_init=0.05).eval()


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
    k, rank = (1, 2) if lowrank.cfg.covariance == "lowrank:2" else (2, 0)
    per_pair = 4 * 16 * (3 * rank + 12 + 6 * k * (k > 1)) + 4 * (k * (5 * 24 + 8 * 16) + 3 * 16 * rank)
    budget = per_pair * 6  # six pairs a block: many blocks
    assert needs_reference(lowrank)
    assert covariance_chunks(lowrank, 11, 7, torch.device("cpu"), budget) == (2, 3)
    res = Scorer(lowrank, memory_budget=budget).score(text, frames, mask, gt=gt, k=3)
    np.testing.assert_allclose(res.cost, _naive(lowrank, text, frames, mask), rtol=1e-5, atol=1e-5)
    assert res.info["engine"] == f"reference ({lowrank.cfg.covariance})"
    np.testing.assert_array_equal(res.topk_indices[:, 0], res.cost.argmin(1))
    assert res.video_var is not None and res.video_var.shape == (11,)
    np.testing.assert_allclose(score_all(lowrank, text, frames, mask).cost, res.cost, rtol=1e-6, atol=1e-6)


def test_a_dab_block_counts_its_bridges_in_the_memory_budget() -> None:
    """dab's blocks hold each bridge's state and the drift's hidden layers (K bridges a pair for a mixture): ~5 H + 8 D
    floats a bridge (H = 24, D = 16 here) on top of prob's estimate, so the same budget holds fewer dab pairs."""
    cpu, budget = torch.device("cpu"), 1 << 20
    for cov, k, rank in (("mixture:2", 2, 0), ("lowrank:2", 1, 2)):
        pq, pv = covariance_chunks(small_model("prob", covariance=cov), 1000, 1000, cpu, budget)
        dq, dv = covariance_chunks(small_model("dab", covariance=cov), 1000, 1000, cpu, budget)
        prob_pair = 4 * 16 * (3 * rank + 12 + 6 * k * (cov.startswith("mixture")))
        dab_pair = prob_pair + 4 * (k * (5 * 24 + 8 * 16) + 3 * 16 * rank)
        assert pq * pv <= budget // prob_pair and dq * dv <= budget // dab_pair < pq * pv


def test_a_lowrank_shortlist_scores_its_candidates_and_inf_elsewhere(lowrank) -> None:
    text, frames, mask, _ = random_inputs()
    full = score_all(lowrank, text, frames, mask).cost
    res = Scorer(lowrank).score(text, frames, mask, shortlist=3)
    kept = np.isfinite(res.cost)
    assert res.shortlist == 3 and (kept.sum(1) == 3).all()
    np.testing.assert_allclose(res.cost[kept], full[kept], rtol=1e-5, atol=1e-5)


def test_the_fast_engines_refuse_a_dab_lowrank_or_mixture_model(lowrank) -> None:
    with pytest.raises(ConfigError, match="only for the variants without a per-pair bridge"):
        build_engine(lowrank, torch.device("cpu"), torch.float32)


COVARIANCE_ENGINE_MODELS = [
    (variant, cov, kw)
    for variant, kw in (("prob", {}), ("dab", {"drift": "constant"}))
    for cov in ("diag", "lowrank:1", "lowrank:3", "mixture:2", "mixture:3")
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("variant", "cov", "kw"), COVARIANCE_ENGINE_MODELS)
def test_the_engine_scores_prob_and_dab_const_covariance_models_as_a_per_pair_loop(variant, cov, kw, dtype) -> None:
    """``prob`` and ``dab-const`` with U or K components through the fast engine, in blocks of a few pairs: the costs of
    a naive per-pair loop, the variance diagnostics of the reference, and a shortlist's (packed slots) costs."""
    model = small_model(variant, covariance=cov, **kw).eval()
    text, frames, mask, gt = random_inputs()
    assert not needs_reference(model)
    budget = 40 * pair_bytes(model.cfg, frames.shape[1], dtype)  # a few dozen pairs a block
    res = Scorer(model, dtype=dtype, memory_budget=budget).score(text, frames, mask, gt=gt, k=3)
    assert not res.info["engine"].startswith("reference")
    naive = _naive(model, text, frames, mask)
    np.testing.assert_allclose(res.cost, naive, rtol=1e-5, atol=1e-4)
    ref = score_all_reference(model, text, frames, mask, gt=gt)
    for field in ("text_var", "bridged_var", "video_var"):
        np.testing.assert_allclose(getattr(res, field), getattr(ref, field), rtol=1e-5, atol=1e-7, err_msg=field)
    short = Scorer(model, dtype=dtype, memory_budget=budget).score(text, frames, mask, shortlist=3)
    kept = np.isfinite(short.cost)
    assert (kept.sum(1) == 3).all()
    np.testing.assert_allclose(short.cost[kept], naive[kept], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("cov", ["lowrank:2", "mixture:3"])
def test_one_query_of_a_covariance_model_scores_as_the_grid(cov) -> None:
    """``Scorer.score_query``: a mixture through the engine's one-text path (its components' cost on the pooled
    videos), a low-rank model through the model's own (no one-text path for U's heads); both as the grid scores."""
    model = small_model("prob", covariance=cov).eval()
    text, frames, mask, _ = random_inputs()
    grid = _naive(model, text, frames, mask)
    eng = build_engine(model, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        one = eng.one_query(eng.texts(text[2:3]), frames, mask)
    assert (one is None) == cov.startswith("lowrank")
    if one is not None:
        np.testing.assert_allclose(one.numpy(), grid[2], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(Scorer(model).score_query(text[2], frames, mask), grid[2], rtol=1e-5, atol=1e-4)


def test_a_pair_of_a_covariance_model_is_budgeted_for_its_extra_columns() -> None:
    """U's R D columns (and the KL's passes over them) and K components' KLs make a pair bigger: fewer a block."""
    diag = pair_bytes(small_model("prob").cfg, 5)
    assert pair_bytes(small_model("prob", covariance="lowrank:2").cfg, 5) == diag + 4 * 6 * 2 * 16
    assert pair_bytes(small_model("prob", covariance="mixture:3").cfg, 5) == diag + 4 * 4 * 3 * 16


# ---------------------------------------------------------------------------------------------
# the faster low-rank path (U rank-major, einsum contractions) against the plain one it replaced


def _plain_kl_lowrank(mu_q, lv_q, u_q, mu_p, lv_p, u_p):
    """``KL(Q || P)`` of low-rank-plus-diagonal Gaussians as issue 36 first wrote it: U (..., D, R) contiguous, every
    product a broadcasting matmul (P's whitened factor copied out to each pair), the same closed form."""
    eye = lambda u: torch.eye(u.shape[-1], dtype=u.dtype)  # noqa: E731
    logdet = lambda c: 2.0 * torch.log(torch.diagonal(c, dim1=-2, dim2=-1)).sum(-1)  # noqa: E731
    inv_p = torch.exp(-lv_p)
    su = u_p * inv_p[..., None]
    chol_p = torch.linalg.cholesky(eye(u_p) + u_p.mT @ su)
    white = torch.linalg.solve_triangular(chol_p, su.mT, upper=False)  # (..., R, D)
    chol_q = torch.linalg.cholesky(eye(u_q) + u_q.mT @ (u_q * torch.exp(-lv_q)[..., None]))
    diff = mu_p - mu_q
    trace_u = (u_q.square().sum(dim=-1) * inv_p).sum(dim=-1)
    trace_s = (torch.exp(lv_q) * white.square().sum(dim=-2)).sum(dim=-1)
    cross = (white @ u_q).square().sum(dim=(-2, -1))
    maha = (white @ diff[..., None]).square().sum(dim=(-2, -1))
    corr = trace_u - trace_s - cross - maha + logdet(chol_p) - logdet(chol_q)
    return kl_diag_gaussian(mu_q, lv_q, mu_p, lv_p) + 0.5 * corr


@pytest.mark.parametrize("variant", ["prob", "dab"])
@pytest.mark.parametrize("rank", [1, 3])
def test_the_faster_lowrank_path_scores_as_the_plain_one(variant: str, rank: int, monkeypatch) -> None:
    model = small_model(variant, covariance=f"lowrank:{rank}", drift_init=0.05).eval()
    text, frames, mask, _ = random_inputs()
    fast = Scorer(model, memory_budget=4 * 16 * (3 * rank + 12) * 6).score(text, frames, mask).cost  # many blocks
    assert model.prob is not None and model.prob.factor_head is not None
    head = model.prob.factor_head
    with torch.no_grad():
        h = model.prob.hidden(text)
        u = model.prob.factor(h)  # (Q, D, R) a view of (Q, R, D)
        assert u.stride()[-2:] == (1, 16)
        # the same numbers as the head's own (d, r) layout
        torch.testing.assert_close(u, head(h).unflatten(-1, (16, rank)), rtol=1e-6, atol=1e-7)
        monkeypatch.setattr(model.prob, "factor", lambda h: head(h).unflatten(-1, (h.shape[-1], rank)))
        calls = []
        monkeypatch.setattr(network, "kl_lowrank_gaussian", lambda *a: calls.append(1) or _plain_kl_lowrank(*a))
        plain = model.pair_costs(model.encode_text(text), model.encode_video(frames, mask)).numpy()  # (Q, V)
    assert calls  # the model's path ran the plain cost
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)


def test_the_rank_major_factor_follows_the_weights_and_trains() -> None:
    model = small_model("prob", covariance="lowrank:2")
    prob = model.prob
    assert prob is not None and prob.factor_head is not None
    h = torch.randn(5, 16)
    with torch.no_grad():
        first = prob.factor(h)
        prob.factor_head.weight.add_(0.5)  # in place, as an optimiser step: the kept copy is made again
        moved = prob.factor(h)
        torch.testing.assert_close(moved, prob.factor_head(h).unflatten(-1, (16, 2)), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(first, moved)
    prob.factor(h).square().sum().backward()  # with gradients: made inside the graph
    assert prob.factor_head.weight.grad is not None and float(prob.factor_head.weight.grad.abs().sum()) > 0.0
