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

from ..helpers.models import calibrated_run
from ..helpers.stores import text_store

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A run calibrated on every video of its store (`dab calibrate --gallery all`)."""
    root = tmp_path_factory.mktemp("calibrated")
    run, store = calibrated_run(root)
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
    """Calibrated on every video, searched on split 'test': calibrating on 'test' would be refused (it lacks the
    videos of the 'val' queries calibrated on), so only the search of the gallery calibrated on is offered."""
    run, store = calibrated["run"], calibrated["store"]
    warned: list[str] = []
    with Searcher(run, store, split="test", device="cpu", warn=warned.append) as s:
        with pytest.raises(ConfigError) as got:
            s.check_request(UncertaintyRequest(coverage=0.8))
    (warning,) = warned
    said = str(got.value)
    assert warning.split(":")[0] not in said, said  # the warning printed above, not again
    assert said == f"{run} was calibrated on another gallery: search --split all"
    with pytest.raises(ConfigError, match="lacks 40 videos of split 'val'"):  # what the calibrate it offered did
        run_calibrate(CalibrateConfig(run=shutil.copytree(run, calibrated["root"] / "scratch"), gallery="test"))
    # the same videos in another store file: the way out names both stores
    other = shutil.copy(store, calibrated["root"] / "copy.h5")
    with Searcher(run, other, split="test", device="cpu") as s:
        with pytest.raises(ConfigError) as got:
            s.check_request(UncertaintyRequest(max_risk=0.3))
    assert str(got.value) == f"{run} was calibrated on another gallery: search --features {store} --split all"


def test_the_calibrate_offered_on_another_gallery_is_one_that_works(calibrated: dict, tmp_path: Path) -> None:
    """Calibrated on split 'val' (the default gallery), searched on every video: 'all' holds the 'val' videos, so
    calibrating on it is offered, whole (--run, and --features for another store file), and the command as
    printed makes the search's sets and risk decisions (it lacked --run, and offered galleries that cannot hold
    the calibration's queries)."""
    import shlex

    from ..helpers.runner import invoke

    run = shutil.copytree(calibrated["run"], tmp_path / "run")
    run_calibrate(CalibrateConfig(run=run, device="cpu"))  # queries and gallery: split 'val'
    with Searcher(run, calibrated["store"], split="all", device="cpu") as s:
        with pytest.raises(ConfigError) as got:
            s.check_request(UncertaintyRequest(coverage=0.8))
    said = str(got.value)
    assert said == f"calibrated on another gallery: search --split val, or dab calibrate --run {run} --gallery all"
    other = shutil.copy(calibrated["store"], tmp_path / "copy.h5")
    with Searcher(run, other, split="all", device="cpu") as s:
        with pytest.raises(ConfigError) as elsewhere:
            s.check_request(UncertaintyRequest(coverage=0.8))
    assert str(elsewhere.value).endswith(f"or dab calibrate --run {run} --features {other} --gallery all")
    command = shlex.split(said.split(", or ")[1])
    assert command[0] == "dab"
    out = invoke([*command[1:], "--device", "cpu"])
    assert out.exit_code == 0, out.output
    with Searcher(run, calibrated["store"], split="all", device="cpu") as s:
        s.check_request(UncertaintyRequest(coverage=0.8))  # not refused: the gallery searched is calibrated on
        assert s.gallery_note is None


def test_a_gallery_changed_since_the_calibration_offers_the_whole_calibrate(calibrated: dict, tmp_path: Path) -> None:
    """The gallery calibrated on, changed since (its fingerprint differs): calibrating again is the way out, with
    --run (it was `dab calibrate --gallery all again`); a server's user is told to restart it after."""
    import json

    run = shutil.copytree(calibrated["run"], tmp_path / "run")
    cal = json.loads((run / "calibration.json").read_text())
    cal["provenance"]["gallery"]["fingerprint"] = "0" * 64  # as if a video of the store was extracted again
    (run / "calibration.json").write_text(json.dumps(cal))
    with Searcher(run, calibrated["store"], split="all", device="cpu") as s:
        assert s.gallery_note is not None
        with pytest.raises(ConfigError) as got:
            s.check_request(UncertaintyRequest(coverage=0.8))
        assert str(got.value) == f"this gallery changed since the calibration: dab calibrate --run {run} --gallery all"
        with pytest.raises(ConfigError) as served:
            s.check_request(UncertaintyRequest(coverage=0.8), served=True)
        assert str(served.value).endswith(f"run `dab calibrate --run {run} --gallery all`, then restart the server")


