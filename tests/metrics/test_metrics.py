"""Tests of dab_pipeline.metrics on hand-worked matrices and naive references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dab_pipeline import metrics as M
from dab_pipeline.core.errors import ConfigError

# --------------------------------------------------------------------------
# naive references (loops, written independently of the vectorised code)
# --------------------------------------------------------------------------


def naive_t2v(cost: np.ndarray, gt: np.ndarray) -> np.ndarray:
    ranks = []
    for q in range(cost.shape[0]):
        own = cost[q, gt[q]]
        ahead = sum(1 for v in range(cost.shape[1]) if v != gt[q] and cost[q, v] <= own)
        ranks.append(1 + ahead)
    return np.array(ranks)


def naive_v2t(cost: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """Sort each column with negatives ahead of positives on ties; first positive's position."""
    ranks = []
    for v in range(cost.shape[1]):
        positive = gt == v
        if not positive.any():
            continue
        # lexsort: last key is primary -> by cost, then negatives (0) before positives (1).
        order = np.lexsort((positive.astype(int), cost[:, v]))
        ranks.append(1 + int(np.flatnonzero(positive[order])[0]))
    return np.array(ranks)


# --------------------------------------------------------------------------
# ranks
# --------------------------------------------------------------------------

HAND_COST = np.array(
    [
        [0.1, 0.5, 0.3, 0.9],  # gt 0: clear winner -> rank 1
        [0.2, 0.2, 0.8, 0.1],  # gt 1: v3 better, v0 ties -> pessimistic rank 3
        [0.4, 0.3, 0.4, 0.4],  # gt 2: v1 better, v0 and v3 tie -> rank 4
    ]
)
HAND_GT = np.array([0, 1, 2])


def test_t2v_ranks_hand_case_pessimistic_ties():
    np.testing.assert_array_equal(M.t2v_ranks(HAND_COST, HAND_GT), [1, 3, 4])


def test_constant_cost_ranks_last_not_first():
    cost = np.zeros((5, 5))
    np.testing.assert_array_equal(M.t2v_ranks(cost, np.arange(5)), [5] * 5)
    assert M.t2v_metrics(cost, np.arange(5))["R@1"] == 0.0


def test_retrieval_metrics_hand_case():
    m = M.retrieval_metrics(np.array([1, 3, 4]))
    assert m["R@1"] == pytest.approx(100 / 3)
    assert m["R@5"] == pytest.approx(100.0)
    assert m["R@10"] == pytest.approx(100.0)
    assert m["R@50"] == pytest.approx(100.0)
    assert m["MdR"] == 3.0
    assert m["MnR"] == pytest.approx(8 / 3)
    assert m["RSum"] == pytest.approx(100 / 3 + 200)
    assert m["n"] == 3


def test_retrieval_metrics_median_of_even_count_and_cutoffs():
    m = M.retrieval_metrics(np.array([1, 2, 5, 6, 10, 11, 50, 51]))
    assert m["MdR"] == 8.0  # (6 + 10) / 2
    assert m["R@1"] == pytest.approx(12.5)
    assert m["R@5"] == pytest.approx(37.5)  # rank 5 counts as within top 5
    assert m["R@10"] == pytest.approx(62.5)
    assert m["R@50"] == pytest.approx(87.5)


def test_v2t_multi_caption_hand_case():
    # 4 captions, 3 videos; video 2 has no caption and is skipped.
    cost = np.array(
        [
            [0.5, 0.1, 0.0],  # caption of v0
            [0.3, 0.9, 0.0],  # caption of v0
            [0.3, 0.4, 0.0],  # caption of v1
            [0.2, 0.4, 0.0],  # caption of v1
        ]
    )
    gt = np.array([0, 0, 1, 1])
    # v0: best own 0.3; q3 (0.2) better, q2 ties at 0.3 -> pessimistic rank 3.
    # v1: own captions tie at 0.4 with each other (no penalty); q0 (0.1) better -> rank 2.
    np.testing.assert_array_equal(M.v2t_ranks(cost, gt, "captions"), [3, 2])
    np.testing.assert_array_equal(naive_v2t(cost, gt), [3, 2])
    m = M.v2t_metrics(cost, gt, "captions")
    assert m["n"] == 2
    assert m["R@1"] == 0.0 and m["MnR"] == 2.5
    # The field's convention (the default): v0's best own caption 0.3 against v1's best 0.2 in
    # column 0 -> rank 2; v1's best own 0.4 against v0's best 0.1 in column 1 -> rank 2.
    np.testing.assert_array_equal(M.v2t_ranks(cost, gt), [2, 2])
    np.testing.assert_array_equal(naive_v2t_by_video(cost, gt), [2, 2])
    assert M.v2t_metrics(cost, gt)["MnR"] == 2.0


