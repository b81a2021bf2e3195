"""Conformal retrieval sets and the Learn-then-Test threshold: each function against a loop, and the guarantees
over 200 random calibration / evaluation splits of one gallery's queries (issue 47)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.metrics.conformal import (
    CONFORMAL_SCORES,
    conformal_quantile,
    conformal_scores,
    conformal_sets,
    cost_softmax,
    needed_calibration,
)
from dab_pipeline.metrics.risk import binomial_cdf, learn_then_test, min_answered


def _world(q: int = 600, v: int = 40, seed: int = 0):
    """Costs (Q, V) of queries whose match is video gt[i], harder for some queries than others, and each query's
    difficulty (the noise it was drawn with): what a trained run's test costs look like, exchangeable."""
    rng = np.random.default_rng(seed)
    gt = rng.integers(0, v, q)
    signal = rng.uniform(0.0, 6.0, q)  # (Q,) how far the match stands out: some captions fit many videos
    cost = rng.normal(0, 1, (q, v))  # (Q, V)
    cost[np.arange(q), gt] -= signal
    return cost, gt, 1.0 / (0.5 + signal)


def test_the_quantile_is_the_ceil_n_plus_1_rank_and_too_few_queries_are_refused() -> None:
    rng = np.random.default_rng(1)
    for n in (9, 19, 50, 101):
        s = rng.normal(size=n)
        for alpha in (0.05, 0.1, 0.2):
            k = math.ceil((n + 1) * (1 - alpha))
            if k > n:
                with pytest.raises(ConfigError, match=f"at least {needed_calibration(alpha)} are needed"):
                    conformal_quantile(s, alpha)
            else:
                assert conformal_quantile(s, alpha) == sorted(s)[k - 1]
    assert needed_calibration(0.1) == 9 and needed_calibration(0.05) == 19 and needed_calibration(0.2) == 4
    for bad in (0, 1, -0.1, 1.5, float("nan"), "abc"):
        with pytest.raises(ConfigError, match="alpha must be"):
            conformal_quantile(np.ones(10), bad)


def test_scores_against_a_loop() -> None:
    cost, _, difficulty = _world(q=7, v=9, seed=2)
    cost[0, 3] = cost[0, 5]  # a tie: ranked by video index
    p = cost_softmax(cost, 0.7)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    u = np.random.default_rng(3).uniform(size=7)
    got = {s: conformal_scores(p, s, difficulty=difficulty, lam=0.1, k_reg=2) for s in CONFORMAL_SCORES}
    rand = conformal_scores(p, "raps", lam=0.1, k_reg=2, u=u)
    for i in range(7):
        order = sorted(range(9), key=lambda j: (-p[i, j], j))
        for r, j in enumerate(order, start=1):
            above = sum(p[i, order[t]] for t in range(r))  # the mass ranked at or above j, j included
            assert got["lac"][i, j] == pytest.approx(1 - p[i, j])
            assert got["normalized"][i, j] == pytest.approx((1 - p[i, j]) / difficulty[i])
            assert got["aps"][i, j] == pytest.approx(above)
            assert got["raps"][i, j] == pytest.approx(above + 0.1 * max(0, r - 2))
            assert rand[i, j] == pytest.approx(above - (1 - u[i]) * p[i, j] + 0.1 * max(0, r - 2))
    with pytest.raises(ConfigError, match="unknown conformal score 'top'; valid: lac, aps, raps, normalized"):
        conformal_scores(p, "top")
    with pytest.raises(ConfigError, match="needs each query's difficulty"):
        conformal_scores(p, "normalized")


def test_sets_hold_the_videos_at_or_under_the_quantile() -> None:
    cost, _, _ = _world(q=5, v=12, seed=4)
    s = conformal_scores(cost_softmax(cost), "aps")
    for qhat in (0.5, np.linspace(0.2, 0.9, 5)):
        sets = conformal_sets(s, qhat)
        q = np.broadcast_to(qhat, (5,))
        for i in range(5):
            assert sets[i].tolist() == [j for j in range(12) if s[i, j] <= q[i]]


