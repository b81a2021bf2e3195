"""dab search end to end: a tiny store encoded with dab-tiny, a hand-written run folder, the library and the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dab_pipeline.cli import cli
from dab_pipeline.core.errors import ConfigError, TrainingError, WeightsError
from dab_pipeline.model import DABModel
from dab_pipeline.scoring import score_all
from dab_pipeline.stages.search import SearchConfig, run_search
from dab_pipeline.store import open_store

from ..helpers.models import hand_made_run
from ..helpers.runner import invoke
from ..helpers.stores import SEARCH_CAPTIONS as CAPTIONS
from ..helpers.stores import text_store

F_ = 4
TEST_VIDEOS = 6  # videos 0..5 are "test", 6..7 "train"


def build_store(path: Path, pretrained: str | None = None) -> Path:
    """One caption per video; caption features from dab-tiny, so a query string re-encodes to them."""
    return text_store(path, CAPTIONS, test_videos=TEST_VIDEOS, frames=F_, pretrained=pretrained)


def build_run(path: Path, store: Path, variant: str = "dab", **train) -> tuple[Path, DABModel]:
    return hand_made_run(path, store, variant, **train)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("search") / "store.h5")


@pytest.mark.parametrize("variant", ["dab", "xpool"])
def test_search_ranks_like_score_all(store: Path, tmp_path: Path, variant: str) -> None:
    run, model = build_run(tmp_path / "run", store, variant)
    queries = [CAPTIONS[0], CAPTIONS[3]]
    results = run_search(SearchConfig(run, store, queries, k=4, device="cpu"))
    with open_store(store) as s:
        feats = s.load_split("test")
    assert len(feats.video_ids) == TEST_VIDEOS
    ref = score_all(model, feats.text[[0, 3]], feats.frames, feats.frame_mask).cost  # the stored caption features
    for r, q, row in zip(results, queries, ref):
        order = np.argsort(row, kind="stable")
        assert r.query == q
        assert [h.video_id for h in r.hits] == [str(feats.video_ids[j]) for j in order[:4]]
        assert [h.rank for h in r.hits] == [1, 2, 3, 4]
        np.testing.assert_allclose([h.cost for h in r.hits], row[order[:4]], rtol=1e-4, atol=1e-6)
        assert r.margin == pytest.approx(row[order[1]] - row[order[0]], rel=1e-3, abs=1e-5)
        assert r.margin >= 0


def test_search_topk_larger_than_the_split(store: Path, tmp_path: Path) -> None:
    run, _ = build_run(tmp_path / "run", store)
    (res,) = run_search(SearchConfig(run, store, ["anything at all"], k=50, device="cpu", dtype="bfloat16"))
    assert len(res.hits) == TEST_VIDEOS and len({h.video_id for h in res.hits}) == TEST_VIDEOS
    costs = [h.cost for h in res.hits]
    assert costs == sorted(costs)


def test_cli_prints_the_table_and_json(store: Path, tmp_path: Path) -> None:
    run, _ = build_run(tmp_path / "run", store)
    expected = run_search(SearchConfig(run, store, [CAPTIONS[2]], k=3, device="cpu"))[0]
    runner = CliRunner()
    out = runner.invoke(
        cli, ["search", "--run", str(run), "--features", str(store), "-k", "3", "--device", "cpu", CAPTIONS[2]]
    )
    assert out.exit_code == 0, out.output
    assert expected.hits[0].video_id in out.output and "margin" in out.output and CAPTIONS[2] in out.output
    out = runner.invoke(
        cli,
        [
            "search",
            "--run",
            str(run),
            "--features",
            str(store),
            "-k",
            "3",
            "--device",
            "cpu",
            "--json",
            CAPTIONS[2],
            CAPTIONS[5],
        ],
    )
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    assert [p["query"] for p in payload] == [CAPTIONS[2], CAPTIONS[5]]
    assert [h["video_id"] for h in payload[0]["hits"]] == [h.video_id for h in expected.hits]
    assert payload[0]["margin"] == pytest.approx(expected.margin, rel=1e-4)  # batch of 2 vs 1: last bits


def test_the_html_page_is_written_by_the_stage(store: Path, tmp_path: Path) -> None:
    """Issue 62, item 1: `dab search --html` is run_search's page (the CLI only says where it wrote it): the queries,
    escaped, and a description beside a hit in place of its caption."""
    run, _ = build_run(tmp_path / "run", store)
    about = tmp_path / "about.json"
    about.write_text(json.dumps({"vid0": "described <b>zero</b>"}))
    queries = (CAPTIONS[0], "<i>two</i>")
    cfg = SearchConfig(run, store, queries, k=3, device="cpu", html=tmp_path / "py.html", descriptions=about)
    assert len(run_search(cfg)) == 2
    page = (tmp_path / "py.html").read_text()
    assert page.count('class="query"') == 2 and "&lt;i&gt;two&lt;/i&gt;" in page and "<i>two</i>" not in page
    assert "described &lt;b&gt;zero&lt;/b&gt;" in page and CAPTIONS[0] not in page.split("</h2>", 1)[1]  # vid0's
    assert any(c in page for c in CAPTIONS[1:TEST_VIDEOS])  # the other hits: their captions
    args = ["search", "--run", run, "--features", store, "-k", "3", "--device", "cpu", "--descriptions", about]
    out = invoke([*args, "--html", tmp_path / "cli.html", *queries])
    assert out.exit_code == 0 and f"wrote {tmp_path / 'cli.html'}" in out.output, out.output
    assert (tmp_path / "cli.html").read_text() == page


def test_a_search_config_takes_strings_and_any_sequence_of_queries() -> None:
    """What stages.search.search (removed, issue 62) took: paths as strings, the queries as a list."""
    cfg = SearchConfig("runs/dab", "store.h5", ["a", "b"], index="idx", html="page.html", descriptions="about.json")
    assert (cfg.run, cfg.features, cfg.queries) == (Path("runs/dab"), Path("store.h5"), ("a", "b"))
    assert (cfg.index, cfg.html, cfg.descriptions) == (Path("idx"), Path("page.html"), Path("about.json"))
    assert cfg == SearchConfig(Path("runs/dab"), Path("store.h5"), ("a", "b"), index=Path("idx"), html=Path("page.html"),
                               descriptions=Path("about.json"))  # fmt: skip
    assert cfg.searcher_options().index == Path("idx")
    with pytest.raises(ConfigError, match="non-empty query"):
        SearchConfig("runs/dab", "store.h5", ["a", " "])
    # one string is not a sequence of one-letter queries: refused, as the library's search refuses it
    with pytest.raises(ConfigError, match=r"queries must be a list of strings, not one string: give \['a dog'\]"):
        SearchConfig("runs/dab", "store.h5", "a dog")
    from dab_pipeline.search.results import check_queries

    with pytest.raises(ConfigError, match="not one string"):
        check_queries("dog", 3)


def test_missing_clip_weights_are_a_one_line_error(tmp_path: Path) -> None:
    store = build_store(tmp_path / "store.h5", pretrained=str(tmp_path / "gone" / "dab-tiny.pt"))
    run, _ = build_run(tmp_path / "run", store)
    with pytest.raises(WeightsError, match="needs its weights, which are not available here"):
        run_search(SearchConfig(run, store, ["a red ball"], device="cpu"))
    out = invoke(["search", "--run", str(run), "--features", str(store), "--device", "cpu", "a red ball"])
    assert out.exit_code != 0
    assert out.output.startswith("Error: dab search encodes the query with the store's CLIP model dab-tiny")
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1


def test_run_folder_errors(store: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a run folder"):
        run_search(SearchConfig(tmp_path, store, ["x"], device="cpu"))
    run, _ = build_run(tmp_path / "ft", store, trainable_blocks=1)
    with pytest.raises(ConfigError, match="frozen"):
        run_search(SearchConfig(run, store, ["x"], device="cpu"))
    run, _ = build_run(tmp_path / "nock", store)
    (run / "checkpoints" / "best.pt").unlink()
    with pytest.raises(TrainingError, match="best.pt"):
        run_search(SearchConfig(run, store, ["x"], device="cpu"))
    run, _ = build_run(tmp_path / "ok", store)
    with pytest.raises(ConfigError, match="non-empty query"):
        run_search(SearchConfig(run, store, [" "], device="cpu"))


class _Payload:
    """Pickles to a call of os.system: what a hostile checkpoint can run on plain torch.load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_would_run_code_is_refused(store: Path, tmp_path: Path) -> None:
    run, model = build_run(tmp_path / "shared-run", store)
    marker = tmp_path / "pwned"
    ck = run / "checkpoints" / "best.pt"
    torch.save({"model": model.state_dict(), "heads": None, "epoch": 1, "note": _Payload(marker)}, ck)
    # The payload is real: a plain unpickling runs it.
    torch.load(ck, weights_only=False)
    assert marker.exists()
    marker.unlink()
    out = invoke(["search", "--run", str(run), "--features", str(store), "--device", "cpu", "x"])
    assert out.exit_code != 0 and "Traceback" not in out.output
    assert out.output.startswith(f"Error: refused to load {ck}") and len(out.output.strip().splitlines()) == 1
    assert not marker.exists()  # nothing ran