def naive_v2t_by_video(cost, gt):
    """Each captioned video ranks the other captioned videos, each once by its best caption (pessimistic ties)."""
    videos = sorted(set(int(x) for x in gt))
    out = []
    for v in videos:
        best = {u: min(cost[q, v] for q in range(len(gt)) if gt[q] == u) for u in videos}
        out.append(1 + sum(1 for u in videos if u != v and best[u] <= best[v]))
    return np.array(out)


def xpool_style_v2t(cost, gt):
    """X-Pool's v2t_metrics logic on a cost matrix: pad each video's captions to the same count with
    +inf, take each (video, caption-video) pair's best caption, then rank the own video in each row."""
    videos = np.unique(gt)
    per = max(np.bincount(gt))
    sims = np.full((len(videos), per, cost.shape[1]), np.inf)
    for i, u in enumerate(videos):
        rows = cost[gt == u]
        sims[i, : len(rows)] = rows
    best = sims.min(axis=1)[:, videos]  # (V', V'): best caption of video i against video j
    by_query = best.T  # row: the query video, columns: the candidate videos
    return np.array([1 + np.count_nonzero(np.delete(row, j) < row[j]) for j, row in enumerate(by_query)])


def test_v2t_by_video_agrees_with_xpool_logic_on_continuous_costs():
    rng = np.random.default_rng(11)
    gt = np.concatenate([np.arange(30), rng.integers(0, 30, 90)])  # 1-8 captions per video, MSVD-like
    cost = rng.standard_normal((len(gt), 30))  # continuous: no ties, so tie rules cannot differ
    np.testing.assert_array_equal(M.v2t_ranks(cost, gt), xpool_style_v2t(cost, gt))
    assert not np.array_equal(M.v2t_ranks(cost, gt), M.v2t_ranks(cost, gt, "captions"))


def test_v2t_conventions_agree_with_one_caption_per_video_and_reject_unknown_names():
    rng = np.random.default_rng(3)
    cost, gt = rng.integers(0, 3, (7, 7)).astype(np.float32), rng.permutation(7)
    np.testing.assert_array_equal(M.v2t_ranks(cost, gt), M.v2t_ranks(cost, gt, "captions"))
    with pytest.raises(ConfigError, match="videos, captions"):
        M.v2t_ranks(cost, gt, "texts")