def test_the_other_gallery_refusal_fits_120_columns_in_a_pipe(
    calibrated: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole "Error: ..." line of `dab search`, the search of another gallery offered, and the calibrate
    offered for a run path of 20 characters, within 120 columns (it was 213+, the hint repeating the run's
    path; the calibrate offered lacked --run)."""
    from ..helpers.runner import invoke

    root = calibrated["root"]
    monkeypatch.chdir(root)
    (root / "runs").mkdir(exist_ok=True)
    (root / "runs" / "dab").symlink_to(calibrated["run"], target_is_directory=True)
    args = ["search", "--features", "store.h5", "--split", "test", "--device", "cpu", "--max-risk", "0.3", "red"]
    out = invoke(["search", "--run", "runs/dab", *args[1:]])
    assert out.exit_code != 0
    (error,) = [line for line in out.output.splitlines() if line.startswith("Error: ")]
    assert error == "Error: runs/dab was calibrated on another gallery: search --split all", error
    twenty = Path("runs") / "a-run-of-twenty"  # runs/ and 15 more: 20 characters
    assert len(str(twenty)) == 20
    shutil.copytree(calibrated["run"], twenty)
    run_calibrate(CalibrateConfig(run=twenty, device="cpu"))  # on split 'val': a search of 'all' may calibrate
    out = invoke(["search", "--run", twenty, *args[1:4], "all", *args[5:]])
    (error,) = [line for line in out.output.splitlines() if line.startswith("Error: ")]
    assert error.endswith(f"dab calibrate --run {twenty} --gallery all") and len(error) <= 120, (len(error), error)


def test_a_shortlist_of_at_least_k0_holds_nothing_as_a_search_cannot_check_it(calibrated: dict) -> None:
    """A shortlist of at least k0 videos (k0 20; the gallery 48) gives the exhaustive probabilities only where it
    holds the exhaustive first k0 videos, which a search cannot check (the demo's "a large red circle" read 0.21
    over a shortlist of 30 that missed the exhaustive first hit, said calibrated and decided): its numbers do not
    hold, with a set or without, nothing is decided, and the result, the JSON and dab search's lines say so."""
    from dab_pipeline.cli.commands.calibrated_answers import uncertainty_lines

    ask = UncertaintyRequest(coverage=0.8, max_risk=0.3)
    with Searcher(calibrated["run"], calibrated["store"], split="all", device="cpu") as s:
        (full,) = s.search(["a red ball"], 3, uncertainty=ask)
        (wide,) = s.search(["a red ball"], 3, shortlist=25, uncertainty=ask)
        (plain,) = s.search(["a red ball"], 3, shortlist=25)  # no set asked: the same caveat
    got = uncertainty_payload(full)
    assert got["caveat_kind"] is None and got["probabilities_hold"] is True and got["answered"] in (True, False)
    for r in (wide, plain):
        got = uncertainty_payload(r)
        assert got["caveat_kind"] == "shortlist" and got["probabilities_hold"] is False and "shortlist_k0" not in got
        assert got["caveat"].startswith("a shortlist of 25 of the 48 videos calibrated on may miss the first 20")
        assert got["p_first"] == r.uncertainty.p_first  # the keys before these, as they were
        assert uncertainty_lines(r)[0].startswith("not calibrated here (a shortlist): P(first hit is a match) ~")
    assert uncertainty_payload(wide)["answered"] is None
    assert uncertainty_lines(full)[0].startswith("calibrated: P(first hit is a match)")


def test_a_run_calibrated_through_its_index_gets_no_shortlist_caveat(calibrated: dict, tmp_path: Path) -> None:
    """A search through the first stage the run was calibrated through: its probabilities and its set are the
    calibrated ones, no caveat and no condition (issue 60)."""
    pytest.importorskip("faiss")
    from dab_pipeline.cli.commands.calibrated_answers import uncertainty_lines
    from dab_pipeline.index import build_index
    from dab_pipeline.store import open_store

    run = shutil.copytree(calibrated["run"], tmp_path / "run")
    with open_store(calibrated["store"]) as st:
        build_index(st, tmp_path / "index", split="all")
    run_calibrate(CalibrateConfig(run=run, device="cpu", gallery="all", index=tmp_path / "index", shortlist=20))
    with Searcher(run, calibrated["store"], split="all", index=tmp_path / "index", device="cpu") as s:
        ask = UncertaintyRequest(coverage=0.3, max_risk=0.3)
        (r,) = s.search(["a red ball"], 3, shortlist=20, uncertainty=ask)
    assert r.uncertainty.caveat_kind is None and r.coverage_set
    got = uncertainty_payload(r)
    assert got["caveat_kind"] is None and got["probabilities_hold"] is True and "shortlist_k0" not in got
    assert got["answered"] in (True, False)  # decided: the probability is the one calibrated through the index
    lines = uncertainty_lines(r)
    assert lines[0].startswith("calibrated: P(first hit is a match)") and "not calibrated" not in lines[1], lines
    # through another first stage (every video, another K): a set or a risk is refused, and the bare
    # probabilities, which were labelled calibrated, are marked with the reason
    with Searcher(run, calibrated["store"], split="all", device="cpu") as s:
        (every,) = s.search(["a red ball"], 3)
    with Searcher(run, calibrated["store"], split="all", index=tmp_path / "index", device="cpu") as s:
        (other_k,) = s.search(["a red ball"], 3, shortlist=30)
    for r, why in ((every, "this run was calibrated through an index: search with --index"), (other_k, "at shortlist")):
        assert r.uncertainty.caveat_kind == "first_stage" and not r.uncertainty.probabilities_hold, r.uncertainty
        assert why in r.uncertainty.caveat, r.uncertainty.caveat
        lines = uncertainty_lines(r)
        assert lines[0].startswith("not calibrated here (another first stage): P(first hit is a match) ~"), lines
        assert lines[1] == f"why: {r.uncertainty.caveat}" and uncertainty_payload(r)["probabilities_hold"] is False


def test_a_query_of_no_known_word_keeps_its_numbers_in_the_json_marked(calibrated: dict) -> None:
    with Searcher(calibrated["run"], calibrated["store"], split="all", device="cpu") as s:
        (r,) = s.search(["zorp, blick!"], 3)
        r.unknown_words = ("zorp", "blick")
        got = uncertainty_payload(s.reassess(r, UncertaintyRequest(max_risk=0.3)))
    assert got["caveat_kind"] == "unknown_words" and got["probabilities_hold"] is False
    assert "p_first" in got and "shortlist_k0" not in got  # kept for its readers, marked as not holding


def test_the_store_calibrated_on_is_compared_as_an_absolute_path_or_a_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """calibration.json records the store's absolute path (an older one the path as given, relative to where
    dab calibrate ran); a URL is compared as written, file:// as the local path it is."""
    from dab_pipeline.core.location import StoreURL
    from dab_pipeline.search.calibrated import _same_place

    monkeypatch.chdir(tmp_path)
    (tmp_path / "store.h5").write_bytes(b"")
    assert _same_place(str(tmp_path / "store.h5"), Path("store.h5"))  # recorded absolute, searched relative
    assert _same_place("store.h5", tmp_path / "store.h5")  # an older file: relative, resolved against the cwd
    assert _same_place("./store.h5", Path("store.h5"))
    assert not _same_place(str(tmp_path / "other.h5"), Path("store.h5"))
    assert _same_place(f"file://{tmp_path / 'store.h5'}", Path("store.h5"))  # file:// is the local path
    assert _same_place("memory://bucket/store.h5", StoreURL("memory://bucket/store.h5/"))
    assert not _same_place("memory://bucket/store.h5", Path("memory:/bucket/store.h5"))  # a URL is no local path


def test_the_unknown_word_line_says_they_are_read_as_blanks_in_the_right_number() -> None:
    one = unknown_words_line("qqqq", ["qqqq"], "dab-world")
    assert one == (
        "query 'qqqq': dab-world does not know the word 'qqqq' (no embedding): it is read as a blank; rephrase "
        "with words its captions use"
    )
    two = unknown_words_line("zorblax quuxify", ["zorblax", "quuxify"], "dab-world")
    assert "the words 'zorblax', 'quuxify' (no embedding): they are read as blanks;" in two
    assert "without" not in one + two


def test_a_library_without_the_calibration_split_is_searched_and_only_the_calibrated_gallery_offered(
    calibrated: dict, tmp_path: Path
) -> None:
    """A store of other videos with no 'val' split (a library, docs/datasets.md): the search runs with its
    numbers marked (it stopped with "no split 'val'" while building the refusal's advice), and a set is refused
    offering only the search of the gallery calibrated on (no calibration is possible there)."""
    library = text_store(tmp_path / "library.h5", ["a red circle", "a blue car", "a dog"], splits=["test"] * 3)
    with Searcher(calibrated["run"], library, split="all", device="cpu") as s:
        (r,) = s.search(["a red ball"], 2)
        assert r.uncertainty.caveat_kind == "gallery" and not r.uncertainty.probabilities_hold
        with pytest.raises(ConfigError) as err:
            s.search(["a red ball"], 2, uncertainty=UncertaintyRequest(coverage=0.8))
    assert "dab calibrate" not in str(err.value) and "--split all" in str(err.value), str(err.value)
