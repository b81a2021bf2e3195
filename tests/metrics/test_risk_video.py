"""Learn-then-Test with the video as the unit (metrics/risk.py): the per-video statistic and the two p-values
against plain loops, the fast paths against the references, and the guarantee on a clustered population of known
risk (issue 58)."""

from __future__ import annotations

import math

import numpy as np

from dab_pipeline.calibration.build import split_videos
from dab_pipeline.metrics.risk import (
    binomial_cdf,
    hoeffding_bentkus_pvalue,
    learn_then_test,
    risk_test_order,
    video_statistic,
    video_statistics,
    wsr_pvalue,
    wsr_pvalues,
)
from dab_pipeline.testing import clustered_outcomes, clustered_risk


def _wsr_loop(x, alpha, delta):
    """Waudby-Smith & Ramdas's capital process as RCPS writes it, one step at a time."""
    n, wealth, best, s, s2 = len(x), 1.0, 1.0, 0.0, 0.0
    var_before = 0.25
    for i, xi in enumerate(x, start=1):
        nu = min(1.0, math.sqrt(2 * math.log(1 / delta) / (n * var_before)))
        wealth *= max(1 - nu * (xi - alpha), 0.0)
        best = max(best, wealth)
        s += xi
        mu = (0.5 + s) / (1 + i)
        s2 += (xi - mu) ** 2
        var_before = (0.25 + s2) / (1 + i)
    return min(1.0, 1 / best)


def test_the_per_video_statistic_against_a_loop() -> None:
    rng = np.random.default_rng(0)
    video = rng.integers(0, 30, 200)
    conf, ok = rng.random(200), rng.random(200) < 0.7
    alpha = 0.15
    x = video_statistic(conf >= 0.4, ok, video, alpha)
    order = list(dict.fromkeys(video.tolist()))  # videos in the order of their first caption
    for v, xv in zip(order, x):
        mine = video == v
        a = (conf[mine] >= 0.4).sum()
        e = ((conf[mine] >= 0.4) & ~ok[mine]).sum()
        assert xv == np.clip(alpha + (e - alpha * a) / mine.sum(), 0, 1)
    grid = np.array([0.9, 0.4, 0.1])
    np.testing.assert_allclose(video_statistics(conf, ok, video, alpha, grid)[1], x)


def test_p_values_against_loops_and_their_fast_paths() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = np.clip(rng.normal(0.08, 0.05, int(rng.integers(5, 300))), 0, 1)
        assert wsr_pvalue(x, 0.1, 0.05) == _wsr_loop(x, 0.1, 0.05) or math.isclose(
            wsr_pvalue(x, 0.1, 0.05), _wsr_loop(x, 0.1, 0.05), rel_tol=1e-9
        )
        m, n = float(x.mean()), len(x)
        h1 = m * math.log(m / 0.1) + (1 - m) * math.log((1 - m) / 0.9) if m < 0.1 else 0
        want = 1.0 if m >= 0.1 else min(1, math.exp(-n * h1), math.e * binomial_cdf(math.ceil(n * m), n, 0.1))
        assert math.isclose(hoeffding_bentkus_pvalue(m, n, 0.1), want, rel_tol=1e-9)
    xs = np.clip(rng.normal(0.1, 0.05, (7, 80)), 0, 1)
    np.testing.assert_allclose(wsr_pvalues(xs, 0.12, 0.05), [wsr_pvalue(r, 0.12, 0.05) for r in xs], rtol=1e-12)


def test_an_order_fixed_elsewhere_is_followed_to_its_first_failure() -> None:
    rng = np.random.default_rng(2)
    video = np.repeat(np.arange(400), 3)
    conf = rng.random(1200)
    ok = rng.random(1200) < np.where(conf > 0.5, 0.97, 0.5)
    order = np.array([0.6, 0.9, 0.3, 0.7])  # 0.3 answers half-wrong queries: the sequence stops there
    got = learn_then_test(conf, ok, 0.1, 0.05, video=video, order=order)
    assert got.threshold == 0.6 and got.test == "wsr" and got.videos == 400  # the lowest rejected before 0.3
    assert got.answered == int((conf >= 0.6).sum())


def test_the_risk_bound_holds_with_the_video_as_the_unit() -> None:
    """100 calibration draws of 800 clustered videos (1 to 12 captions each), split by video into a half that
    orders the thresholds and a half that tests them: the share of draws whose population risk at the chosen
    threshold exceeds the max risk is within a binomial tolerance of delta, and the test answers queries."""
    pop = clustered_outcomes(100_000, seed=1)
    grid = np.linspace(1.0, 0.0, 201)[1:]
    risk = dict(zip(grid.tolist(), clustered_risk(pop, grid)))
    alpha, delta, draws = 0.2, 0.05, 100
    over, answered = [], []
    for d in range(draws):
        s = clustered_outcomes(800, seed=1000 + d)
        fit, check = split_videos(s["video"], d)
        order = risk_test_order(s["confidence"][fit], s["correct"][fit], s["video"][fit], alpha, delta)
        got = learn_then_test(
            s["confidence"][check], s["correct"][check], alpha, delta, video=s["video"][check], order=order
        )
        over.append(got.threshold is not None and risk[got.threshold] > alpha)
        answered.append(got.answered_share)
    assert np.mean(over) <= delta + 2 * math.sqrt(delta * (1 - delta) / draws)
    assert np.mean(answered) > 0.1  # not bought by silence