def test_t2v_multi_caption_every_caption_is_a_query():
    cost = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.2]])
    gt = np.array([0, 0, 1])
    np.testing.assert_array_equal(M.t2v_ranks(cost, gt), [1, 2, 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranks_match_naive_on_random_matrices_with_ties(seed):
    rng = np.random.default_rng(seed)
    q, v = 40, 9
    cost = rng.integers(0, 4, size=(q, v)).astype(np.float32)  # few values -> many ties
    gt = rng.integers(0, v - 1, size=q)  # the last video never has a caption
    np.testing.assert_array_equal(M.t2v_ranks(cost, gt), naive_t2v(cost, gt))
    np.testing.assert_array_equal(M.v2t_ranks(cost, gt, "captions"), naive_v2t(cost, gt))
    np.testing.assert_array_equal(M.v2t_ranks(cost, gt), naive_v2t_by_video(cost, gt))


def test_ranks_blockwise_path(monkeypatch):
    # Force many tiny blocks so the chunking code is exercised.
    monkeypatch.setattr(M.retrieval, "_BLOCK_ELEMS", 7)
    rng = np.random.default_rng(5)
    cost = rng.random((23, 6))
    gt = rng.integers(0, 6, size=23)
    np.testing.assert_array_equal(M.t2v_ranks(cost, gt), naive_t2v(cost, gt))
    np.testing.assert_array_equal(M.v2t_ranks(cost, gt, "captions"), naive_v2t(cost, gt))
    np.testing.assert_array_equal(M.v2t_ranks(cost, gt), naive_v2t_by_video(cost, gt))
    np.testing.assert_allclose(M.kl_margin(cost), np.diff(np.sort(cost, axis=1)[:, :2], axis=1)[:, 0])


def test_evaluate_all_sections_and_label():
    out = M.evaluate_all(HAND_COST, HAND_GT)
    assert set(out) == {"t2v", "v2t", "v2t_convention", "postprocess"}
    assert out["postprocess"] == {"name": "none"} and out["v2t_convention"] == "videos"
    strict = M.evaluate_all(HAND_COST, HAND_GT, v2t_convention="captions")
    assert strict["v2t_convention"] == "captions" and strict["v2t"] == M.v2t_metrics(HAND_COST, HAND_GT, "captions")
    assert out["t2v"]["MnR"] == pytest.approx(8 / 3)
    assert out["v2t"]["n"] == 4 - 1  # video 3 has no caption


def test_shape_errors_name_the_shapes():
    with pytest.raises(ConfigError, match=r"\(3, 4\).*\(2,\)"):
        M.t2v_ranks(HAND_COST, np.array([0, 1]))
    with pytest.raises(ConfigError, match="2-D"):
        M.t2v_ranks(np.zeros(4), np.array([0]))
    with pytest.raises(ConfigError, match="range"):
        M.t2v_ranks(HAND_COST, np.array([0, 1, 4]))
    with pytest.raises(ConfigError, match="NaN"):
        M.t2v_ranks(np.array([[np.nan, 1.0]]), np.array([0]))
    with pytest.raises(ConfigError):
        M.retrieval_metrics(np.array([0, 1]))


# --------------------------------------------------------------------------
# post-processing
# --------------------------------------------------------------------------

# Video 0 is a hub: the cheapest video for every query.
HUB_COST = np.array(
    [
        [0.10, 0.50, 0.60],
        [0.20, 0.25, 0.90],
        [0.20, 0.90, 0.30],
    ]
)


def test_dual_softmax_demotes_the_hub():
    gt = np.arange(3)
    np.testing.assert_array_equal(M.t2v_ranks(HUB_COST, gt), [1, 2, 2])
    out = M.dual_softmax(HUB_COST, postprocess_temperature=0.1)
    assert out.shape == HUB_COST.shape
    np.testing.assert_array_equal(M.t2v_ranks(out, gt), [1, 1, 1])
    labelled = M.evaluate_all(HUB_COST, gt, postprocess="dsl", postprocess_temperature=0.1)
    assert labelled["postprocess"] == {"name": "dsl", "temperature": 0.1}
    assert labelled["t2v"]["R@1"] == pytest.approx(100.0)


def test_dual_softmax_ranks_like_product_of_softmaxes():
    rng = np.random.default_rng(3)
    cost = rng.random((12, 7)) * 5
    t = 0.7
    s = -cost / t
    p_v_given_q = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
    p_q_given_v = np.exp(s) / np.exp(s).sum(axis=0, keepdims=True)
    product = p_v_given_q * p_q_given_v
    out = M.dual_softmax(cost, postprocess_temperature=t)
    np.testing.assert_array_equal(np.argsort(out, axis=1), np.argsort(-product, axis=1))
    # axis=1 is the same operation on the transpose.
    np.testing.assert_allclose(M.dual_softmax(cost, t, axis=1), M.dual_softmax(cost.T, t).T)


def test_dual_softmax_is_shift_invariant_and_keeps_float32():
    rng = np.random.default_rng(4)
    cost = rng.random((10, 6)).astype(np.float32)
    a = M.dual_softmax(cost, 0.2)
    b = M.dual_softmax(cost + 100.0, 0.2)
    assert a.dtype == np.float32
    np.testing.assert_array_equal(np.argsort(a, axis=1), np.argsort(b, axis=1))


def test_inverted_softmax_with_bank_matches_formula(monkeypatch):
    monkeypatch.setattr(M.retrieval, "_BLOCK_ELEMS", 5)  # blockwise normaliser
    rng = np.random.default_rng(6)
    cost = rng.random((8, 5))
    bank = rng.random((20, 5))
    t = 0.3
    expected = cost + t * np.log(np.exp(-bank / t).sum(axis=0))[None, :]
    np.testing.assert_allclose(M.inverted_softmax(cost, t, bank_cost=bank), expected)
    with pytest.raises(ConfigError, match="bank_cost"):
        M.inverted_softmax(cost, t, bank_cost=rng.random((20, 4)))
    label = M.evaluate_all(cost, np.arange(8) % 5, postprocess="is", postprocess_temperature=t)
    assert label["postprocess"]["bank"].startswith("queries")


def test_postprocess_rejects_bad_arguments():
    with pytest.raises(ConfigError, match="temperature"):
        M.dual_softmax(HUB_COST, postprocess_temperature=0.0)
    with pytest.raises(ConfigError, match="valid"):
        M.evaluate_all(HUB_COST, np.arange(3), postprocess="qbnorm")


def test_the_metrics_take_only_their_keywords_own_names():
    """Issue 35 renamed the post-processing's temperature and the neighbourhood's cosine thresholds (both had been
    called after the model's PAC temperature); these functions are not public API (docs/api.md), so issue 48 dropped
    the old keywords. metrics.json keeps its on-disk key."""
    gt = np.arange(3)
    with pytest.raises(TypeError, match="temperature"):
        M.dual_softmax(HUB_COST, temperature=0.1)
    with pytest.raises(TypeError, match="taus"):
        M.semantic_neighbourhood(HUB_COST, gt, np.zeros((3, 4)), taus=(0.5,))
    labelled = M.evaluate_all(HUB_COST, gt, postprocess="dsl", postprocess_temperature=0.1)
    assert labelled["postprocess"] == {"name": "dsl", "temperature": 0.1}


# --------------------------------------------------------------------------
# selective prediction
# --------------------------------------------------------------------------


def test_kl_margin_hand_case():
    cost = np.array([[0.1, 0.5, 0.3], [0.2, 0.2, 0.9], [3.0, 1.0, 2.5]])
    np.testing.assert_allclose(M.kl_margin(cost), [0.2, 0.0, 1.5])
    with pytest.raises(ConfigError):
        M.kl_margin(np.zeros((3, 1)))


def test_risk_coverage_hand_case():
    coverage, risk = M.risk_coverage([0.9, 0.8, 0.7, 0.6], [1, 0, 1, 0])
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0.0, 0.5, 1 / 3, 0.5])
    assert M.aurc([0.9, 0.8, 0.7, 0.6], [1, 0, 1, 0]) == pytest.approx((0.5 + 1 / 3 + 0.5) / 4)
    # Input order does not matter, only confidence does.
    _, risk2 = M.risk_coverage([0.6, 0.7, 0.8, 0.9], [0, 1, 0, 1])
    np.testing.assert_allclose(risk2, risk)


