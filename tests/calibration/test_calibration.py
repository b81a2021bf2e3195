"""The calibration package: features against loops, the numpy maps against scikit-learn, the file, the sets and
the risk decision against the metrics they are built from, and coverage on held-out queries."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.calibration import (
    Calibration,
    UncertaintyRequest,
    assess,
    calibrate_costs,
    conformal_threshold,
    first_hit_outcomes,
    query_features,
    read_calibration,
    true_video_scores,
    write_calibration,
)
from dab_pipeline.calibration.fit import fit_map
from dab_pipeline.core.errors import ConfigError
from dab_pipeline.metrics.conformal import (
    conformal_quantile,
    conformal_scores,
    cost_softmax,
    video_weights,
    weighted_quantile,
)
from dab_pipeline.metrics.risk import learn_then_test, risk_test_order

from .synthetic import synthetic_costs

pytest.importorskip("sklearn")


def test_features_match_a_loop() -> None:
    cost, _, tv = synthetic_costs(30, 12, seed=1)
    f = query_features(cost, 2.0, 4, tv)
    assert f.names == ("margin", "gap_2", "gap_3", "softmax_first", "softmax_first_k", "log_text_var")
    for i, row in enumerate(cost.astype(np.float64)):
        s = sorted(row)
        e = np.exp(-(row - row.min()) / 2.0)
        p = np.sort(e / e.sum())[::-1]
        want = [s[1] - s[0], s[2] - s[1], s[3] - s[2], p[0], p[:4].sum(), np.log(tv[i])]
        np.testing.assert_allclose(f.values[i], want, rtol=1e-9, atol=1e-12)


def test_features_of_a_shortlist_ignore_unscored_videos() -> None:
    row = np.array([[1.0, np.inf, 2.0, np.inf, 4.0]])
    f = query_features(row, 1.0, 5)
    np.testing.assert_allclose(f.column("margin"), [1.0])
    np.testing.assert_allclose(f.values[0, 1:4], [2.0, 0.0, 0.0])  # the missing 4th and 5th costs: gaps of 0
    assert f.column("softmax_first_k")[0] == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="at least 2 scored videos"):
        query_features(np.array([[1.0, np.inf, np.inf]]), 1.0)


def test_outcomes_give_no_credit_for_a_tie() -> None:
    cost = np.array([[1.0, 1.0, 3.0], [0.5, 2.0, 1.0], [3.0, 2.0, 1.0]])
    first, first_k = first_hit_outcomes(cost, np.array([0, 0, 0]), first_k=2)
    assert first.tolist() == [False, True, False] and first_k.tolist() == [True, True, False]


def test_numpy_maps_equal_scikit_learns_own_predictions() -> None:
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression

    cost, gt, tv = synthetic_costs(300, 20, seed=2)
    f = query_features(cost, 1.0, 5, tv)
    y, _ = first_hit_outcomes(cost, gt)
    m = fit_map(f, y, "logistic")
    x = f.values
    mean, scale = x.mean(0), x.std(0)
    ref = LogisticRegression(C=1.0, max_iter=2000).fit((x - mean) / scale, y)
    np.testing.assert_allclose(m.predict(f), ref.predict_proba((x - mean) / scale)[:, 1], rtol=1e-9, atol=1e-12)
    iso = fit_map(f, y, "isotonic")
    ref_iso = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(f.column("margin"), y)
    probe = np.linspace(-1, 6, 50)
    g = type(f)(("margin",), probe[:, None])
    np.testing.assert_allclose(iso.predict(g), ref_iso.predict(probe), rtol=1e-12, atol=1e-12)


def test_one_class_outcomes_give_a_constant_map() -> None:
    cost, _, _ = synthetic_costs(10, 5)
    f = query_features(cost, 1.0)
    m = fit_map(f, np.ones(10, bool), "logistic")
    np.testing.assert_allclose(m.predict(f), 10.5 / 11)


def _cal(n: int = 400, v: int = 30, seed: int = 0, **kw) -> tuple[Calibration, tuple]:
    cost, gt, tv = synthetic_costs(n, v, seed)
    return calibrate_costs(cost, gt, 1.0, tv, seed=seed, **kw), (cost, gt, tv)


def test_calibration_splits_fits_and_survives_its_file(tmp_path: Path) -> None:
    cal, (cost, gt, tv) = _cal(101)
    held = np.array(cal.held_out, bool)
    assert cal.fit_queries + cal.check_queries == cal.queries == 101 and held.sum() == cal.check_queries
    assert not set(gt[held]) & set(gt[~held])  # the halves split the videos: no video in both
    assert abs(len(set(gt[held])) - len(set(gt[~held]))) <= 1 and cal.videos == len(set(gt))
    assert set(cal.conformal) == {"lac", "aps", "raps", "normalized"}
    want = true_video_scores(cost, gt, 1.0, tv)
    for name, values in cal.conformal.items():  # each query's own score, in query order
        np.testing.assert_allclose(values, want[name])
    np.testing.assert_allclose(cal.weights, [1 / (gt == g).sum() for g in gt])
    assert len(cal.risk["confidence"]) == cal.check_queries and cal.risk["video"] == gt[held].tolist()
    assert set(cal.report["first"]) == {"calibrated", "margin_sigmoid", "softmax"}
    path = write_calibration(tmp_path / "calibration.json", cal)
    back = read_calibration(path)
    assert back == cal
    # a version 2 file (issue 62: k, and the features p_first, p_first_k) reads as the same calibration
    old = json.loads(path.read_text()) | {"version": 2}
    old["k"] = old.pop("first_k")
    for m in old["maps"].values():
        m["features"] = [{"softmax_first": "p_first", "softmax_first_k": "p_first_k"}.get(f, f) for f in m["features"]]
    path.write_text(json.dumps(old))
    assert read_calibration(path) == cal
    np.testing.assert_array_equal(assess(back, [cost[0]], tv[:1])[0].p_first, assess(cal, [cost[0]], tv[:1])[0].p_first)
    without = calibrate_costs(cost, gt, 1.0, None)
    assert "normalized" not in without.conformal and "log_text_var" not in without.maps["first"].features


def test_the_file_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist: make it with `dab calibrate"):
        read_calibration(tmp_path / "calibration.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not readable JSON"):
        read_calibration(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text(json.dumps({"version": 99}))
    with pytest.raises(ConfigError, match="version 3"):
        read_calibration(tmp_path / "old.json")
    (tmp_path / "cut.json").write_text(json.dumps({"version": 2, "maps": {}}))
    with pytest.raises(ConfigError, match="malformed"):
        read_calibration(tmp_path / "cut.json")


@pytest.mark.parametrize("score", ["lac", "aps", "raps", "normalized"])
def test_sets_are_those_of_the_conformal_functions(score: str) -> None:
    cal, (cost, gt, tv) = _cal(200)
    new_cost, _, new_tv = synthetic_costs(20, 30, seed=9)
    req = UncertaintyRequest(coverage=0.8, score=score)
    got = assess(cal, list(new_cost), new_tv, req)
    p = cost_softmax(cost, 1.0)
    ref_cal = conformal_scores(p, score, difficulty=tv)[np.arange(len(gt)), gt]
    qhat = weighted_quantile(ref_cal, 0.2, video_weights(gt))  # every query weighted by 1 / its video's captions
    new_s = conformal_scores(cost_softmax(new_cost, 1.0), score, difficulty=new_tv)
    for u, s_row, row in zip(got, new_s, new_cost):
        ref = set(np.flatnonzero(s_row <= qhat).tolist()) | {int(np.argmin(row))}  # never without the first hit
        assert sorted(u.set_indices.tolist()) == sorted(ref) and u.set_scope == "marginal"
        assert list(row[u.set_indices]) == sorted(row[u.set_indices])  # best first


def test_sets_cover_held_out_queries_and_grow_with_coverage() -> None:
    """200 random halves of one gallery's queries: the mean coverage is within two standard errors of
    [1 - alpha, 1 - alpha + 1/(n + 1)]."""
    cost, gt, tv = synthetic_costs(400, 30, seed=3)
    for alpha in (0.1, 0.2):
        covered, sizes = [], []
        for split in range(200):
            perm = np.random.default_rng(split).permutation(400)
            a, b = perm[:200], perm[200:]
            p = cost_softmax(cost, 1.0)
            s = conformal_scores(p, "lac")
            qhat = conformal_quantile(s[a, gt[a]], alpha)
            inside = s[b] <= qhat  # (200, V)
            covered.append(inside[np.arange(200), gt[b]].mean())
            sizes.append(inside.sum(1).mean())
        m, se = np.mean(covered), np.std(covered) / np.sqrt(len(covered))
        assert 1 - alpha - 2 * se <= m <= 1 - alpha + 1 / 201 + 2 * se
    cal, _ = _cal(200)
    small = assess(cal, list(cost[:30]), tv[:30], UncertaintyRequest(coverage=0.5))
    large = assess(cal, list(cost[:30]), tv[:30], UncertaintyRequest(coverage=0.95))
    for s, g in zip(small, large):
        assert set(s.set_indices.tolist()) <= set(g.set_indices.tolist())


def test_the_risk_decision_is_learn_then_test_on_the_held_out_half() -> None:
    cal, (cost, _, tv) = _cal(2000, 20, video=np.arange(2000) // 2)  # two captions a video
    req = UncertaintyRequest(max_risk=0.2, delta=0.1)
    conf, ok = np.array(cal.risk["confidence"]), np.array(cal.risk["correct"], bool)
    fit = cal.risk["fit"]
    order = risk_test_order(
        np.array(fit["confidence"]), np.array(fit["correct"], bool), np.array(fit["video"]), 0.2, 0.1
    )
    want = learn_then_test(conf, ok, 0.2, 0.1, video=np.array(cal.risk["video"]), test="wsr", order=order)
    got = assess(cal, list(cost[:50]), tv[:50], req)
    assert want.threshold is not None and 0 < want.answered < want.queries
    for u in got:
        assert u.risk == want and u.answered == (u.p_first >= want.threshold)
    assert any(u.answered for u in got) and not all(u.answered for u in got)


def test_requests_are_checked_in_one_line() -> None:
    for bad in (0, 1, 1.5, -0.1, float("nan"), "abc"):
        with pytest.raises(ConfigError, match="coverage"):
            UncertaintyRequest(coverage=bad)
        with pytest.raises(ConfigError, match="max-risk"):
            UncertaintyRequest(max_risk=bad)
    with pytest.raises(ConfigError, match="delta"):
        UncertaintyRequest(max_risk=0.1, delta=1.0)
    with pytest.raises(ConfigError, match=r"coverage 1e-300 is too small to mean anything"):
        UncertaintyRequest(coverage=1e-300)  # 1 - coverage rounds to 1 (issue 59, item 8)
    with pytest.raises(ConfigError, match="valid: lac, aps, raps, normalized"):
        UncertaintyRequest(coverage=0.9, score="top")
    cal, _ = _cal(20, 10)
    with pytest.raises(
        ConfigError, match=f"{cal.videos} calibration videos are too few for coverage 0.99: at least 99"
    ):
        conformal_threshold(cal, 0.99, "lac")
    cost, gt, _ = synthetic_costs(20, 10)
    plain = calibrate_costs(cost, gt, 1.0, None)
    with pytest.raises(ConfigError, match="no 'normalized' score .*text variance"):
        conformal_threshold(plain, 0.9, "normalized")
    with pytest.raises(ConfigError, match="3 validation queries of 2 videos are too few"):
        calibrate_costs(cost[:3], gt[:3], 1.0)


def test_a_match_in_the_first_k_is_never_less_likely_than_first() -> None:
    cal, (cost, _, tv) = _cal(12, 10)  # six fitted queries: two maps fitted apart disagree
    got = assess(cal, list(cost), tv)
    assert all(u.p_first_k >= u.p_first for u in got)
    # by construction, not by a patch (issue 61, item 2): P(first k) = P(first) + (1 - P(first)) P(2nd..kth | not
    # first), the second map fitted on the queries whose first hit is wrong
    feats = query_features(cost, 1.0, cal.first_k, tv, cal.k0)
    p1, cond = cal.maps["first"].predict(feats), cal.maps["first_k"].predict(feats)
    np.testing.assert_allclose([u.p_first_k for u in got], p1 + (1 - p1) * cond, rtol=1e-12)


def test_p_first_is_the_same_at_any_shortlist_that_holds_the_first_k0() -> None:
    """issue 60, item 3: every feature reads the first k0 costs, so a shortlist holding the exhaustive first k0
    videos (and any others) gives the exhaustive features and P(first), whatever its size; one shorter does not."""
    cal, (cost, gt, tv) = _cal(400, 60, method="logistic")
    rng = np.random.default_rng(0)
    for row, v in zip(cost[:20].astype(np.float64), tv[:20]):
        order = np.argsort(row)
        exhaustive = assess(cal, [row], np.array([v]))[0]
        for keep in (cal.k0, cal.k0 + 5, 40):
            short = np.full_like(row, np.inf)
            chosen = np.concatenate([order[: cal.k0], rng.choice(order[cal.k0 :], keep - cal.k0, replace=False)])
            short[chosen] = row[chosen]
            got = assess(cal, [short], np.array([v]))[0]
            assert got.p_first == pytest.approx(exhaustive.p_first, abs=1e-12)
            assert got.p_first_k == pytest.approx(exhaustive.p_first_k, abs=1e-12)
        three = np.full_like(row, np.inf)
        three[order[:3]] = row[order[:3]]
        assert assess(cal, [three], np.array([v]))[0].p_first > exhaustive.p_first  # reads high over 3 videos


def test_a_shortlist_not_calibrated_through_holds_nothing_and_decides_nothing() -> None:
    """A search cannot check that its shortlist holds the exhaustive first k0 videos, so no shortlist the run was
    not calibrated through keeps its probabilities, its set or a risk decision (the demo's "a large red circle"
    read 0.21 over a shortlist of 30 that missed the exhaustive first hit, and was said calibrated and decided):
    not even one that does hold them, whose numbers are the exhaustive ones. The reason says how to get calibrated
    numbers: search every video (a cosine shortlist: the whole split's costs), or calibrate through the index (an
    index's: its K videos' costs only); a run calibrated through its index keeps everything."""
    cal, (cost, _, tv) = _cal(2000, 60, video=np.arange(2000) // 2, method="logistic")
    cal = replace(cal, provenance={"gallery": {"videos": 60}})
    req = UncertaintyRequest(coverage=0.8, max_risk=0.2, delta=0.1)
    row, v = cost[0].astype(np.float64), tv[:1]
    order = np.argsort(row)
    (full,) = assess(cal, [row], v, req)
    assert full.caveat is None and full.probabilities_hold and full.answered in (True, False)
    for keep in (cal.k0 - 5, cal.k0, 30):
        cosine = np.full_like(row, np.inf)
        cosine[order[:keep]] = row[order[:keep]]  # the exhaustive first videos: a shortlist as good as it gets
        index = row[order[:keep]]  # an index's shortlist: its K videos' costs alone
        for short, fix in ((cosine, "search every video"), (index, f"dab calibrate --index INDEX --shortlist {keep}")):
            (u,) = assess(cal, [short], v, req)
            assert u.caveat_kind == "shortlist" and not u.probabilities_hold, (keep, u.caveat_kind)
            assert u.answered is None and u.risk is not None, keep  # asked, not decided
            assert u.caveat.startswith(f"a shortlist of {keep} of the 60 videos calibrated on"), u.caveat
            assert u.caveat.endswith(fix) or f"({fix};" in u.caveat, u.caveat
            assert ("fewer than the 20" in u.caveat) == (keep < cal.k0), u.caveat
    # a calibration that did not record its gallery: a cosine shortlist is still one (its unscored videos)
    (u,) = assess(replace(cal, provenance={}), [cosine], v, req)
    assert u.caveat_kind == "shortlist" and u.answered is None
    # calibrated through the index it searches with (a search refuses any other): everything holds
    through = replace(cal, provenance={"gallery": {"videos": 60}, "index": {"shortlist": 30, "nprobe": 1}})
    (u,) = assess(through, [index], v, req)
    assert u.caveat is None and u.probabilities_hold and u.answered in (True, False) and u.set_indices is not None


def test_the_map_is_chosen_on_the_fitting_half_alone() -> None:
    """issue 60, item 4: auto picks each target's map by cross-validated log loss over folds of the fitted half's
    videos; the held-out half never enters the choice (changing its outcomes changes nothing chosen)."""
    from dab_pipeline.calibration.fit import choose_map

    cost, gt, tv = synthetic_costs(400, 30, seed=8)
    cal = calibrate_costs(cost, gt, 1.0, tv)
    sel = cal.report["selection"]
    assert sel["first"]["chosen"] == min(sel["first"]["cv_log_loss"], key=sel["first"]["cv_log_loss"].get)
    fit = ~np.array(cal.held_out, bool)
    feats = query_features(cost, 1.0, cal.first_k, tv, cal.k0)
    first, _ = first_hit_outcomes(cost, gt, cal.first_k)
    kind, losses = choose_map(feats.rows(np.flatnonzero(fit)), first[fit], gt[fit], "first", cal.first_k, 1.0)
    assert kind == sel["first"]["chosen"] and losses == pytest.approx(sel["first"]["cv_log_loss"])
    # the held-out half's costs scrambled: the same choice, the same losses
    scrambled = cost.copy()
    scrambled[~fit] = scrambled[~fit][:, ::-1]
    again = calibrate_costs(scrambled, gt, 1.0, tv)
    assert again.report["selection"] == cal.report["selection"]
    assert cal.report["top_bins"]["calibrated"] == [] or all(
        b["count"] >= 100 for b in cal.report["top_bins"]["calibrated"]
    )


def test_end_to_end_coverage_through_a_lossy_first_stage() -> None:
    """issue 60, item 1: the queries scored through a first stage that misses some matches (a noisy shortlist of
    K), a missed match outside every set (+inf): over random halves by video, the sets built over each query's
    shortlist hold its match for at least 1 - alpha of queries (within two standard errors), where calibrating on
    exhaustive costs does not."""
    from dab_pipeline.testing import clustered_gallery

    g = clustered_gallery(400, seed=9)
    cost, gt = g["cost"], g["gt"]
    rng = np.random.default_rng(1)
    proxy = cost + rng.normal(0, 0.5, cost.shape)  # the first stage ranks by a noisy cost
    short = np.full_like(cost, np.inf)
    keep = np.argsort(proxy, axis=1)[:, :150]  # (Q, 150) of 400 videos
    np.put_along_axis(short, keep, np.take_along_axis(cost, keep, axis=1), axis=1)
    missed = ~np.isfinite(short[np.arange(len(gt)), gt])
    assert 0.05 < missed.mean() < 0.2  # lossy: the first stage's recall at K = 150 is below 1
    own_through = true_video_scores(short, gt, 1.0, None)["aps"]  # +inf where missed
    own_exhaustive = true_video_scores(cost, gt, 1.0, None)["aps"]
    s_short = conformal_scores(cost_softmax(short, 1.0), "aps")  # (Q, V): the search's own scores
    w = video_weights(gt)
    alpha, covered, naive = 0.3, [], []
    for split in range(100):
        videos = np.random.default_rng(split).permutation(np.unique(gt))
        cal = np.isin(gt, videos[:200])
        ev = np.flatnonzero(~cal)
        for own, out in ((own_through, covered), (own_exhaustive, naive)):
            q = weighted_quantile(own[cal], alpha, w[cal])
            inside = (s_short[ev] <= q) & np.isfinite(short[ev])  # a set holds shortlisted videos only
            out.append(np.average(inside[np.arange(len(ev)), gt[ev]], weights=w[ev]))
    m, se = np.mean(covered), np.std(covered) / 10
    assert m >= 1 - alpha - 2 * se, (m, se)
    assert np.mean(naive) < 1 - alpha - 0.01  # calibrated on every video, the same sets miss
