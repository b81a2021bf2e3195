"""dab calibrate end to end on a tiny store and a hand-made run, and what search and serve do with its file:
probabilities, conformal sets, risk decisions, and every refusal in one line with nothing written."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.calibration import CALIBRATION_FILE, UncertaintyRequest, read_calibration
from dab_pipeline.core.errors import ConfigError, StoreError
from dab_pipeline.runs.run_folder import RunFolder
from dab_pipeline.search import Searcher
from dab_pipeline.stages.calibrate import CalibrateConfig, run_calibrate
from dab_pipeline.stages.search import SearchConfig, run_search

from ..helpers.models import hand_made_run
from ..helpers.runner import invoke
from ..helpers.stores import CALIBRATION_CAPTIONS, CALIBRATION_SPLITS, SEARCH_CAPTIONS, text_store

pytest.importorskip("sklearn")

VAL, SPLITS = CALIBRATION_CAPTIONS, CALIBRATION_SPLITS


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("calibrate")
    store = text_store(root / "store.h5", SEARCH_CAPTIONS + VAL, frames=4, splits=SPLITS)
    run, _ = hand_made_run(root / "run", store, "dab")
    plain, _ = hand_made_run(root / "xpool", store, "xpool")
    return {"store": store, "run": run, "xpool": plain, "root": root}


def test_calibrate_writes_its_file_with_what_it_was_made_for(world: dict) -> None:
    cal = run_calibrate(CalibrateConfig(run=world["run"], device="cpu"))
    back = read_calibration(world["run"] / CALIBRATION_FILE)
    assert back == cal
    assert (cal.queries, cal.fit_queries, cal.check_queries) == (40, 20, 20)
    assert cal.provenance["split"] == "val" and cal.gallery["split"] == "val" and cal.gallery["videos"] == 40
    assert len(cal.provenance["checkpoint_sha256"]) == 64 and "scikit-learn" in cal.provenance["libraries"]
    assert "normalized" in cal.conformal and cal.method == "auto" and cal.k0 == 20
    sel = cal.report["selection"]["first"]  # the map of least cross-validated log loss (issue 60, item 4)
    assert set(sel["cv_log_loss"]) == {"softmax", "temperature", "isotonic", "logistic"}
    assert sel["chosen"] == min(sel["cv_log_loss"], key=sel["cv_log_loss"].get) == cal.maps["first"].kind
    forced = run_calibrate(CalibrateConfig(run=world["run"], device="cpu", method="logistic"))
    assert "log_text_var" in forced.maps["first"].features and forced.report["selection"]["first"]["cv_log_loss"] == {}


def test_a_cosine_run_has_no_variance_score(world: dict) -> None:
    cal = run_calibrate(CalibrateConfig(run=world["xpool"], device="cpu", method="isotonic"))
    assert "normalized" not in cal.conformal and cal.maps["first"].kind == "isotonic"


def test_the_cli_prints_held_out_figures(world: dict) -> None:
    out = invoke(["calibrate", "--run", str(world["run"]), "--device", "cpu", "--quiet"])
    assert out.exit_code == 0, out.output
    assert "20 held out" in out.output and "P(the first hit is a match)" in out.output and "ECE" in out.output
    out = invoke(["calibrate", "--run", str(world["run"]), "--device", "cpu", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert set(data["report"]["first"]) == {"calibrated", "margin_sigmoid", "softmax"}


def test_search_gives_probabilities_sets_and_decisions(world: dict) -> None:
    run_calibrate(CalibrateConfig(run=world["run"], device="cpu", gallery="all"))
    warned: list[str] = []
    plain = run_search(
        SearchConfig(world["run"], world["store"], [SEARCH_CAPTIONS[0]], k=3, split="all", device="cpu")
    )[0]
    assert plain.uncertainty is not None and 0 <= plain.uncertainty.p_first <= 1 and plain.coverage_set is None
    res = run_search(
        SearchConfig(
            world["run"],
            world["store"],
            [SEARCH_CAPTIONS[0], "a blue car"],
            k=3,
            split="all",
            device="cpu",
            coverage=0.8,
            max_risk=0.3,
        ),
        warn=warned.append,
    )
    assert warned == []  # the gallery searched is the one calibrated on
    for r in res:
        ids = [h.video_id for h in r.coverage_set]
        assert len(ids) == len(set(ids)) and [h.cost for h in r.coverage_set] == sorted(h.cost for h in r.coverage_set)
        assert r.uncertainty.answered in (True, False) and r.uncertainty.risk.alpha == 0.3
    wide = run_search(
        SearchConfig(world["run"], world["store"], ["a blue car"], split="all", device="cpu", coverage=0.95)
    )[0]
    assert {h.video_id for h in res[1].coverage_set} <= {h.video_id for h in wide.coverage_set}
    # another gallery: a set or a risk is refused; the probabilities are shown marked on every result
    with pytest.raises(ConfigError, match="was calibrated on another gallery: search --split all$"):
        run_search(SearchConfig(world["run"], world["store"], ["a blue car"], device="cpu", coverage=0.8))
    other: list[str] = []
    (r,) = run_search(SearchConfig(world["run"], world["store"], ["a blue car"], device="cpu"), warn=other.append)
    assert len(other) == 1 and "calibrated on a gallery of 48 videos" in other[0]
    assert "calibrated on a gallery of 48 videos" in r.uncertainty.caveat


def test_search_cli_prints_and_dumps_the_set(world: dict) -> None:
    run_calibrate(CalibrateConfig(run=world["run"], device="cpu", gallery="all"))
    args = ["search", "--run", str(world["run"]), "--features", str(world["store"]), "--split", "all"]
    out = invoke([*args, "--device", "cpu", "--coverage", "0.9", "--max-risk", "0.2", "a red ball"])
    assert out.exit_code == 0, out.output
    assert "90% conformal set" in out.output and "calibrated: P(first hit is a match)" in out.output
    out = invoke([*args, "--device", "cpu", "--coverage", "0.9", "--json", "a red ball"])
    u = json.loads(out.stdout)[0]["uncertainty"]
    assert u["coverage"] == 0.9 and len(u["set"]) >= 1 and "answered" not in u


def test_refusals_are_one_line_and_write_nothing(world: dict, tmp_path: Path) -> None:
    run, store = world["run"], world["store"]
    for bad in ("0", "1", "1.5", "nan"):
        out = invoke(["search", "--run", str(run), "--features", str(store), "--coverage", bad, "x"])
        assert out.exit_code != 0 and "coverage must be" in out.output and "Traceback" not in out.output
    fresh, _ = hand_made_run(tmp_path / "fresh", store, "dab")
    with pytest.raises(ConfigError, match=r"has no calibration.json: make it with `dab calibrate --run"):
        run_search(SearchConfig(fresh, store, ["a red ball"], device="cpu", coverage=0.9))
    out = invoke(["search", "--run", str(fresh), "--features", str(store), "--max-risk", "0.1", "a red ball"])
    assert out.exit_code != 0 and "dab calibrate" in out.output
    run_calibrate(CalibrateConfig(run=fresh, device="cpu"))
    with pytest.raises(ConfigError, match="40 calibration videos are too few for coverage 0.99: at least 99"):
        run_search(SearchConfig(fresh, store, ["a red ball"], split="val", device="cpu", coverage=0.99))
    # the run trained on after it was calibrated: refused for a request, a warning without one
    folder = RunFolder(fresh)
    state = folder.load_checkpoint(RunFolder.BEST)
    state["epoch"] = 2
    folder.save_checkpoint(RunFolder.BEST, state)
    with pytest.raises(ConfigError, match="made for another checkpoint"):
        run_search(SearchConfig(fresh, store, ["a red ball"], split="val", device="cpu", coverage=0.9))
    said: list[str] = []
    (r,) = run_search(SearchConfig(fresh, store, ["a red ball"], split="val", device="cpu"), warn=said.append)
    assert r.uncertainty is None and any("another checkpoint" in s for s in said)


def test_calibrate_refuses_in_one_line(world: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = world["run"]
    before = (run / CALIBRATION_FILE).read_bytes() if (run / CALIBRATION_FILE).exists() else None
    out = invoke(["calibrate", "--run", str(run), "--split", "nothing", "--device", "cpu"])
    assert out.exit_code != 0 and "no split 'nothing'; splits in this store" in out.output
    assert "Traceback" not in out.output
    out = invoke(["calibrate", "--run", str(run), "--gallery", "test", "--device", "cpu"])
    assert out.exit_code != 0 and "gallery 'test' lacks 40 videos of split 'val'" in out.output
    with pytest.raises(ConfigError, match="not 'all'"):
        run_calibrate(CalibrateConfig(run=run, split="all", device="cpu"))
    with pytest.raises(ConfigError, match="k must be"):
        CalibrateConfig(run=run, first_k=1)
    import builtins

    real = builtins.__import__

    def no_sklearn(name, *a, **kw):
        if name.startswith("sklearn"):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_sklearn)
    with pytest.raises(ConfigError, match=r"pip install 'dab-pipeline\[calibrate\]'"):
        run_calibrate(CalibrateConfig(run=run, device="cpu"))
    monkeypatch.undo()
    after = (run / CALIBRATION_FILE).read_bytes() if (run / CALIBRATION_FILE).exists() else None
    assert after == before


def test_an_empty_validation_split_is_named(tmp_path: Path) -> None:
    store = text_store(tmp_path / "store.h5", SEARCH_CAPTIONS, frames=4)  # test and train only
    run, _ = hand_made_run(tmp_path / "run", store, "dab")
    with pytest.raises(StoreError, match="no split 'val'; splits in this store: test, train"):
        run_calibrate(CalibrateConfig(run=run, device="cpu"))
    assert not (run / CALIBRATION_FILE).exists()


def _count_calls(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> Counter:
    """Every dab_pipeline module's ``names`` wrapped to count their calls (check_alpha by its value and name)."""
    calls: Counter = Counter()
    for name in names:
        for module in [m for n, m in sys.modules.items() if n.startswith("dab_pipeline.") and m is not None]:
            original = vars(module).get(name)
            if callable(original):

                def counted(*a, _f=original, _name=name, **kw):
                    calls[(a[0], a[1] if len(a) > 1 else "alpha") if _name == "check_alpha" else _name] += 1
                    return _f(*a, **kw)

                monkeypatch.setattr(module, name, counted)
    return calls