def test_risk_coverage_tie_handling():
    conf, correct = [1.0, 1.0, 0.0], [0, 1, 1]
    _, averaged = M.risk_coverage(conf, correct)
    np.testing.assert_allclose(averaged, [0.5, 0.5, 1 / 3])
    _, stable = M.risk_coverage(conf, correct, ties="stable")
    np.testing.assert_allclose(stable, [1.0, 0.5, 1 / 3])


def test_constant_confidence_equals_random_exactly():
    rng = np.random.default_rng(7)
    correct = rng.random(101) < 0.4
    assert M.aurc(np.ones(101), correct) == pytest.approx(M.aurc_random(correct), abs=1e-12)


def test_aurc_optimal_hand_value_and_perfect_confidence():
    # 2 of 4 correct: risks 0, 0, 1/3, 1/2.
    assert M.aurc_optimal([1, 1, 0, 0]) == pytest.approx((1 / 3 + 1 / 2) / 4)
    rng = np.random.default_rng(8)
    correct = rng.random(500) < 0.55
    c, n = int(correct.sum()), correct.size
    harmonic = lambda m: sum(1.0 / i for i in range(1, m + 1))  # noqa: E731
    analytic = (n - c - c * (harmonic(n) - harmonic(c))) / n
    assert M.aurc_optimal(correct) == pytest.approx(analytic)
    # Errors all at the lowest confidence -> the oracle value.
    perfect_conf = correct + rng.random(n) * 0.5
    assert M.aurc(perfect_conf, correct) == pytest.approx(analytic)
    # Any other confidence can only do worse.
    assert M.aurc(rng.random(n), correct) > analytic


def test_random_confidence_matches_aurc_random():
    rng = np.random.default_rng(9)
    correct = rng.random(400) < 0.5
    expected = M.aurc_random(correct)
    assert expected == pytest.approx(1 - correct.mean())
    trials = [M.aurc(rng.random(400), correct) for _ in range(300)]
    assert np.mean(trials) == pytest.approx(expected, abs=0.01)
    assert M.aurc_random_mc(correct, trials=300, seed=1) == pytest.approx(expected, abs=0.01)


def test_accuracy_at_coverage():
    conf = np.arange(10)[::-1].astype(float)
    correct = [1, 1, 1, 0, 1, 0, 0, 1, 0, 0]
    assert M.accuracy_at_coverage(conf, correct, 0.25) == 1.0  # ceil(2.5) = 3 kept
    assert M.accuracy_at_coverage(conf, correct, 0.10) == 1.0
    assert M.accuracy_at_coverage(conf, correct, 0.5) == pytest.approx(0.8)
    assert M.accuracy_at_coverage(conf, correct, 1.0) == pytest.approx(0.5)
    with pytest.raises(ConfigError):
        M.accuracy_at_coverage(conf, correct, 0.0)