@pytest.mark.parametrize("score", CONFORMAL_SCORES)
def test_coverage_over_200_random_splits(score: str) -> None:
    """Half the queries calibrate, half are evaluated, 200 times: mean coverage in [1 - a, 1 - a + 1/(n + 1)]
    within two standard errors, per alpha (the randomised APS/RAPS are exact in expectation)."""
    cost, gt, difficulty = _world()
    p = cost_softmax(cost, 1.0)
    rng = np.random.default_rng(5)
    u = rng.uniform(size=len(gt)) if score in ("aps", "raps") else None
    s = conformal_scores(p, score, difficulty=difficulty, u=u)  # (Q, V)
    true = s[np.arange(len(gt)), gt]  # (Q,)
    n = len(gt) // 2
    for alpha in (0.05, 0.1, 0.2):
        cover, size = [], []
        for _ in range(200):
            perm = rng.permutation(len(gt))
            cal, ev = perm[:n], perm[n:]
            qhat = conformal_quantile(true[cal], alpha)
            cover.append(np.mean(true[ev] <= qhat))
            size.append(np.mean((s[ev] <= qhat).sum(axis=1)))
        mean, se = float(np.mean(cover)), float(np.std(cover) / math.sqrt(len(cover)))
        assert 1 - alpha - 2 * se <= mean <= 1 - alpha + 1 / (n + 1) + 2 * se, (score, alpha, mean, se)
        assert np.mean(size) < cost.shape[1]  # not the whole gallery


def test_binomial_cdf_against_the_sum_of_its_terms() -> None:
    for n, p in ((10, 0.1), (57, 0.3), (400, 0.05)):
        for k in (-1, 0, 3, n // 2, n):
            want = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(0, max(k, -1) + 1))
            assert binomial_cdf(k, n, p) == pytest.approx(min(want, 1.0), rel=1e-9, abs=1e-300)


def test_learn_then_test_against_fixed_sequence_testing_by_hand() -> None:
    conf = np.array([0.9, 0.8, 0.8, 0.7, 0.6, 0.5, 0.4])
    correct = np.array([True, True, True, True, False, True, False])
    got = learn_then_test(conf, correct, alpha=0.5, delta=0.2, grid=np.unique(conf))
    # by hand: from 0.9 down, the null is rejected while P(Bin(n, .5) <= errors) <= .2
    want, n_err = None, []
    assert min_answered(0.5, 0.2) == 3  # 0.5 ** 3 <= 0.2 < 0.5 ** 2: the sequence starts at 3 answered
    for t in sorted(set(conf), reverse=True):
        ans = conf >= t
        n, errors = int(ans.sum()), int((~correct[ans]).sum())
        if n < 3:
            continue
        if binomial_cdf(errors, n, 0.5) > 0.2:
            break
        want, n_err = t, (n, errors)
    assert got.threshold == want and (got.answered, got.errors) == n_err and got.queries == 7
    assert learn_then_test(conf, ~correct, 0.1, 0.05).threshold is None  # nothing can be shown: answer nothing
    # the default grid (0.995 .. 0, step 0.005): every step down to 0.405 answers what 0.5 answers (6 queries, 1
    # error, p = 7/64); at 0.4 the 7th query, wrong, makes p = 29/128 > 0.2
    assert learn_then_test(conf, correct, 0.5, 0.2).threshold == pytest.approx(0.405)


def test_the_risk_guarantee_holds_over_200_random_calibration_sets() -> None:
    """200 calibration sets of 500 queries drawn from a gallery of 100,000: the share whose chosen threshold
    answers with a population error rate above alpha is at most delta (two standard errors). (The rate on a few
    hundred other held-out queries scatters around the population rate: see metrics/risk.py.)"""
    cost, gt, _ = _world(q=100_000, seed=6)
    top2 = np.sort(cost, axis=1)[:, :2]
    conf = 1 - np.exp(-(top2[:, 1] - top2[:, 0]))  # the margin, in [0, 1): a fixed map, not fitted
    correct = cost.argmin(axis=1) == gt
    rng = np.random.default_rng(7)
    for alpha, delta in ((0.05, 0.05), (0.1, 0.05), (0.2, 0.1)):
        over, answered = [], []
        for _ in range(200):
            cal = rng.choice(len(gt), 500, replace=False)
            t = learn_then_test(conf[cal], correct[cal], alpha, delta).threshold
            ans = conf >= t if t is not None else np.zeros(len(gt), bool)
            answered.append(ans.mean())
            over.append(bool(ans.any()) and np.mean(~correct[ans]) > alpha)
        share = float(np.mean(over))
        assert share <= delta + 2 * math.sqrt(delta * (1 - delta) / 200), (alpha, share)
        assert np.mean(answered) > 0.3  # it answers: the guarantee is not bought by silence