def test_a_searcher_reassesses_a_result_for_another_request(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """A result answers another request as a search asking it does; and (issue 62, item 2) each value of a
    request is checked once, where the request is made, and one Searcher's searches compute the quantile and the
    Learn-then-Test threshold once."""
    run_calibrate(CalibrateConfig(run=world["run"], device="cpu", gallery="all"))
    calls = _count_calls(monkeypatch, ("check_alpha", "weighted_quantile", "risk_test_order", "learn_then_test"))
    cfg = SearchConfig(world["run"], world["store"], ["a green dog"], 3, coverage=0.9, max_risk=0.3)
    assert cfg.uncertainty is cfg.uncertainty and calls == {
        (0.9, "coverage"): 1,
        (0.3, "max-risk"): 1,
        (0.05, "delta"): 1,
    }
    calls.clear()
    wanted = UncertaintyRequest(coverage=0.9, score="normalized", max_risk=0.3)
    with Searcher(world["run"], world["store"], split="all", device="cpu") as s:
        (r,) = s.search(["a green dog"], 3)
        assert r.coverage_set is None and r.text_var is not None
        s.reassess(r, wanted)
        (direct,) = s.search(["a green dog"], 3, uncertainty=wanted)
        assert [h.video_id for h in r.coverage_set] == [h.video_id for h in direct.coverage_set]
        assert np.isclose(r.uncertainty.p_first, direct.uncertainty.p_first)
        s.search(["a red ball", "a blue car"], 3, uncertainty=wanted)
    # once where the request is made, once where the public conformal_threshold / risk_threshold compute what they
    # cache (an entry of the Python API: a value given there straight is checked too), never per query
    assert calls == {
        (0.9, "coverage"): 2,
        (0.3, "max-risk"): 2,
        (0.05, "delta"): 2,
        "weighted_quantile": 1,
        "risk_test_order": 1,
        "learn_then_test": 1,
    }, calls


@pytest.fixture(scope="module")
def served(world: dict, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from dab_pipeline.stages.serve import ServeSettings, create_app

    root = tmp_path_factory.mktemp("served")
    run, _ = hand_made_run(root / "run", world["store"], "dab")
    uncalibrated, _ = hand_made_run(root / "bare", world["store"], "dab")
    run_calibrate(CalibrateConfig(run=run, device="cpu", gallery="all"))
    searchers = [Searcher(r, world["store"], split="all", device="cpu") for r in (run, uncalibrated)]
    with (
        TestClient(create_app(searchers[0], ServeSettings()), raise_server_exceptions=False) as c,
        TestClient(create_app(searchers[1], ServeSettings()), raise_server_exceptions=False) as bare,
    ):
        yield {"client": c, "bare": bare, "run": run}
    for s in searchers:
        s.close()


def test_serve_answers_with_the_set_dab_search_gives(served: dict, world: dict) -> None:
    c = served["client"]
    r = c.get("/search", params={"q": "a white cat", "k": 3, "coverage": 0.9, "max_risk": 0.3})
    assert r.status_code == 200, r.text
    u = r.json()["uncertainty"]
    (want,) = run_search(
        SearchConfig(
            served["run"], world["store"], ["a white cat"], 3, split="all", device="cpu", coverage=0.9, max_risk=0.3
        )
    )
    assert [h["video_id"] for h in u["set"]] == [h.video_id for h in want.coverage_set]
    assert u["p_first"] == pytest.approx(want.uncertainty.p_first, rel=1e-4, abs=1e-6)
    assert u["answered"] == want.uncertainty.answered and u["risk"]["max_risk"] == 0.3
    health = c.get("/healthz").json()["calibration"]
    assert health == {"queries": 40, "method": "auto", "gallery": {"split": "all", "videos": 48}}
    assert served["bare"].get("/healthz").json()["calibration"] is None
    plain = c.get("/search", params={"q": "a white cat"}).json()["uncertainty"]
    assert "set" not in plain and "answered" not in plain and 0 <= plain["p_first"] <= 1


def test_serve_refuses_requests_it_cannot_meet(served: dict) -> None:
    c = served["client"]
    for params, said in (
        ({"coverage": 1.5}, "coverage must be in (0, 1)"),
        ({"coverage": 0.999}, "too few for coverage 0.999"),
        ({"coverage": 0.9, "score": "top"}, "valid: lac, aps, raps, normalized"),
        ({"max_risk": 0}, "max-risk must be in (0, 1)"),
        ({"coverage": "abc"}, "coverage"),
    ):
        r = c.get("/search", params={"q": "a red ball", **params})
        assert r.status_code in (400, 422) and said in r.json()["error"], (params, r.text)
    r = served["bare"].get("/search", params={"q": "a red ball", "coverage": 0.9})
    assert r.status_code == 400 and "dab calibrate" in r.json()["error"]
    assert "uncertainty" not in served["bare"].get("/search", params={"q": "a red ball"}).json()


def test_the_page_shows_the_set_and_says_a_bad_field(served: dict) -> None:
    c = served["client"]
    page = c.get("/", params={"q": "a red ball", "coverage": "0.9", "max_risk": "0.3"})
    assert page.status_code == 200 and "conformal set" in page.text and "data-answered" in page.text
    bad = c.get("/", params={"q": "a red ball", "coverage": "abc"})
    assert bad.status_code == 400 and "coverage must be a number in (0, 1), got &#39;abc&#39;" in bad.text
    assert 'name="coverage"' not in served["bare"].get("/").text


def test_evaluate_reports_a_calibrated_run_on_its_test_split(world: dict, tmp_path: Path) -> None:
    from dab_pipeline.runs.costfile import CostMatrix, write_costs
    from dab_pipeline.scoring import score_all
    from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate
    from dab_pipeline.store import open_store

    run, model = hand_made_run(tmp_path / "run", world["store"], "dab")
    with open_store(world["store"]) as st:
        val = st.load_split("val")
    res = score_all(model, val.text, val.frames, val.frame_mask, gt=val.caption_video)
    write_costs(
        run / "costs_test.h5",
        CostMatrix(
            cost=res.cost,
            query_ids=val.caption_ids,
            video_ids=val.video_ids,
            gt=val.caption_video,
            extras={"text_var": res.text_var},
        ),
    )
    run_calibrate(CalibrateConfig(run=run, device="cpu"))
    out = run_evaluate(EvaluateConfig(run=run, examples=0))
    cal = out["calibration"]
    first = cal["probabilities"]["first"]
    assert set(first) == {"calibrated", "margin_sigmoid", "softmax"} and cal["test"]["queries"] == 40
    assert 0 <= first["calibrated"]["ece"] <= 1 and cal["sets"]["lac"]["0.9"]["size_mean"] >= 1
    assert cal["first_k"] == 5 and set(cal["probabilities"]["first_k"]) == {"calibrated", "softmax"}
    report = (run / "report.md").read_text()
    assert "**P(a match in the first 5)**" in report, report  # the integer k, not a table printed in its place
    assert "## Calibration (test queries)" in report and (run / "reliability.png").stat().st_size > 0
    # the gallery is the one calibrated on here: no warning that the coverage is not guaranteed
    assert "not* guaranteed here" not in report
    # with overlapping groups: coverage per band and per caption length, at each coverage asked (issue 58)
    run_calibrate(CalibrateConfig(run=run, device="cpu", groups="uncertainty:2,length:2"))
    sets = run_evaluate(EvaluateConfig(run=run, examples=0, plots=False))["calibration"]["sets"]
    groups = sets["aps"]["0.8"]["groups"]
    assert set(groups) == {"uncertainty 1", "uncertainty 2", "length 1", "length 2"}
    assert sum(groups[f"uncertainty {i}"]["queries"] for i in (1, 2)) == 40
    assert groups["length 2"]["queries"] == 0  # every caption here is three words: the second length band is empty
    assert all(0 <= g["coverage"] <= 1 and g["size_mean"] >= 1 for g in groups.values() if g["queries"])
    assert "**Coverage per group** (`--groups uncertainty:2,length:2`" in (run / "report.md").read_text()
    state = RunFolder(run).load_checkpoint(RunFolder.BEST)
    state["epoch"] = 7
    RunFolder(run).save_checkpoint(RunFolder.BEST, state)
    assert "calibration" not in run_evaluate(EvaluateConfig(run=run, examples=0, plots=False))


def test_a_split_the_run_trained_on_and_a_k_past_the_gallery_are_refused(world: dict, tmp_path: Path) -> None:
    """issue 59, items 1 and 5: refused in one line before scoring, nothing written."""
    fresh, _ = hand_made_run(tmp_path / "fresh", world["store"], "dab")
    out = invoke(["calibrate", "--run", str(fresh), "--split", "train", "--device", "cpu"])
    assert out.exit_code != 0 and "is the split" in out.output and "trained on" in out.output, out.output
    assert "Traceback" not in out.output and not (fresh / CALIBRATION_FILE).exists()
    out = invoke(["calibrate", "--run", str(fresh), "--first-k", "40", "--k0", "40", "--device", "cpu"])
    assert out.exit_code != 0 and "--first-k 40 is not below the gallery's 40 videos" in out.output, out.output
    assert not (fresh / CALIBRATION_FILE).exists()
    for bad, said in (
        ("colour:2", "unknown group 'colour'"),
        ("uncertainty:1", "2 to 10 bands"),
        ("length:x", "whole"),
    ):
        out = invoke(["calibrate", "--run", str(fresh), "--groups", bad, "--device", "cpu"])
        assert out.exit_code != 0 and said in out.output and "Traceback" not in out.output, out.output


def test_groups_show_the_band_in_search_the_api_and_the_page(world: dict, tmp_path: Path) -> None:
    """issue 58: a calibration with --groups gives each query its band, and a set calibrated within it where the
    band holds enough videos (else the marginal set, labelled)."""
    run, _ = hand_made_run(tmp_path / "grouped", world["store"], "dab")
    out = invoke(["calibrate", "--run", str(run), "--groups", "uncertainty:2", "--device", "cpu", "--quiet"])
    assert out.exit_code == 0 and "groups uncertainty:2 (Mondrian)" in out.output, out.output
    cal = read_calibration(run / CALIBRATION_FILE)
    assert cal.groups["signal"] == "log_text_var" and len(cal.groups["edges"]["uncertainty"]) == 1
    (r,) = run_search(SearchConfig(run, world["store"], ["a red ball"], split="val", device="cpu", coverage=0.8))
    assert r.uncertainty.group.startswith("uncertainty ") and r.uncertainty.set_scope == "band"
    (wide,) = run_search(SearchConfig(run, world["store"], ["a red ball"], split="val", device="cpu", coverage=0.95))
    assert wide.uncertainty.set_scope == "marginal" and "cannot reach 95%" in wide.uncertainty.scope_note
    args = ["search", "--run", str(run), "--features", str(world["store"]), "--split", "val", "--device", "cpu"]
    out = invoke([*args, "--coverage", "0.8", "a red ball"])
    assert "group: uncertainty" in out.output and "calibrated within this query's band" in out.output, out.output
    u = json.loads(invoke([*args, "--coverage", "0.8", "--json", "a red ball"]).stdout)[0]["uncertainty"]
    assert u["group"] == r.uncertainty.group and u["set_scope"] == "band"
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from dab_pipeline.stages.serve import create_app

    with Searcher(run, world["store"], split="val", device="cpu") as s, TestClient(create_app(s)) as c:
        api = c.get("/search", params={"q": "a red ball", "coverage": 0.8}).json()["uncertainty"]
        assert api["group"] == u["group"] and api["set_scope"] == "band"
        page = c.get("/", params={"q": "a red ball", "coverage": "0.8"}).text
        assert "data-group=" in page and "calibrated within this query's band" in page


def test_a_shortlist_smaller_than_the_calibrated_gallery_is_said_and_decides_nothing(world: dict) -> None:
    """issue 59, item 2: P(first) over a shortlist reads high; every output says so and no risk decision is made.
    Over a shortlist of at least k0 too: the probabilities are the calibrated ones only where it holds the
    exhaustive first k0 videos, which a search cannot check."""
    run, store = world["run"], world["store"]
    run_calibrate(CalibrateConfig(run=run, device="cpu", gallery="all"))
    kw = dict(split="all", device="cpu", coverage=0.8, max_risk=0.3)
    (full,) = run_search(SearchConfig(run, store, ["a red ball"], 3, **kw))
    (short,) = run_search(SearchConfig(run, store, ["a red ball"], 3, shortlist=5, **kw))
    assert full.uncertainty.caveat is None and full.uncertainty.answered in (True, False)
    assert short.uncertainty.caveat == (
        "a shortlist of 5 of the 48 videos calibrated on, fewer than the 20 the probabilities read: search every video"
    )
    assert short.uncertainty.answered is None and not short.uncertainty.probabilities_hold
    # a shortlist of at least k0: nothing holds, nothing is decided (it was said calibrated, and decided)
    (wide,) = run_search(SearchConfig(run, store, ["a red ball"], 3, shortlist=25, **kw))
    assert wide.uncertainty.caveat == (
        "a shortlist of 25 of the 48 videos calibrated on may miss the first 20 the probabilities read: "
        "search every video"
    )
    assert wide.uncertainty.answered is None and not wide.uncertainty.probabilities_hold
    assert wide.uncertainty.caveat_kind == "shortlist"
    args = ["search", "--run", str(run), "--features", str(store), "--split", "all", "--device", "cpu"]
    out = invoke([*args, "--shortlist", "5", "--max-risk", "0.3", "a red ball"])
    text = " ".join(out.output.split())
    assert "not calibrated here (a shortlist): P(first hit is a match) ~" in text, out.output
    assert "why: a shortlist of 5 of the 48" in text and "not decided: the probability comes from a shortlist" in text
    text = " ".join(invoke([*args, "--shortlist", "25", "--max-risk", "0.3", "a red ball"]).output.split())
    assert "not calibrated here (a shortlist): P(first hit is a match) ~" in text and "calibrated if" not in text
    assert "why: a shortlist of 25 of the 48" in text and "not decided: the probability comes from a shortlist" in text
    u = json.loads(invoke([*args, "--shortlist", "5", "--max-risk", "0.3", "--json", "a red ball"]).stdout)[0]
    assert u["uncertainty"]["answered"] is None and "shortlist of 5 of the 48 videos" in u["uncertainty"]["caveat"]
    u = json.loads(invoke([*args, "--shortlist", "25", "--max-risk", "0.3", "--json", "a red ball"]).stdout)[0]
    assert u["uncertainty"]["answered"] is None and u["uncertainty"]["probabilities_hold"] is False
    assert u["uncertainty"]["caveat_kind"] == "shortlist" and "shortlist_k0" not in u["uncertainty"]
    u = json.loads(invoke([*args, "--max-risk", "0.3", "--json", "a red ball"]).stdout)[0]
    assert "caveat" not in u["uncertainty"] and u["uncertainty"]["answered"] in (True, False)


def test_calibrating_through_an_index_binds_the_searches_to_it(world: dict, tmp_path: Path) -> None:
    """issue 60, item 1: the queries scored as a search through the index scores them; a match its shortlist
    misses is outside every set (+inf, null in the file); searches through another first stage are refused, and
    a coverage the misses make unreachable is one line."""
    pytest.importorskip("faiss")
    from dab_pipeline.index import build_index
    from dab_pipeline.store import open_store

    run, store = world["run"], world["store"]
    with open_store(store) as st:
        build_index(st, tmp_path / "index", split="all")
    cal = run_calibrate(CalibrateConfig(run=run, device="cpu", gallery="all", index=tmp_path / "index", shortlist=20))
    made = cal.provenance["index"]
    assert made["shortlist"] == 20 and made["path"] == str(tmp_path / "index") and len(made["digest"]) == 64
    missed = sum(x is None for x in cal.conformal["aps"])
    assert 0 < missed < cal.queries  # 20 of 48 videos shortlisted: some matches are missed
    kw = dict(split="all", device="cpu")
    (r,) = run_search(
        SearchConfig(run, store, ["a red ball"], 3, index=tmp_path / "index", shortlist=20, coverage=0.3, **kw)
    )
    assert r.uncertainty.caveat is None and len(r.coverage_set) >= 1  # the set is the calibrated one
    with pytest.raises(ConfigError, match="calibrated through its index at shortlist 20, not 30"):
        run_search(
            SearchConfig(run, store, ["a red ball"], 3, index=tmp_path / "index", shortlist=30, coverage=0.3, **kw)
        )
    with pytest.raises(ConfigError, match="calibrated through an index: search with --index"):
        run_search(SearchConfig(run, store, ["a red ball"], 3, coverage=0.3, **kw))
    with pytest.raises(ConfigError, match="cannot be reached through this first stage: its shortlist missed"):
        run_search(
            SearchConfig(run, store, ["a red ball"], 3, index=tmp_path / "index", shortlist=20, coverage=0.95, **kw)
        )
    out = invoke(["calibrate", "--run", str(run), "--shortlist", "50", "--device", "cpu"])
    assert out.exit_code != 0 and "give --index too" in out.output
    # a server checks a request before its batch (no shortlist known yet), then reassesses with the result's own
    from dab_pipeline.search import Searcher

    with Searcher(run, store, split="all", index=tmp_path / "index", device="cpu") as s:
        s.check_request(UncertaintyRequest(coverage=0.3))  # not refused: the served index is the calibrated one
        (res,) = s.search(["a red ball"], 3, shortlist=20)
        assert s.reassess(res, UncertaintyRequest(coverage=0.3)).coverage_set
        (other,) = s.search(["a red ball"], 3, shortlist=30)
        with pytest.raises(ConfigError, match="at shortlist 20, not 30"):
            s.reassess(other, UncertaintyRequest(coverage=0.3))
    run_calibrate(CalibrateConfig(run=run, device="cpu", gallery="all"))  # the module's other tests: exhaustive


def test_the_shortlist_a_coverage_needs_is_chosen_on_the_fitted_half(world: dict, tmp_path: Path) -> None:
    """issue 60, item 2: --coverage picks the smallest K of a fixed grid whose first stage misses at most half of
    1 - coverage of the fitted half's queries; the marginal quantile then comes from the held-out half alone."""
    pytest.importorskip("faiss")
    from dab_pipeline.index import build_index
    from dab_pipeline.stages.calibrate import choose_shortlist, shortlist_grid
    from dab_pipeline.store import open_store

    assert shortlist_grid(20, 48) == [20, 48] and shortlist_grid(20, 1000) == [20, 50, 100, 200, 500, 1000]
    order = np.array([[3, 1, 2, 0], [0, 2, 1, 3], [2, 3, 0, 1], [1, 0, 3, 2]])
    k, misses = choose_shortlist(order, np.array([0, 0, 1, 1]), np.array([0, 1, 2, 3]), [1, 2, 4], 0.5)
    assert misses == {1: 0.5, 2: 0.5, 4: 0.0} and k == 4  # half of alpha 0.5: at most 0.25 missed
    run, store = world["run"], world["store"]
    with open_store(store) as st:
        build_index(st, tmp_path / "index", split="all")
    cfg = CalibrateConfig(run=run, device="cpu", gallery="all", index=tmp_path / "index", coverage=0.5)
    cal = run_calibrate(cfg)
    chosen = cal.provenance["index"]["chosen_for"]
    assert cal.provenance["index"]["shortlist"] in (20, 48) and set(chosen["miss_share"]) == {"20", "48"}
    assert cal.quantile_rows().sum() == cal.check_queries  # the held-out half alone
    out = invoke(
        [
            "calibrate",
            "--run",
            str(run),
            "--gallery",
            "all",
            "--index",
            str(tmp_path / "index"),
            "--coverage",
            "0.5",
            "--shortlist",
            "20",
            "--device",
            "cpu",
        ]
    )
    assert out.exit_code != 0 and "not both" in out.output
    run_calibrate(CalibrateConfig(run=run, device="cpu", gallery="all"))  # the module's other tests: exhaustive


def test_a_query_of_only_unknown_words_gets_marked_numbers_and_no_decision(world: dict) -> None:
    """issue 61, item 2: a query none of whose words the model knows gets no 'calibrated' numbers unmarked."""
    run_calibrate(CalibrateConfig(run=world["run"], device="cpu", gallery="all"))
    with Searcher(world["run"], world["store"], split="all", device="cpu") as s:
        (r,) = s.search(["zorp, blick!"], 3)
        r.unknown_words = ("zorp", "blick")  # as a compact-vocabulary CLIP reports them (the tiny test CLIP knows all)
        u = s.reassess(r, UncertaintyRequest(max_risk=0.3)).uncertainty
        assert "every word of the query is unknown" in u.caveat and u.answered is None
        r.unknown_words = ("zorp",)  # one word known: the numbers stand
        assert s.reassess(r, UncertaintyRequest(max_risk=0.3)).uncertainty.caveat is None