def test_selective_report_hand_case():
    # Margins: q0 0.4 (rank 1), q1 0.05 (rank 2), q2 0.3 (rank 1), q3 0.1 (rank 3).
    cost = np.array(
        [
            [0.1, 0.5, 0.9],
            [0.30, 0.35, 0.9],
            [0.9, 0.2, 0.5],
            [0.1, 0.2, 0.3],
        ]
    )
    gt = np.array([0, 1, 1, 2])
    rep = M.selective_report(cost, gt, coverages=(0.5, 0.25))
    assert rep["confidence"] == "kl_margin" and rep["n"] == 4
    r1 = rep["R@1"]
    # Order by margin: q0 (ok), q2 (ok), q3 (miss), q1 (miss).
    assert r1["accuracy"] == pytest.approx(50.0)
    assert r1["aurc"] == pytest.approx((0 + 0 + 1 / 3 + 1 / 2) / 4)
    assert r1["aurc_random"] == pytest.approx(0.5)
    assert r1["aurc_optimal"] == pytest.approx(r1["aurc"])
    assert r1["at_coverage"] == {"50%": 100.0, "25%": 100.0}
    assert rep["R@5"]["aurc"] == 0.0 and rep["R@5"]["accuracy"] == 100.0
    curves = rep["curves"]
    np.testing.assert_allclose(curves["coverage"], [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(curves["risk"]["R@1"], [0, 0, 1 / 3, 1 / 2])
    assert curves["random"]["R@1"] == pytest.approx(0.5)


# --------------------------------------------------------------------------
# variance asymmetry and neighbourhood
# --------------------------------------------------------------------------


def test_variance_asymmetry():
    out = M.variance_asymmetry([0.4, 0.6], [1.0, 1.0, 1.0], np.full((2, 3), 3.0))
    assert out["mean"] == pytest.approx({"text": 0.5, "bridge": 1.0, "video": 3.0})
    assert out["ratio"] == pytest.approx({"text": 1.0, "bridge": 2.0, "video": 6.0})
    no_bridge = M.variance_asymmetry([1.0], None, [2.0])
    assert set(no_bridge["mean"]) == {"text", "video"}
    with pytest.raises(ConfigError):
        M.variance_asymmetry([0.0], None, [1.0])
    with pytest.raises(ConfigError):
        M.variance_asymmetry([-1.0, 2.0], None, [1.0])


def _unit(deg: float, norm: float = 1.0) -> list[float]:
    return [norm * math.cos(math.radians(deg)), norm * math.sin(math.radians(deg))]


def test_semantic_neighbourhood_hand_case():
    # Angles: v0 0 deg, v1 15, v2 36.87, v3 90, v4 180 (norms differ: cosine must normalise).
    feats = np.array([_unit(0), _unit(15, 3.0), _unit(36.87), _unit(90, 5.0), _unit(180)])
    # cos to v0: v1 .966, v2 .8, v3 0, v4 -1;  cos to v2: v0 .8, v1 .928, v3 .6, v4 -.8
    cost = np.array(
        [
            [0.0, 0.1, 0.3, 0.2, 0.4],  # gt v0; top-3 = {v0, v1, v3}
            [0.4, 0.5, 0.2, 0.0, 0.1],  # gt v2; top-3 = {v3, v4, v2}
        ]
    )
    gt = np.array([0, 2])
    out = M.semantic_neighbourhood(cost, gt, feats, cosine_thresholds=(0.7, 0.9), k=3, seed=0)
    assert out["k"] == 3 and out["counts_gt"] is False
    rows = {r["cosine"]: r for r in out["rows"]}
    # q0: positives {v1, v2} at .7, {v1} at .9; only v1 is retrieved (gt v0 is not counted).
    # q1: positives {v0, v1} at .7, {v1} at .9; none retrieved.
    assert rows[0.7]["model"] == pytest.approx(0.5)
    assert rows[0.9]["model"] == pytest.approx(0.5)
    # Random: k / V * #positives, averaged: 3/5 * (2 + 2) / 2 and 3/5 * (1 + 1) / 2.
    assert rows[0.7]["random"] == pytest.approx(1.2)
    assert rows[0.9]["random"] == pytest.approx(0.6)
    assert rows[0.7]["ratio"] == pytest.approx(0.5 / 1.2)


def test_semantic_neighbourhood_ties_by_index_and_sampling_check():
    rng = np.random.default_rng(11)
    v = 30
    feats = rng.normal(size=(v, 4))
    gt = rng.integers(0, v, size=300)
    flat = np.zeros((300, v))  # every video ties: top-k = the first k indices
    out = M.semantic_neighbourhood(flat, gt, feats, cosine_thresholds=(0.0, 0.5), k=5)
    unit = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    cos = unit[gt] @ unit.T
    for row in out["rows"]:
        pos = (cos >= row["cosine"]) & (np.arange(v)[None, :] != gt[:, None])
        assert row["model"] == pytest.approx(pos[:, :5].sum(axis=1).mean())
        assert row["random"] == pytest.approx(pos.sum(axis=1).mean() * 5 / v)
        # One sampled random top-k per query: close to the exact expectation.
        assert row["random_sampled"] == pytest.approx(row["random"], rel=0.15)


def test_semantic_neighbourhood_rejects_wrong_feature_shape():
    with pytest.raises(ConfigError, match=r"\(3, D\)"):
        M.semantic_neighbourhood(np.zeros((2, 3)), np.array([0, 1]), np.zeros((4, 8)))


# ----------------------------------------------------------------------------- the bridge's shift


def naive_shift_decomposition(s: np.ndarray) -> dict[str, float]:
    """Two-way decomposition with explicit loops over the grid."""
    n_t, n_v, _ = s.shape
    m = sum(s[t, v] for t in range(n_t) for v in range(n_v)) / (n_t * n_v)
    a = [sum(s[t, v] for v in range(n_v)) / n_v - m for t in range(n_t)]
    b = [sum(s[t, v] for t in range(n_t)) / n_t - m for v in range(n_v)]
    ss = {"constant": 0.0, "text": 0.0, "video": 0.0, "interaction": 0.0}
    for t in range(n_t):
        for v in range(n_v):
            e = s[t, v] - m - a[t] - b[v]
            ss["constant"] += float(m @ m)
            ss["text"] += float(a[t] @ a[t])
            ss["video"] += float(b[v] @ b[v])
            ss["interaction"] += float(e @ e)
    total = float((s * s).sum())
    return {k: v / total for k, v in ss.items()}


def test_shift_decomposition_matches_loops_and_adds_up() -> None:
    rng = np.random.default_rng(0)
    s = rng.normal(size=(5, 7, 3)) + np.array([2.0, -1.0, 0.5])
    got = M.shift_decomposition(s)
    want = naive_shift_decomposition(s)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-10)
    assert sum(got[k] for k in want) == pytest.approx(1.0)
    assert got["pair_dependent"] == pytest.approx(1.0 - got["constant"])


def test_shift_decomposition_of_shifts_built_to_one_part() -> None:
    rng = np.random.default_rng(1)
    const = np.broadcast_to(rng.normal(size=4), (6, 5, 4))
    assert M.shift_decomposition(const)["pair_dependent"] == pytest.approx(0.0, abs=1e-12)
    text_only = np.broadcast_to(rng.normal(size=(6, 1, 4)), (6, 5, 4))
    text_only = text_only - text_only.mean(axis=(0, 1))
    assert M.shift_decomposition(text_only)["text"] == pytest.approx(1.0)
    inter = rng.normal(size=(6, 5, 4))
    inter = inter - inter.mean(axis=0, keepdims=True) - inter.mean(axis=1, keepdims=True) + inter.mean(axis=(0, 1))
    assert M.shift_decomposition(inter)["interaction"] == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="grid"):
        M.shift_decomposition(np.zeros((3, 4)))
    assert math.isnan(M.shift_decomposition(np.zeros((2, 2, 3)))["pair_dependent"])


