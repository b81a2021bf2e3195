"""What a calibrated search says where its numbers do not hold (issue 61, items 2 to 4): a query of no known word
gets no conformal set, a set on another gallery is refused in a short line that offers the gallery calibrated on,
and the unknown-word line says what becomes of the words."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dab_pipeline.calibration import UncertaintyRequest
from dab_pipeline.clip_models import unknown_words_line
from dab_pipeline.core.errors import ConfigError
from dab_pipeline.search import Searcher, uncertainty_payload
from dab_pipeline.stages.calibrate import CalibrateConfig, run_calibrate

from ..helpers.models import hand_made_run
from ..helpers.stores import CALIBRATION_CAPTIONS, CALIBRATION_SPLITS, SEARCH_CAPTIONS, text_store

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A run calibrated on every video of its store (`dab calibrate --gallery all`)."""
    root = tmp_path_factory.mktemp("calibrated")
    store = text_store(root / "store.h5", SEARCH_CAPTIONS + CALIBRATION_CAPTIONS, frames=4, splits=CALIBRATION_SPLITS)
    run, _ = hand_made_run(root / "run", store, "dab")
    run_calibrate(CalibrateConfig(run=run, device="cpu", gallery="all"))
    return {"run": run, "store": store, "root": root}


def test_a_query_of_no_known_word_gets_no_set_and_no_decision(calibrated: dict) -> None:
    with Searcher(calibrated["run"], calibrated["store"], split="all", device="cpu") as s:
        (r,) = s.search(["zorp, blick!"], 3)
        r.unknown_words = ("zorp", "blick")  # as a compact-vocabulary CLIP reports them (the tiny test CLIP knows all)
        u = s.reassess(r, UncertaintyRequest(coverage=0.8, max_risk=0.3)).uncertainty
        assert u.caveat_kind == "unknown_words" and u.answered is None and not u.probabilities_hold
        assert r.coverage_set is None and u.coverage is None and u.set_scope is None
        got = uncertainty_payload(r)  # the JSON (dab search --json, the API, the page): as for no set asked
        assert got is not None and not {"set", "coverage", "set_scope"} & set(got) and got["answered"] is None
        r.unknown_words = ("zorp",)  # one word known: the set and the decision stand
        u = s.reassess(r, UncertaintyRequest(coverage=0.8, max_risk=0.3)).uncertainty
        assert u.caveat is None and len(r.coverage_set) >= 1 and u.answered in (True, False)


def test_a_set_on_another_gallery_is_refused_in_a_short_line_that_offers_the_calibrated_one(calibrated: dict) -> None:
    run, store = calibrated["run"], calibrated["store"]
    warned: list[str] = []
    with Searcher(run, store, split="test", device="cpu", warn=warned.append) as s:
        with pytest.raises(ConfigError) as got:
            s.check_request(UncertaintyRequest(coverage=0.8))
    (warning,) = warned
    said = str(got.value)
    assert warning.split(":")[0] not in said, said  # the warning printed above, not again
    assert (
        f"search that one (--split all) or calibrate on this one (`dab calibrate --run {run} --gallery test`)" in said
    )
    assert len(said) - 2 * len(str(run)) < 180, said  # short: the old line repeated the warning
    # the same videos in another store file: the way out names both stores
    other = shutil.copy(store, calibrated["root"] / "copy.h5")
    with Searcher(run, other, split="test", device="cpu") as s:
        with pytest.raises(ConfigError) as got:
            s.check_request(UncertaintyRequest(max_risk=0.3))
    said = str(got.value)
    assert f"(--features {store} --split all)" in said, said
    assert f"`dab calibrate --run {run} --features {Path(other)} --gallery test`" in said, said


def test_the_unknown_word_line_says_they_are_read_as_blanks_in_the_right_number() -> None:
    one = unknown_words_line("qqqq", ["qqqq"], "dab-world")
    assert one == (
        "query 'qqqq': dab-world does not know the word 'qqqq' (no embedding): it is read as a blank; rephrase "
        "with words its captions use"
    )
    two = unknown_words_line("zorblax quuxify", ["zorblax", "quuxify"], "dab-world")
    assert "the words 'zorblax', 'quuxify' (no embedding): they are read as blanks;" in two
    assert "without" not in one + two