def test_checkpoints_dab_writes_load_with_weights_only(tmp_path: Path) -> None:
    from dab_pipeline.runs.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state

    path = tmp_path / "ck.pt"
    np.random.seed(3)
    save_checkpoint(path, {"rng": rng_state(), "model": {"w": torch.ones(2)}, "epoch_loss": (1.5, 2)})
    state = torch.load(path, weights_only=True)  # no allowlist needed
    expected = np.random.random(4)
    np.random.seed(99)
    set_rng_state(state["rng"])
    np.testing.assert_array_equal(np.random.random(4), expected)
    assert load_checkpoint(path)["epoch_loss"] == (1.5, 2)


def test_checkpoint_of_an_older_dab_still_loads(tmp_path: Path) -> None:
    """Before the weights-only rule, dab stored NumPy's random state as an array."""
    import random

    from dab_pipeline.runs.checkpoint import load_checkpoint, set_rng_state

    np.random.seed(5)
    old = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(), "cuda": None}
    path = tmp_path / "old.pt"
    torch.save({"rng": old, "model": {}}, path)
    expected = np.random.random(3)
    ck = load_checkpoint(path)
    np.random.seed(0)
    set_rng_state(ck["rng"])
    np.testing.assert_array_equal(np.random.random(3), expected)


@pytest.mark.parametrize("spelling", [["-k", "3"], ["--k", "3"], ["--k=3"], ["--topk", "3"]])
def test_k_is_spelt_as_in_dab_serve_and_topk_still_works_with_a_notice(
    spelling: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: `dab search` and `dab serve` both say -k/--k (the HTTP API's k); --topk, search's former spelling,
    still works, with one deprecation line on stderr (stdout stays the JSON a script reads)."""
    import dab_pipeline.stages.search as stage

    asked: list[int] = []
    monkeypatch.setattr(stage, "run_search", lambda cfg, warn: asked.append(cfg.k) or [])
    out = CliRunner().invoke(
        cli, ["search", "--run", str(tmp_path), "--features", str(tmp_path), *spelling, "--json", "a query"]
    )
    assert out.exit_code == 0, out.output
    assert asked == [3] and json.loads(out.stdout) == []
    if spelling[0] == "--topk":
        assert out.stderr == ("warning: --topk is deprecated, use -k/--k (--topk goes in dab 0.2.0)\n")
    else:
        assert out.stderr == ""
    both = CliRunner().invoke(
        cli, ["search", "--run", str(tmp_path), "--features", str(tmp_path), "-k", "2", "--topk", "3", "a query"]
    )
    assert both.exit_code == 2 and "--topk is the former spelling of -k/--k: give -k/--k only" in both.output
    assert "--topk" not in CliRunner().invoke(cli, ["search", "--help"]).stdout.split("-k, --k")[0]


def _log_lines(output: str) -> list[str]:
    """The lines of a command's output in a log: each within 120 columns, none holding U+FFFD (a character cut)."""
    lines = output.splitlines()
    assert all(len(x) <= 120 for x in lines), "\n".join(x for x in lines if len(x) > 120)
    assert not any("\ufffd" in x for x in lines), output
    return lines


def test_cli_table_fits_120_columns_outside_a_terminal(store: Path, tmp_path: Path) -> None:
    """Issue 61, item 5 (a, c, d): in a log or a pipe a query's table fits 120 columns (it was 257 wide with the
    world's descriptions), its borders in ASCII; a description too long for the room left is cut at a word boundary
    and ended with "…" (a single word longer than the room: cut inside it, the "…" still saying so); the margin's
    label and value stay on one line."""
    run, _ = build_run(tmp_path / "run", store)
    words = (
        "shot 1 (frames 0-7): large orange ring, small yellow circle, small green ring on navy; shot 2 (frames 8-15): "
        "large blue ring on black; shot 3 (frames 16-23): small pink cross on grey"
    )
    one_word = "a-description-without-a-place-to-break-" * 4  # 156 characters, one word
    short = "small red ring on sand"
    texts = {f"vid{i}": (words, one_word, short)[i % 3] for i in range(len(CAPTIONS))}
    about = tmp_path / "about.json"
    about.write_text(json.dumps(texts))
    args = ["search", "--run", run, "--features", store, "-k", "6", "--device", "cpu", "--descriptions", about]
    out = invoke([*args, CAPTIONS[2], CAPTIONS[4]])
    assert out.exit_code == 0, out.output
    lines = _log_lines(out.output)
    assert not any(set(x) & set("━┃│┏┡└") for x in lines), out.output  # ASCII borders: no box characters
    cells = {}
    for x in lines:
        parts = [c.strip() for c in x.split("|")[1:-1]]
        if len(parts) == 4 and parts[0].isdigit():
            cells[parts[1]] = parts[3]
    assert set(cells) == {f"vid{i}" for i in range(TEST_VIDEOS)}, out.output
    for vid, cell in cells.items():
        text = texts[vid]
        if len(text) <= 80:
            assert cell == text
            continue
        assert cell.endswith("…") and text.startswith(cell[:-1]), (vid, cell)
        if text is words:  # cut where a word ends
            assert text[len(cell) - 1] in " ,;:" and len(cell) > 60, (vid, cell)
    margins = [x for x in lines if "margin" in x]
    assert len(margins) == 2 and all(re.fullmatch(r"margin \(2nd - 1st cost\): [0-9.e+-]+", x) for x in margins)


def test_cli_warning_and_conformal_set_lines_fit_120_columns(store: Path, tmp_path: Path) -> None:
    """The lines under a table (a calibrated answer's set) and a warning wrap between words at 120 columns."""
    from dab_pipeline.stages.calibrate import CalibrateConfig, run_calibrate

    pytest.importorskip("sklearn")
    big = text_store(
        tmp_path / "big.h5",
        [
            f"a {c} {t}"
            for c in ("red", "blue", "green", "white", "black")
            for t in ("ball", "dog", "car", "cat", "boat")
        ],
        frames=F_,
        splits=["test"] * 5 + ["val"] * 20,
    )
    run, _ = build_run(tmp_path / "run", big)
    run_calibrate(CalibrateConfig(run=run, device="cpu"))
    args = ["search", "--run", run, "--features", big, "--split", "all", "-k", "2", "--device", "cpu"]
    out = invoke([*args, "a red ball"])  # another gallery: a warning, and every result's numbers marked
    assert out.exit_code == 0, out.output
    _log_lines(out.output)
    text = " ".join(out.output.split())
    assert "warning: the run was calibrated on a gallery of 20 videos" in text, out.output  # searched: 25 videos
    assert "not calibrated here (another gallery): P(first hit is a match) ~" in text  # the warning not repeated
    assert "why: the gallery searched is not the one calibrated on (see the warning)" in text
    run_calibrate(CalibrateConfig(run=run, device="cpu", gallery="all"))  # a set needs the gallery searched
    out = invoke([*args, "--coverage", "0.95", "a red ball"])
    assert out.exit_code == 0, out.output
    lines = _log_lines(out.output)
    text = " ".join(out.output.split())
    assert "conformal set" in text and any(x.startswith("margin (2nd - 1st cost): ") for x in lines)


@pytest.mark.parametrize(
    "content, said",
    [
        (b"", "is empty (0 bytes): not a checkpoint"),
        (b"hello, this is a text file\n", "is not a PyTorch checkpoint"),
        (bytes(range(256)) * 8, "is not a PyTorch checkpoint"),
    ],
    ids=["empty", "text", "garbage"],
)
def test_an_empty_or_garbage_checkpoint_is_one_line_everywhere(
    store: Path, tmp_path: Path, content: bytes, said: str
) -> None:
    """Issue 50, 2: `: > RUN/checkpoints/best.pt` gave IndexError (an empty EOFError, a text file a KeyError) in
    search, serve, evaluate, train --resume and load_run."""
    from dab_pipeline.core.errors import CheckpointError
    from dab_pipeline.runs.load import load_run

    run, _ = build_run(tmp_path / "run", store)
    (run / "checkpoints" / "best.pt").write_bytes(content)
    with pytest.raises(CheckpointError, match=re.escape(said)):
        load_run(run)
    out = invoke(["search", "--run", run, "--features", store, "--device", "cpu", "a dog"])
    assert out.exit_code != 0 and said in out.output and "Traceback" not in out.output
    (run / "checkpoints" / "last.pt").write_bytes(content)
    out = invoke(["train", "--resume", "--out", run])
    assert out.exit_code != 0 and said in out.output and "Traceback" not in out.output