# ----------------------------------------------------------------------------- several relevant videos


def naive_relevance(cost: np.ndarray, rel: np.ndarray, k: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"AP": [], "nDCG": [], "P@1": []}
    for c, r in zip(cost, rel):
        order = sorted(range(len(c)), key=lambda j: (c[j], bool(r[j])))  # ties: irrelevant first
        ranked = [bool(r[j]) for j in order]
        found, precisions = 0, []
        for i, hit in enumerate(ranked, 1):
            if hit:
                found += 1
                precisions.append(found / i)
        out["AP"].append(sum(precisions) / len(precisions))
        dcg = sum(1 / math.log2(i + 1) for i, hit in enumerate(ranked[:k], 1) if hit)
        idcg = sum(1 / math.log2(i + 1) for i in range(1, min(k, sum(ranked)) + 1))
        out["nDCG"].append(dcg / idcg)
        out["P@1"].append(float(ranked[0]))
    return out


def test_relevance_metrics_hand_case() -> None:
    cost = np.array([[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.1, 0.9]])
    rel = np.array([[False, True, False, True], [True, False, False, False]])
    m = M.relevance_metrics(cost, rel, k=2)
    # query 0: relevant at ranks 2 and 4 -> AP (1/2 + 2/4) / 2; nDCG@2 = (1/log2 3) / 1; P@1 0
    third = 1 / math.log2(3)
    assert m["AP"][0] == pytest.approx(0.5) and m["nDCG@2"][0] == pytest.approx(third / (1 + third))
    assert m["P@1"][0] == 0.0 and m["relevant"].tolist() == [2.0, 1.0]
    # query 1: the relevant video ties with an irrelevant one at 0.5: ranked after it (rank 3)
    assert m["AP"][1] == pytest.approx(1 / 3) and m["nDCG@2"][1] == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_relevance_metrics_match_naive_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cost = rng.integers(0, 5, size=(30, 12)).astype(np.float32)  # many ties
    rel = rng.random((30, 12)) < 0.3
    rel[np.arange(30), rng.integers(0, 12, 30)] = True
    got, want = M.relevance_metrics(cost, rel, k=5), naive_relevance(cost, rel, 5)
    np.testing.assert_allclose(got["AP"], want["AP"])
    np.testing.assert_allclose(got["nDCG@5"], want["nDCG"])
    np.testing.assert_allclose(got["P@1"], want["P@1"])
    with pytest.raises(ConfigError, match="no relevant"):
        M.relevance_metrics(cost, np.zeros_like(rel))


