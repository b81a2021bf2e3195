"""The video as the unit and Mondrian bands (metrics/conformal.py), each against a naive loop, and per-band coverage
over random splits by video on a clustered synthetic gallery (issue 58)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.metrics.conformal import (
    band_edges,
    band_of,
    band_quantiles,
    conformal_quantile,
    conformal_scores,
    conformal_sets,
    cost_softmax,
    video_weights,
    weighted_quantile,
)
from dab_pipeline.testing import clustered_gallery


def _naive_weighted_quantile(s, w, alpha):
    """The smallest calibration score whose weight at or below it reaches (1 - alpha)(W + 1), by a loop."""
    need = (1 - alpha) * (sum(w) + 1)
    for cand in sorted(s):
        if sum(wi for si, wi in zip(s, w) if si <= cand) >= need - 1e-9:
            return cand
    return math.inf


def test_weighted_quantile_against_a_loop_and_the_plain_quantile() -> None:
    rng = np.random.default_rng(0)
    for trial in range(60):
        n = int(rng.integers(1, 40))
        s = rng.normal(size=n).round(1)  # ties too
        w = rng.choice([1.0, 0.5, 1 / 3, 0.25], n)
        alpha = float(rng.choice([0.05, 0.1, 0.2, 0.5]))
        assert weighted_quantile(s, alpha, w) == _naive_weighted_quantile(list(s), list(w), alpha)
        if n >= 1 / alpha - 1:
            assert weighted_quantile(s, alpha) == conformal_quantile(s, alpha)  # unit weights: the plain rule
        else:
            assert weighted_quantile(s, alpha) == math.inf
            with pytest.raises(ConfigError, match="too few"):
                conformal_quantile(s, alpha)


def test_video_weights_sum_to_one_a_video() -> None:
    video = np.array(["a", "b", "a", "c", "a", "b"])
    w = video_weights(video)
    np.testing.assert_allclose(w, [1 / 3, 1 / 2, 1 / 3, 1, 1 / 3, 1 / 2])
    assert w.sum() == pytest.approx(3)


def test_bands_against_a_loop() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=300)
    edges = band_edges(x[:150], 3)
    assert len(edges) == 2 and edges[0] < edges[1]
    b = band_of(x, edges)
    for xi, bi in zip(x, b):
        assert bi == sum(xi > e for e in edges)
    s, w = rng.random(300), rng.choice([1.0, 0.5], 300)
    q = band_quantiles(s, b, 3, 0.1, w)
    for i in range(3):
        assert q[i] == _naive_weighted_quantile(list(s[b == i]), list(w[b == i]), 0.1)
    assert band_quantiles(s[:5], np.zeros(5, int), 2, 0.1)[1] == math.inf  # an empty band: no quantile
    with pytest.raises(ConfigError, match="bands"):
        band_edges(x, 0)


def test_sets_with_costs_hold_the_first_hit_and_only_scored_videos() -> None:
    cost = np.array([[1.0, 5.0, np.inf, 2.0], [3.0, 0.5, 9.0, np.inf]])
    p = cost_softmax(np.where(np.isfinite(cost), cost, 1e9), 1.0)
    s = conformal_scores(p, "aps")
    empty = conformal_sets(s, -1.0, cost)  # a quantile below every score: the plain rule gives empty sets
    assert [e.tolist() for e in empty] == [[0], [1]]
    full = conformal_sets(s, 10.0, cost)  # every scored video, best first, never an unscored one
    assert [f.tolist() for f in full] == [[0, 3, 1], [1, 0, 2]]
    assert [x.tolist() for x in conformal_sets(s, 10.0)] == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_per_band_coverage_over_random_splits_by_video() -> None:
    """200 random halves of a clustered gallery's videos: per band, the coverage of "a random caption of a new
    video" lies within two standard errors of [1 - alpha, 1 - alpha + 1/(n_b + 1)] (n_b the band's calibration
    weight in videos), where the marginal quantile misses the hardest band. Edges from a third part of the
    videos that the quantiles never see."""
    g = clustered_gallery(600, seed=3)
    cost, gt, tv = g["cost"], g["gt"], g["text_var"]
    s = conformal_scores(cost_softmax(cost, 1.0), "aps")  # (Q, V)
    own = s[np.arange(len(gt)), gt]
    w = video_weights(gt)
    signal = np.log(tv)
    videos = np.unique(gt)
    alpha, bands = 0.2, 3
    per_band, marginal, sizes = [[] for _ in range(bands)], [[] for _ in range(bands)], []
    for split in range(200):
        perm = np.random.default_rng(split).permutation(videos)
        edge_v, cal_v, test_v = perm[:100], perm[100:350], perm[350:]
        edges = band_edges(signal[np.isin(gt, edge_v)], bands)
        band = band_of(signal, edges)
        cal, test = np.isin(gt, cal_v), np.isin(gt, test_v)
        q = band_quantiles(own[cal], band[cal], bands, alpha, w[cal])
        q_all = weighted_quantile(own[cal], alpha, w[cal])
        sizes.append([w[cal & (band == b)].sum() for b in range(bands)])
        for b in range(bands):
            t = test & (band == b)
            per_band[b].append(np.average(own[t] <= q[b], weights=w[t]))
            marginal[b].append(np.average(own[t] <= q_all, weights=w[t]))
    n_b = np.mean(sizes, axis=0)
    for b in range(bands):
        m, se = np.mean(per_band[b]), np.std(per_band[b]) / np.sqrt(200)
        assert 1 - alpha - 2 * se <= m <= 1 - alpha + 1 / (n_b[b] + 1) + 2 * se, (b, m, se)
    assert np.mean(marginal[bands - 1]) < 1 - alpha - 0.02  # the hardest band, marginally calibrated, misses
