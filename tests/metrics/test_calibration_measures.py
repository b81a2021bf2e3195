"""The calibration measures against loops and, where it has them, scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.metrics.calibration import (
    auroc,
    brier_score,
    calibration_report,
    expected_calibration_error,
    log_loss,
    reliability_bins,
)


def _data(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 1, n)
    y = rng.uniform(0, 1, n) < p**1.5  # miscalibrated on purpose
    return p, y


def _ece_loop(p, y, edges) -> float:
    total = 0.0
    bins = len(edges) - 1
    for b in range(bins):
        lo, hi = edges[b], edges[b + 1]
        inside = [(pi, yi) for pi, yi in zip(p, y) if (lo <= pi < hi) or (b == bins - 1 and pi == hi)]
        if inside:
            conf = sum(pi for pi, _ in inside) / len(inside)
            acc = sum(float(yi) for _, yi in inside) / len(inside)
            total += len(inside) / len(p) * abs(acc - conf)
    return total


def test_ece_equal_width_matches_a_loop() -> None:
    p, y = _data()
    ref = _ece_loop(p, y, np.linspace(0, 1, 16))
    assert expected_calibration_error(p, y, 15, "width") == pytest.approx(ref, abs=1e-12)


def test_ece_equal_mass_bins_hold_about_the_same_number_of_queries() -> None:
    p, y = _data(450)
    r = reliability_bins(p, y, 15, "mass")
    assert r.count.sum() == 450 and r.count.min() >= 29 and r.count.max() <= 31
    edges = np.quantile(p, np.linspace(0, 1, 16))
    edges[0], edges[-1] = 0.0, 1.0
    assert expected_calibration_error(p, y, 15, "mass") == pytest.approx(_ece_loop(p, y, edges), abs=1e-12)


def test_a_perfectly_calibrated_constant_has_zero_ece() -> None:
    y = np.array([1, 0, 0, 1] * 25, bool)
    assert expected_calibration_error(np.full(100, 0.5), y) == pytest.approx(0.0)


def test_brier_log_loss_and_auroc_match_loops() -> None:
    p, y = _data(200, 1)
    assert brier_score(p, y) == pytest.approx(sum((pi - yi) ** 2 for pi, yi in zip(p, y)) / len(p), rel=1e-12)
    ll = -sum(math.log(pi) if yi else math.log(1 - pi) for pi, yi in zip(p, y)) / len(p)
    assert log_loss(p, y) == pytest.approx(ll, rel=1e-12)
    pos, neg = p[y], p[~y]
    pairs = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    assert auroc(p, y) == pytest.approx(pairs / (len(pos) * len(neg)), rel=1e-12)


def test_auroc_counts_ties_as_a_half() -> None:
    s = np.array([0.5, 0.5, 0.2, 0.9])
    y = np.array([1, 0, 0, 1], bool)
    # pairs (pos, neg): (0.5, 0.5) 0.5, (0.5, 0.2) 1, (0.9, 0.5) 1, (0.9, 0.2) 1
    assert auroc(s, y) == pytest.approx(3.5 / 4)
    assert math.isnan(auroc(s, np.ones(4, bool)))


def test_against_scikit_learn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    p, y = _data(300, 2)
    assert brier_score(p, y) == pytest.approx(metrics.brier_score_loss(y, p), rel=1e-10)
    assert log_loss(p, y) == pytest.approx(metrics.log_loss(y, p), rel=1e-10)
    assert auroc(p, y) == pytest.approx(metrics.roc_auc_score(y, p), rel=1e-10)


def test_report_and_bad_input() -> None:
    p, y = _data(50)
    r = calibration_report(p, y)
    assert set(r) == {"ece", "ece_mass", "brier", "log_loss", "auroc", "mean_probability", "accuracy", "queries"}
    assert r["queries"] == 50 and r["accuracy"] == pytest.approx(y.mean())
    with pytest.raises(ConfigError, match="in \\[0, 1\\]"):
        brier_score([1.5], [1])
    with pytest.raises(ConfigError, match="one value a query"):
        brier_score([0.5, 0.5], [1])
    with pytest.raises(ConfigError, match="no queries"):
        log_loss([], [])
    with pytest.raises(ConfigError, match="binning"):
        expected_calibration_error(p, y, binning="quantile")


def test_top_bins_against_a_loop() -> None:
    """Equal-mass bins of >= 100 queries among those with p >= 0.5, with the Wilson interval (issue 60)."""
    from dab_pipeline.metrics.calibration import top_bins

    rng = np.random.default_rng(3)
    p = rng.uniform(0, 1, 1000)
    y = rng.uniform(0, 1, 1000) < p
    bins = top_bins(p, y)
    top = np.sort(p[p >= 0.5])
    assert sum(b["count"] for b in bins) == len(top) and all(b["count"] >= 100 for b in bins)
    assert len(bins) == len(top) // 100
    for b in bins:
        inside = (p >= b["low"]) & (p <= b["high"])
        assert b["count"] == inside.sum() and np.isclose(b["mean_p"], p[inside].mean())
        n, k = inside.sum(), y[inside].sum()
        rate, z = k / n, 1.959963984540054
        c = (rate + z**2 / (2 * n)) / (1 + z**2 / n)
        h = z * np.sqrt(rate * (1 - rate) / n + z**2 / (4 * n**2)) / (1 + z**2 / n)
        assert np.allclose(b["interval"], [c - h, c + h]) and b["observed"] == rate
    assert top_bins(p[:150], y[:150]) == []  # fewer than 100 queries at p >= 0.5