def test_paired_bootstrap_hand_case_and_identical_rows() -> None:
    # two queries with paired differences 0 and 1: a resample's mean is 0, 0.5 or 1 with
    # probabilities 1/4, 1/2, 1/4, so the 95 % interval is [0, 1] around the mean 0.5
    res = M.paired_bootstrap([0.0, 1.0], [0.0, 0.0], n_boot=4000, seed=0)
    assert res["diff"] == 0.5 and res["low"] == 0.0 and res["high"] == 1.0 and not res["excludes_zero"]
    rng = np.random.default_rng(3)
    a = rng.random(200)
    same = M.paired_bootstrap(a, a)
    assert same["diff"] == same["low"] == same["high"] == 0.0 and not same["excludes_zero"]
    shifted = M.paired_bootstrap(a + 0.1, a)
    assert shifted["low"] == pytest.approx(0.1) and shifted["excludes_zero"]
    # two independent noisy rows of the same mean: the 95 % interval covers 0 about 95 % of the time
    covered = [
        not M.paired_bootstrap(rng.random((3, 100)), rng.random((3, 100)), n_boot=500, seed=s)["excludes_zero"]
        for s in range(40)
    ]
    assert 34 <= sum(covered) <= 40
    b = rng.random((3, 200))
    # seeds pooled: (S, Q) is averaged per query first
    assert M.paired_bootstrap(b, a)["diff"] == pytest.approx(b.mean() - a.mean())
    with pytest.raises(ConfigError, match="same queries"):
        M.paired_bootstrap(a, a[:10])


def test_spearman_hand_cases() -> None:
    assert M.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert M.average_ranks([10, 20, 20, 30]).tolist() == [1.0, 2.5, 2.5, 4.0]
    want = np.corrcoef([1.0, 2.5, 2.5, 4.0], [1.0, 3.0, 2.0, 4.0])[0, 1]
    assert M.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(want)
    assert math.isnan(M.spearman([1, 1, 1], [1, 2, 3]))
    # rank correlation: any increasing transform of one side leaves it unchanged
    rng = np.random.default_rng(0)
    x, y = rng.random(50), rng.random(50)
    assert M.spearman(np.exp(5 * x), y) == pytest.approx(M.spearman(x, y))


def test_lowrank_variance_share_against_the_full_covariance() -> None:
    from dab_pipeline.metrics import lowrank_variance_share

    rng = np.random.default_rng(0)
    lv, u = rng.normal(size=(5, 6)), rng.normal(size=(5, 6, 2))
    naive = [np.trace(u[q] @ u[q].T) / np.trace(np.diag(np.exp(lv[q])) + u[q] @ u[q].T) for q in range(5)]
    assert lowrank_variance_share(lv, u) == pytest.approx(np.mean(naive), rel=1e-12)
    assert lowrank_variance_share(lv, np.zeros((5, 6, 1))) == 0.0
    with pytest.raises(ConfigError):
        lowrank_variance_share(lv, u[:, :5])


def test_text_logdet_against_the_full_covariance() -> None:
    rng = np.random.default_rng(1)
    lv, u = rng.normal(size=(5, 6)), rng.normal(size=(5, 6, 2))
    full = [np.linalg.slogdet(np.diag(np.exp(lv[q])) + u[q] @ u[q].T) for q in range(5)]
    assert all(sign == 1 for sign, _ in full)
    np.testing.assert_allclose(M.text_logdet(lv, u), [v for _, v in full], rtol=1e-10)
    diag = [np.linalg.slogdet(np.diag(np.exp(lv[q])))[1] for q in range(5)]
    np.testing.assert_allclose(M.text_logdet(lv), diag, rtol=1e-10)
    np.testing.assert_allclose(M.text_logdet(lv, np.zeros((5, 6, 3))), diag, rtol=1e-12)  # U = 0 is diagonal
    # a larger U never lowers the determinant (Sigma grows in the Loewner order)
    assert np.all(M.text_logdet(lv, 2 * u) >= M.text_logdet(lv, u))
    with pytest.raises(ConfigError):
        M.text_logdet(lv, u[:, :5])
    with pytest.raises(ConfigError):
        M.text_logdet(lv[0])


def naive_mixture_weights(logits: np.ndarray) -> tuple[list[float], list[float], float]:
    weights, entropies, rows = [], [], []
    for z in logits:
        w = [math.exp(v) for v in z]
        w = [v / sum(w) for v in w]
        weights.append(w)
        rows.append(sorted(w, reverse=True))
        entropies.append(-sum(v * math.log(v) for v in w) / math.log(len(w)))
    per_comp = sorted((sum(w[k] for w in weights) / len(weights) for k in range(len(weights[0]))), reverse=True)
    ranked = [sum(r[k] for r in rows) / len(rows) for k in range(len(rows[0]))]
    return per_comp, ranked, sum(entropies) / len(entropies)


