"""benchmarks/e2e_coverage.py (issue 60, item 5) on a clustered synthetic gallery with a lossy first stage: the
end-to-end coverage over random halves by video holds at the K it chooses, a shortlist too short for the coverage is
refused (an infinite quantile), the whole gallery as a shortlist is the exhaustive search; and the distractor store
keeps the demo's videos and queries and adds spliced training videos."""

from __future__ import annotations

import numpy as np

from dab_pipeline.store import open_store
from dab_pipeline.testing import clustered_gallery, random_store

from ..helpers.benchmarks import load_benchmark


def _lossy_gallery(bench, seed: int = 3):
    g = clustered_gallery(200, seed=seed)
    cost, gt = g["cost"].copy(), g["gt"]
    cost[np.arange(len(gt)), gt] -= 1.5  # matches the full cost ranks first a third of the time, in the first 100 99 %
    noisy = cost + np.random.default_rng(seed).normal(0.0, 1.0, cost.shape)  # a first stage that misses 20 % at K = 20
    order = np.argsort(noisy, axis=1, kind="stable")  # (Q, V)
    sl = np.take_along_axis(cost, order, axis=1)
    return bench.Gallery("synthetic", gt, gt, order, sl, cost, cost.shape[1], 1.0)


def test_the_chosen_shortlist_covers_end_to_end_and_a_short_one_is_refused() -> None:
    bench = load_benchmark("e2e_coverage")
    g = _lossy_gallery(bench)
    rows = bench.coverage_rows(g, [20, 50, 100, 200], splits=20)
    for alpha in ("0.2", "0.1"):
        r = rows[alpha]
        for key in ("exhaustive", "K chosen"):
            assert r[key]["holds"], (alpha, key, r[key])
            assert r[key]["coverage"] >= 1 - float(alpha) - 2 * r[key]["se"]
        assert r["K = 200"]["coverage"] == r["exhaustive"]["coverage"]  # every video: the exhaustive search
        assert r["K = 200"]["size"] == r["exhaustive"]["size"]
    # at 0.1 the first 20 miss more matches than the quantile can leave out: every half refuses
    assert rows["0.1"]["K = 20"]["refused_share"] == 1.0 and rows["0.1"]["K = 20"]["coverage"] is None
    assert rows["0.1"]["K chosen"]["k"][0] > 20 and 0 < rows["0.1"]["K chosen"]["saved"] < 1


def test_the_distractor_store_keeps_the_demo_and_splices_training_videos(tmp_path) -> None:
    bench = load_benchmark("e2e_coverage")
    demo = random_store(
        tmp_path / "demo.h5", n_videos=12, dim=8, frames=12, splits=("train",) * 6 + ("val",) * 3 + ("test",) * 3
    )
    out = bench.distractor_store(demo, tmp_path / "big.h5", 50)
    with open_store(demo) as a, open_store(out) as b:
        assert b.num_videos == a.num_videos + 50
        assert (b.video_split[: a.num_videos] == a.video_split).all()
        assert (b.video_split[a.num_videos :] == "distractor").all()
        kept = b.load_split("all")
        assert np.allclose(kept.frames[: a.num_videos], a.load_split("all").frames, atol=1e-2)
        val, test = a.load_split("val"), a.load_split("test")
        assert len(b.load_split("val").caption_ids) == len(val.caption_ids)
        assert len(b.load_split("test").caption_ids) == len(test.caption_ids)
        train = a.load_split("train").frames.reshape(-1, 8)  # (N * F, D) every training frame
        spliced = kept.frames[a.num_videos :].reshape(-1, 8)  # (50 * F, D)
        nearest = np.abs(spliced[:, None] - train[None]).max(-1).min(1)  # each frame's distance to a training frame
        assert nearest.max() < 0.5 * float(train.std())  # a training frame plus noise, not a new one
