"""benchmarks/claims.py's text diagnostics (issue 36): log det Sigma_t, its calibration, and whether U spans the
ambiguity of the generic captions, on a tiny low-rank run with a hand-made truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline import metrics as M
from dab_pipeline.runs.load import load_run
from dab_pipeline.stages.train import run_train
from dab_pipeline.store import open_store
from dab_pipeline.testing import random_store

from ..helpers.benchmarks import load_benchmark
from ..helpers.training import train_config


def _claims():
    return load_benchmark("claims")


@pytest.fixture(scope="module")
def lowrank_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("claims")
    store = random_store(root / "store.h5")
    run_train(train_config(store, root / "run", "model.variant=prob", "model.covariance=lowrank:2", "epochs=1"))
    return store, root / "run"


def _truth(C):
    """The test split's 10 captions (5 videos): the even ones generic, true of 2 to 5 videos; the odd ones of their
    own video alone."""
    source = np.repeat(np.arange(5), 2)
    relevant = np.eye(5, dtype=bool)[source]  # (10, 5)
    for q, n in zip(range(0, 10, 2), (2, 3, 4, 5, 5)):
        relevant[q, (source[q] + np.arange(n)) % 5] = True
    levels = np.array(["generic", "video"] * 5)
    return C.Truth(levels=levels, relevant=relevant, source=source)


def _naive_u_span(model, text, frames, mask, q: int, videos: np.ndarray) -> float:
    """One (caption, video) pair at a time; the projector on span(U) as U pinv(U)."""
    with torch.no_grad():
        ts, vs = model.encode_text(text[q : q + 1]), model.encode_video(frames, mask)
        means = np.stack(
            [
                model.pair_terms(ts, vs.select(torch.tensor([v])), grid=True).video_mu[0, 0].double().numpy()
                for v in videos
            ]
        )  # (n, D)
        u = ts.factor[0].double().numpy()  # (D, R)
    spread = means - means.mean(axis=0)
    proj = u @ np.linalg.pinv(u)  # (D, D)
    return float(np.linalg.norm(spread @ proj) ** 2 / np.linalg.norm(spread) ** 2)


def test_score_run_gives_log_det_and_the_u_span_of_generic_captions(
    lowrank_run, monkeypatch: pytest.MonkeyPatch
) -> None:
    C = _claims()
    store, run = lowrank_run
    t = _truth(C)
    cost, extras = C.score_run(run, store, "test", t)
    assert cost.shape == (10, 5) and np.isfinite(cost).all()
    model = load_run(run).model
    with open_store(store) as st:
        sp = st.load_split("test")
        text, frames, mask = (torch.as_tensor(np.asarray(a)) for a in (sp.text, sp.frames, sp.frame_mask))
    with torch.no_grad():
        ts = model.encode_text(text)
    logdet = M.text_logdet(ts.logvar.double().numpy(), ts.factor.double().numpy())
    np.testing.assert_allclose(extras["text_logdet"], logdet, rtol=1e-12)
    assert np.all(extras["text_logdet"] > ts.logvar.double().sum(dim=1).numpy())  # U U^T adds to the determinant
    np.testing.assert_allclose(extras["text_var"], ts.logvar.exp().mean(dim=1).numpy(), rtol=1e-6)
    # every generic caption (all true of 2 videos or more), in order; chance = R / D
    assert extras["u_span"].shape == (5,) and np.all((extras["u_span"] >= 0) & (extras["u_span"] <= 1))
    assert extras["u_span_chance"] == pytest.approx([2 / 16] * 5)
    for i, q in enumerate(range(0, 10, 2)):
        naive = _naive_u_span(model, text, frames, mask, q, np.flatnonzero(t.relevant[q]))
        assert extras["u_span"][i] == pytest.approx(naive, rel=1e-6)
    # the samples are capped (seeded): 2 captions of 2 relevant videos each
    monkeypatch.setattr(C, "U_SPAN_CAPTIONS", 2)
    monkeypatch.setattr(C, "U_SPAN_VIDEOS", 2)
    _, capped = C.score_run(run, store, "test", t)
    assert capped["u_span"].shape == (2,)
    _, again = C.score_run(run, store, "test", t)
    np.testing.assert_array_equal(capped["u_span"], again["u_span"])  # the same seeded computation: bit-equal


def test_an_old_cache_gets_the_text_diagnostics_and_the_table_shows_them(
    lowrank_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    C = _claims()
    store, run = lowrank_run
    t = _truth(C)
    fresh = C.run_queries(run, store, "test", t, tmp_path)
    assert {"text_var", "text_logdet", "u_span", "u_span_chance"} <= set(fresh)
    # a cache written before issue 36: the costs' results and text_var alone; upgraded without scoring again
    old = {k: v for k, v in fresh.items() if k not in ("text_logdet", "u_span", "u_span_chance")}
    np.savez_compressed(tmp_path / "claims-test.npz", **old)
    monkeypatch.setattr(C, "score_run", lambda *a, **k: pytest.fail("a cached run is not scored again"))
    upgraded = C.run_queries(run, store, "test", t, tmp_path)
    assert set(upgraded) == set(fresh)
    for key in fresh:
        np.testing.assert_allclose(upgraded[key], fresh[key], rtol=1e-12)
    assert set(dict(np.load(tmp_path / "claims-test.npz"))) == set(fresh)
    row = C.claim_row([upgraded], t)
    assert row["logdet calibration"]["mean"] == pytest.approx(M.spearman(fresh["text_logdet"], np.log(t.n_relevant)))
    assert row["U span"]["mean"] == pytest.approx(fresh["u_span"].mean()) and row["U span chance"]["mean"] == 0.125
    table = C.claim_markdown({"lowrank": row}, {}, "lowrank")
    assert "| logdet calibration | U span | U span chance |" in table
    # rows without them (a cosine run): the columns are left out, var calibration stays
    cosine = C.claim_row([{k: v for k, v in fresh.items() if k in C.PER_QUERY + ("margin",)}], t)
    table = C.claim_markdown({"xpool": cosine}, {}, "xpool")
    assert "var calibration" in table and "logdet" not in table and "U span" not in table