def test_mixture_weights_against_a_naive_softmax() -> None:
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(7, 3)) * 2
    got = M.mixture_weights(logits)
    per_comp, ranked, entropy = naive_mixture_weights(logits)
    assert got["components"] == 3
    np.testing.assert_allclose(got["weights"], per_comp, rtol=1e-12)
    np.testing.assert_allclose(got["ranked_weights"], ranked, rtol=1e-12)
    assert got["entropy"] == pytest.approx(entropy, rel=1e-12)
    uniform = M.mixture_weights(np.zeros((4, 4)))
    assert uniform["entropy"] == pytest.approx(1.0) and uniform["ranked_weights"] == pytest.approx([0.25] * 4)
    one_hot = M.mixture_weights(np.array([[300.0, 0.0], [0.0, 300.0]]))  # each text uses one component
    assert one_hot["weights"] == pytest.approx([0.5, 0.5]) and one_hot["ranked_weights"] == pytest.approx([1.0, 0.0])
    assert one_hot["entropy"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ConfigError):
        M.mixture_weights(np.zeros((3, 1)))


def naive_topk_components(component: np.ndarray, cost: np.ndarray, k: int) -> tuple[float, float]:
    counts = []
    for q in range(cost.shape[0]):
        order = sorted(range(cost.shape[1]), key=lambda v: (cost[q, v], v))[:k]
        counts.append(len({int(component[q, v]) for v in order}))
    return sum(c > 1 for c in counts) / len(counts), sum(counts) / len(counts)


def test_mixture_topk_components_against_a_naive_loop() -> None:
    rng = np.random.default_rng(3)
    cost = rng.integers(0, 6, size=(9, 12)).astype(np.float64)  # many ties: broken by the lower index
    component = rng.integers(0, 3, size=(9, 12))
    for k in (1, 3, 10, 12):
        got = M.mixture_topk_components(component, cost, k=k)
        mixed, distinct = naive_topk_components(component, cost, k)
        assert got["k"] == k and got["mixed_share"] == pytest.approx(mixed) and got["distinct_mean"] == distinct
    assert M.mixture_topk_components(component, cost, k=1) == {"k": 1, "mixed_share": 0.0, "distinct_mean": 1.0}
    # only the top-k entries are read: -1 elsewhere gives the same answer
    top = M.topk_videos(cost, 4)
    sparse = np.full_like(component, -1)
    np.put_along_axis(sparse, top, np.take_along_axis(component, top, axis=1), axis=1)
    assert M.mixture_topk_components(sparse, cost, 4) == M.mixture_topk_components(component, cost, 4)
    with pytest.raises(ConfigError):
        M.mixture_topk_components(sparse, cost, 5)
    with pytest.raises(ConfigError):
        M.mixture_topk_components(component[:, :5], cost)


def test_subspace_share_against_the_projector() -> None:
    rng = np.random.default_rng(4)
    x, u = rng.normal(size=(20, 8)), rng.normal(size=(8, 3))
    xc = x - x.mean(axis=0)
    proj = u @ np.linalg.pinv(u)  # (D, D) orthogonal projector on span(U)
    got = M.subspace_share(x, u)
    assert got["share"] == pytest.approx(np.linalg.norm(xc @ proj) ** 2 / np.linalg.norm(xc) ** 2, rel=1e-10)
    assert got["chance"] == 3 / 8 and got["rank"] == 3
    uncentred = M.subspace_share(x, u, center=False)["share"]
    assert uncentred == pytest.approx(np.linalg.norm(x @ proj) ** 2 / np.linalg.norm(x) ** 2, rel=1e-10)
    # a spread inside span(U) is all in it; one orthogonal to it none; a rank-deficient U counts its true rank
    assert M.subspace_share(rng.normal(size=(5, 3)) @ u.T, u)["share"] == pytest.approx(1.0)
    ortho = (np.eye(8) - proj) @ rng.normal(size=(8, 6))
    assert M.subspace_share(ortho.T, u)["share"] == pytest.approx(0.0, abs=1e-12)
    deficient = np.concatenate([u[:, :2], u[:, :1] + u[:, 1:2]], axis=1)
    assert M.subspace_share(x, deficient)["rank"] == 2 and M.subspace_share(x, deficient)["chance"] == 2 / 8
    # chance: an isotropic spread puts R / D of its square in span(U)
    iso = M.subspace_share(rng.normal(size=(20000, 8)), u)["share"]
    assert iso == pytest.approx(3 / 8, abs=0.01)
    assert math.isnan(M.subspace_share(x[:1], u)["share"])  # one vector, centred: no spread
    with pytest.raises(ConfigError):
        M.subspace_share(x, u[:5])
