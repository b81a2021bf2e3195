"""dab search --index and dab serve: the shortlist path against exact search, the API, its errors, the page,
and a real server under a bounded concurrent load on a loopback port."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError, StoreMismatchError
from dab_pipeline.index import build_index
from dab_pipeline.runs.costfile import CostMatrix, write_costs
from dab_pipeline.search import Searcher
from dab_pipeline.stages.search import SearchConfig, run_search
from dab_pipeline.store import open_store

from ..helpers.models import hand_made_run
from ..helpers.runner import invoke
from ..helpers.stores import SEARCH_CAPTIONS as CAPTIONS
from ..helpers.stores import text_store

pytest.importorskip("faiss")

TEST_VIDEOS = 6


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("serve")
    store = text_store(root / "store.h5", CAPTIONS, test_videos=TEST_VIDEOS, frames=4)
    run, _ = hand_made_run(root / "run", store, "dab")
    with open_store(store) as st:
        build_index(st, root / "index", split="test")
    return {"store": store, "run": run, "index": root / "index", "root": root}


def test_index_search_equals_exact_search_when_the_shortlist_holds_every_video(world: dict) -> None:
    queries = [CAPTIONS[0], CAPTIONS[4], "something else entirely"]
    exact = run_search(SearchConfig(world["run"], world["store"], queries, k=5, device="cpu"))
    short = run_search(
        SearchConfig(
            world["run"], world["store"], queries, k=5, device="cpu", index=world["index"], shortlist=TEST_VIDEOS
        )
    )
    for e, s in zip(exact, short):
        assert [h.video_id for h in s.hits] == [h.video_id for h in e.hits]
        assert [h.video_index for h in s.hits] == [h.video_index for h in e.hits]
        np.testing.assert_allclose([h.cost for h in s.hits], [h.cost for h in e.hits], rtol=1e-4)
        assert s.margin == pytest.approx(e.margin, rel=1e-3, abs=1e-5)


def test_rows_map_back_to_the_split_where_it_is_not_the_first_rows(world: dict, tmp_path: Path) -> None:
    """The train split is store rows 6 and 7: hits must name them and their place in the split."""
    with open_store(world["store"]) as st:
        build_index(st, tmp_path / "train-index", split="train")
    exact = run_search(SearchConfig(world["run"], world["store"], [CAPTIONS[7]], k=2, split="train", device="cpu"))[0]
    short = run_search(
        SearchConfig(
            world["run"],
            world["store"],
            [CAPTIONS[7]],
            k=2,
            split="train",
            device="cpu",
            index=tmp_path / "train-index",
        )
    )[0]
    assert {h.video_id for h in short.hits} == {"vid6", "vid7"}
    assert [(h.video_id, h.video_index) for h in short.hits] == [(h.video_id, h.video_index) for h in exact.hits]


def test_index_search_reads_only_the_shortlist(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    with Searcher(world["run"], world["store"], index=world["index"], device="cpu") as s:
        asked: list[np.ndarray] = []
        real = s.store.read_videos
        monkeypatch.setattr(s.store, "read_videos", lambda rows: (asked.append(np.asarray(rows)), real(rows))[1])
        monkeypatch.setattr(s.store, "load_split", lambda *a, **k: pytest.fail("the split was loaded"))
        (res,) = s.search([CAPTIONS[1]], k=2, shortlist=3)
    assert len(asked) == 1 and len(asked[0]) == 3 and list(asked[0]) == sorted(asked[0])
    assert len(res.hits) == 2 and res.shortlist == 3 and len(res.costs) == 3


def test_an_index_of_another_store_or_split_is_refused(world: dict, tmp_path: Path) -> None:
    # the same frames and ids, one test video fewer (new captions alone would not matter: the index holds videos)
    other = text_store(tmp_path / "other.h5", CAPTIONS, test_videos=TEST_VIDEOS - 1, frames=4)
    with pytest.raises(StoreMismatchError, match="another store"):
        Searcher(world["run"], other, index=world["index"], device="cpu")
    with pytest.raises(ConfigError, match="indexes split 'test'"):
        Searcher(world["run"], world["store"], split="train", index=world["index"], device="cpu")


def test_cli_index_then_search(world: dict, tmp_path: Path) -> None:
    out = invoke(["index", "--features", world["store"], "--out", tmp_path / "idx", "--json"])
    assert out.exit_code == 0, out.output
    meta = json.loads(out.output)
    assert meta["vector"] == "segments" and meta["count"] == TEST_VIDEOS and meta["factory"] == "Flat"
    assert json.loads((tmp_path / "idx" / "config.json").read_text())["vector"] == "segments"
    out = invoke(["index", "--features", world["store"], "--out", tmp_path / "idx"])
    assert out.exit_code != 0 and "already exists" in out.output and "Traceback" not in out.output
    searching = ["search", "--run", world["run"], "--features", world["store"], "--index", tmp_path / "idx"]
    out = invoke([*searching, "--device", "cpu", "-k", "2", "--json", CAPTIONS[2]])
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.output)[0]["hits"]) == 2
    page = tmp_path / "page.html"  # two queries, two shortlists: the page shows the union of their videos
    out = invoke(
        [*searching, "--device", "cpu", "-k", "2", "--shortlist", "3", "--html", page, CAPTIONS[0], "<i>two</i>"]
    )
    assert out.exit_code == 0, out.output
    html = page.read_text()
    assert html.count('class="query"') == 2 and "&lt;i&gt;two&lt;/i&gt;" in html and "<i>two</i>" not in html
    out = invoke(["index", "--features", world["store"], "--out", tmp_path / "x", "--vector", "nope"])
    assert out.exit_code != 0 and "valid:" in out.output
    out = invoke(["index", "--features", world["store"], "--out", tmp_path / "t", "--video-terms"])
    assert out.exit_code != 0 and "pass --run" in out.output and "Traceback" not in out.output
    out = invoke(
        ["index", "--features", world["store"], "--out", tmp_path / "t", "--video-terms", "--run", world["run"]]
    )
    assert out.exit_code == 0, out.output
    assert json.loads((tmp_path / "t" / "index.json").read_text())["terms"] is True
    out = invoke([*searching[:-1], tmp_path / "t", "--device", "cpu", "-k", "2", "--json", CAPTIONS[2]])
    assert out.exit_code == 0, out.output


# ----------------------------------------------------------------------------- the app

fastapi = pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def client(world: dict):
    from fastapi.testclient import TestClient

    from dab_pipeline.stages.serve import ServeSettings, abstain_report, create_app

    searcher = Searcher(world["run"], world["store"], index=world["index"], device="cpu")
    app = create_app(searcher, ServeSettings(abstain_below=1e9, k=5, max_k=5), abstain_report(world["run"], 1e9))
    with TestClient(app, raise_server_exceptions=False) as c:
        c.searcher = searcher
        yield c
    searcher.close()


def test_search_api_returns_hits_confidence_and_abstain(client, world: dict) -> None:
    r = client.get("/search", params={"q": CAPTIONS[3], "k": 3})
    assert r.status_code == 200
    body = r.json()
    ref = run_search(
        SearchConfig(world["run"], world["store"], [CAPTIONS[3]], k=3, device="cpu", index=world["index"])
    )[0]
    assert [h["video_id"] for h in body["hits"]] == [h.video_id for h in ref.hits]
    assert [h["rank"] for h in body["hits"]] == [1, 2, 3]
    assert body["margin"] == pytest.approx(ref.margin, rel=1e-4)
    assert body["confidence"] == body["margin"]  # the margin's former key, kept for one release
    assert body["abstain"] is True  # every margin is below 1e9
    assert body["abstain_threshold"]["test"] is None  # the hand-made run has no test costs


@pytest.mark.parametrize(
    "params, status, words",
    [
        ({}, 400, "empty"),
        ({"q": "   "}, 400, "empty"),
        ({"q": "x" * 501}, 400, "at most 500"),
        ({"q": "a\x07b"}, 400, "control"),
        ({"q": "ok", "k": 0}, 422, "greater than"),
        ({"q": "ok", "k": 6}, 422, "less than"),
        ({"q": "ok", "k": "many"}, 422, "integer"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_message(client, params: dict, status: int, words: str) -> None:
    r = client.get("/search", params=params)
    assert r.status_code == status
    assert list(r.json()) == ["error"] and words in r.json()["error"] and "Traceback" not in r.text  # one shape
    if status == 422:
        assert r.json()["error"].startswith("k: must be ") and f"(got '{params['k']}')" in r.json()["error"]


def test_every_error_of_the_api_has_one_shape(client) -> None:
    """{"error": "one line"}: a library error, a parameter FastAPI refuses, an unknown path, a wrong method."""
    for r, status in (
        (client.get("/nowhere"), 404),
        (client.post("/search", params={"q": "x"}), 405),
        (client.get("/search", params={"q": "ok", "k": "1.5"}), 422),
        (client.get("/search", params={"q": ""}), 400),
    ):
        assert r.status_code == status and list(r.json()) == ["error"] and r.json()["error"], r.text


@pytest.mark.parametrize("k, words", [("0", "k: must be from 1 to 5 (got 0)"), ("abc", "k: must be a whole number")])
def test_the_page_says_why_a_k_is_refused(client, k: str, words: str) -> None:
    r = client.get("/", params={"q": CAPTIONS[0], "k": k})
    assert r.status_code == 422 and r.headers["content-type"].startswith("text/html")
    assert 'data-error="1"' in r.text and words in r.text and 'class="hit"' not in r.text
    emptied = client.get("/", params={"q": CAPTIONS[0], "k": ""})  # an emptied number field: the default k
    assert emptied.status_code == 200 and 'class="hit"' in emptied.text


def test_a_failure_inside_is_a_500_with_one_line(client, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(client.searcher, "search_batch", boom)
    r = client.get("/search", params={"q": "fine"})
    assert r.status_code == 500 and r.json() == {"error": "internal error (RuntimeError)"}


def test_no_abstain_without_a_threshold_and_descriptions_are_escaped(world: dict) -> None:
    from fastapi.testclient import TestClient

    from dab_pipeline.stages.serve import ServeSettings, create_app

    with Searcher(world["run"], world["store"], index=world["index"], device="cpu") as searcher:
        about = {f"vid{i}": "<b>bold</b> & <i>x</i>" for i in range(8)}
        with TestClient(create_app(searcher, ServeSettings(descriptions=about))) as c:
            body = c.get("/search", params={"q": CAPTIONS[0], "k": 2}).json()
            assert body["abstain"] is False and body["abstain_threshold"] is None
            assert body["hits"][0]["description"] == about["vid0"]
            page = c.get("/", params={"q": CAPTIONS[0], "k": 2}).text
            assert "<b>bold</b>" not in page and "&lt;b&gt;bold&lt;/b&gt; &amp;" in page


def test_page_shows_results_and_escapes_the_query(client) -> None:
    r = client.get("/", params={"q": "<script>alert('x')</script> " + CAPTIONS[0], "k": 2})
    assert r.status_code == 200
    assert "<script>alert" not in r.text and "&lt;script&gt;" in r.text
    assert r.text.count('class="hit"') == 2 and "<svg" in r.text and "low margin" in r.text
    r = client.get("/", params={"q": "\x01"})
    assert r.status_code == 400 and 'data-error="1"' in r.text  # the status the API gives the same query
    assert client.get("/healthz").json()["videos"] == TEST_VIDEOS


def test_a_query_that_is_not_utf8_is_refused_not_searched_as_replacement_characters(client) -> None:
    for path in ("/search?q=%ff", "/search?q=caf%c3", "/?q=%ff%fe"):
        r = client.get(path)
        assert r.status_code == 400 and "not valid UTF-8" in r.text, path
    assert client.get("/search?q=caf%C3%A9").status_code == 200  # UTF-8 percent-encoded is fine


def test_a_nul_byte_is_refused_and_never_echoed_raw_into_the_page(client) -> None:
    r = client.get("/", params={"q": "cat\x00<b>dog"})
    assert r.status_code == 400 and 'data-error="1"' in r.text
    assert "\x00" not in r.text and "cat&lt;b&gt;dog" in r.text  # title and input: stripped, escaped
    assert client.get("/search", params={"q": "cat\x00dog"}).status_code == 400


def test_a_parameter_given_twice_is_refused_not_its_last_value_used(client) -> None:
    """Issue 59, 8a: `/search?q=x&coverage=0.9&coverage=0.5` searched with coverage 0.5, without a word. Every
    parameter of the search routes, given twice, is a 400 naming it (valid values, so nothing else refuses them)."""
    twice = {
        "q": ("one", "other"),
        "k": ("3", "5"),
        "coverage": ("0.9", "0.5"),
        "score": ("lac", "aps"),
        "max_risk": ("0.1", "0.2"),
        "delta": ("0.1", "0.05"),
    }
    for name, (a, b) in twice.items():
        params = [("q", CAPTIONS[0])] * (name != "q") + [(name, a), (name, b)]
        r = client.get("/search", params=params)
        assert r.status_code == 400, (name, r.text)
        assert r.json() == {"error": f"the parameter {name!r} is given 2 times: give it once"}
        if name in ("q", "k", "coverage", "max_risk"):  # the page's fields: the page says it, with the same status
            r = client.get("/", params=params)
            assert r.status_code == 400 and 'data-error="1"' in r.text and "given 2 times" in r.text, name
    # a parameter the route does not read is refused, given once or twice (test below)
    assert client.get("/search", params=[("q", CAPTIONS[0]), ("x", "1"), ("x", "2")]).status_code == 400


def test_a_parameter_the_route_does_not_read_is_refused_not_ignored(client) -> None:
    """`/search?q=x&max-risk=0.2` (the CLI's spelling) answered 200 without the risk decision asked for, and
    `&shortlist=30` (a `dab serve` option) was ignored: a 400 names the parameter and lists those the route reads;
    the page says the same, with a query or without one. /healthz reads none and refuses none."""
    api = "q, k, coverage, score, max_risk, delta"
    for name, hint in (("max-risk", " (did you mean 'max_risk'?)"), ("shortlist", ""), ("K", " (did you mean 'k'?)")):
        r = client.get("/search", params={"q": CAPTIONS[0], "k": 1, name: "30"})
        assert r.status_code == 400, (name, r.text)
        assert r.json() == {"error": f"unknown parameter {name!r}{hint}; accepted: {api}"}
    for params in ({"q": CAPTIONS[0], "shortlist": "30"}, {"shortlist": "30"}):
        r = client.get("/", params=params)
        assert r.status_code == 400 and 'data-error="1"' in r.text and 'class="hit"' not in r.text, params
        assert "unknown parameter &#39;shortlist&#39;; accepted: q, k, coverage, max_risk" in r.text, r.text
    assert client.get("/search", params={"q": CAPTIONS[0], "k": 1, "score": "lac", "delta": "0.1"}).status_code == 200
    assert client.get("/healthz", params={"x": "1"}).status_code == 200
    r = client.get("/search", params={"q": CAPTIONS[0], "<b>" + "x" * 60: "1"})  # a client's name: cut, escaped
    assert r.status_code == 400 and r.json()["error"].startswith("unknown parameter '<b>" + "x" * 37 + "...'")


def test_page_errors_use_the_apis_status_codes(client) -> None:
    for params, status in (({"q": ""}, 400), ({"q": "x" * 501}, 400), ({"q": "ok", "k": 0}, 422)):
        assert client.get("/", params=params).status_code == status, params
        assert client.get("/search", params=params).status_code == status, params
    assert client.get("/").status_code == 200  # no query: the empty search page


def test_head_is_answered_like_get(client) -> None:
    for path in ("/", "/healthz", f"/search?q={CAPTIONS[0]}"):
        r = client.head(path)
        assert r.status_code == 200 and r.content == b"", path


def test_a_non_finite_abstain_threshold_is_refused(world: dict) -> None:
    from dab_pipeline.stages.serve import ServeSettings

    for bad in (float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="finite"):
            ServeSettings(abstain_below=bad)
    for bad in ("nan", "inf", "-inf"):
        out = invoke(["serve", "--run", world["run"], "--features", world["store"], "--abstain-below", bad])
        assert out.exit_code == 2 and "not a finite number" in out.output and "Traceback" not in out.output


def test_a_shortlist_k_or_thread_count_no_query_could_use_is_refused_at_start(world: dict, monkeypatch) -> None:
    """Issue 50, 7: `--shortlist 0` started and answered every query 400 blaming the client; `-k 1000` (above what
    a query may ask) and `--threads 0` were taken silently."""
    from dab_pipeline.stages.serve import ServeSettings, backends

    monkeypatch.setattr(
        backends, "load_searcher", lambda *a, **k: pytest.fail("loaded before the options were checked")
    )
    base = ["serve", "--run", world["run"], "--features", world["store"], "--port", "0"]
    for extra, said in (
        (["--shortlist", "0"], "'--shortlist': 0 is not in the range x>=1"),
        (["--shortlist", "-3"], "'--shortlist': -3 is not in the range x>=1"),
        (["-k", "1000"], "'-k': 1000 is above 100, the most a query may ask for"),
        (["--threads", "0"], "'--threads': 0 is not in the range x>=1"),
    ):
        out = invoke([*base, *extra])
        assert out.exit_code == 2 and said in out.output and "Traceback" not in out.output, (extra, out.output)
    with pytest.raises(ConfigError, match="shortlist must be a positive integer, got 0"):
        ServeSettings(shortlist=0)
    with pytest.raises(ConfigError, match="k must be at most 100"):
        ServeSettings(k=1000)


def test_a_bad_port_or_one_in_use_is_one_line_before_anything_loads(world: dict, monkeypatch) -> None:
    pytest.importorskip("uvicorn")
    from dab_pipeline.stages.serve import backends

    monkeypatch.setattr(backends, "load_searcher", lambda *a, **k: pytest.fail("loaded before the port was checked"))
    out = invoke(["serve", "--run", world["run"], "--features", world["store"], "--port", "99999"])
    assert out.exit_code == 2 and "0<=x<=65535" in out.output and "serving" not in out.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = invoke(["serve", "--run", world["run"], "--features", world["store"], "--port", str(port)])
    assert out.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}: in use" in out.output
    assert "serving" not in out.output and "Traceback" not in out.output


@pytest.mark.parametrize("spelling", [["-k", "3"], ["--k", "3"], ["--topk", "3"]])
def test_k_is_spelt_as_in_dab_search_and_topk_works_with_a_notice(
    spelling: list[str], tmp_path: Path, monkeypatch
) -> None:
    """Issue 35: -k/--k as `dab search` (and the HTTP API) spell it; --topk too, with one deprecation line."""
    pytest.importorskip("uvicorn")
    import click

    import dab_pipeline.stages.serve as stage

    asked: list[int] = []

    def run_serve(cfg, progress):
        asked.append(cfg.k)
        raise click.ClickException("stopped before loading")

    monkeypatch.setattr(stage, "run_serve", run_serve)
    out = invoke(["serve", "--run", tmp_path, "--features", tmp_path, "--port", "0", *spelling])
    assert out.exit_code == 1 and "stopped before loading" in out.output and asked == [3]
    notice = "warning: --topk is deprecated, use -k/--k (--topk goes in dab 0.2.0)"
    assert (notice in out.output) == (spelling[0] == "--topk")
    out = invoke(["serve", "--run", tmp_path, "--features", tmp_path, "--k", "2", "--topk", "3"])
    assert out.exit_code == 2 and "give -k/--k only" in out.output and asked == [3]


# ----------------------------------------------------------------------------- a store that changes under a server


def _served(world: dict, root: Path, backend: str, indexed: bool = True):
    """A copy of the world's store in ``backend`` (h5 / zarr), its index and a test client over them (without the
    index: the split read into memory at the first search)."""
    from fastapi.testclient import TestClient

    from dab_pipeline.stages.serve import create_app

    store = text_store(root / f"store.{backend}", CAPTIONS, test_videos=TEST_VIDEOS, frames=4)
    with open_store(store) as st:
        build_index(st, root / "index", split="test")
    searcher = Searcher(world["run"], store, index=root / "index" if indexed else None, device="cpu")
    return store, searcher, TestClient(create_app(searcher), raise_server_exceptions=False)


def _replace_with_other(store: Path, root: Path) -> None:
    import shutil

    other = text_store(root / f"other{store.suffix}", list(reversed(CAPTIONS)), test_videos=TEST_VIDEOS, frames=4)
    if store.is_dir():
        shutil.rmtree(store)
        shutil.copytree(other, store)
    else:
        shutil.copyfile(other, store)  # in place: the same inode, new bytes


def _truncate(store: Path, root: Path) -> None:
    if store.is_dir():  # a chunk file of the frames cut to nothing
        chunk = next(
            p for p in sorted((store / "videos" / "frames").rglob("*")) if p.is_file() and p.name != "zarr.json"
        )
        chunk.write_bytes(b"")
    else:
        os.truncate(store, 20_000)


def _rewrite_in_place(store: Path, root: Path) -> None:
    """Bytes rewritten with the same size, the modification time set back (as `cp -p` or a careful tool would)."""
    if store.is_dir():
        target = next(
            p for p in sorted((store / "videos" / "frames").rglob("*")) if p.is_file() and p.name != "zarr.json"
        )
    else:
        target = store
    st = target.stat()
    with open(target, "r+b") as fh:  # zeros over the first test videos' features (Zarr) or the file's tail (HDF5)
        fh.seek(0 if store.is_dir() else st.st_size - 4096)
        fh.write(bytes(min(4096, st.st_size)))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def _delete(store: Path, root: Path) -> None:
    import shutil

    shutil.rmtree(store) if store.is_dir() else store.unlink()


@pytest.mark.parametrize("backend", ["h5", "zarr"])
@pytest.mark.parametrize(
    "damage",
    [_truncate, _delete, _replace_with_other, _rewrite_in_place],
    ids=["truncated", "deleted", "replaced", "rewritten-in-place"],
)
@pytest.mark.parametrize("indexed", [True, False], ids=["index", "in-memory"])
def test_a_server_never_answers_from_a_changed_or_damaged_store(
    world: dict, tmp_path: Path, backend: str, damage, indexed: bool, caplog
) -> None:
    """Without an index too (issue 50, 10: a Zarr server answered 200 from its in-memory split, healthz ok, after a
    chunk file was cut or zeroed)."""
    store, searcher, client = _served(world, tmp_path, backend, indexed)
    with searcher, client:
        before = client.get("/search", params={"q": CAPTIONS[2], "k": 3})
        assert before.status_code == 200 and client.get("/healthz").json()["ok"] is True
        damage(store, tmp_path)
        with caplog.at_level("ERROR", logger="dab.serve"):
            r = client.get("/search", params={"q": CAPTIONS[2], "k": 3})
            page = client.get("/", params={"q": CAPTIONS[2]})
            health = client.get("/healthz")
        assert r.status_code == 503 and "restart `dab serve`" in r.json()["error"], r.text
        assert str(store) in r.json()["error"] or "chunk" in r.json()["error"]
        assert page.status_code == 503 and 'data-error="1"' in page.text
        assert health.status_code == 503 and health.json()["ok"] is False
        assert [rec.levelname for rec in caplog.records if rec.name == "dab.serve"] == ["ERROR"]  # logged once
        assert client.get("/search", params={"q": CAPTIONS[3]}).status_code == 503  # until restarted


def test_a_read_that_fails_twice_stops_the_server_and_one_that_fails_once_does_not(
    world: dict, tmp_path: Path, monkeypatch
) -> None:
    _, searcher, client = _served(world, tmp_path, "h5")
    with searcher, client:
        real, calls = searcher.store.read_videos, {"n": 0}

        def flaky(rows):
            calls["n"] += 1
            if calls["n"] in (1, 3, 4):  # once, then twice in a row
                raise OSError(5, "Input/output error")
            return real(rows)

        monkeypatch.setattr(searcher.store, "read_videos", flaky)
        assert client.get("/search", params={"q": CAPTIONS[1]}).status_code == 200  # retried once
        r = client.get("/search", params={"q": CAPTIONS[1]})
        assert r.status_code == 503 and "Input/output error" in r.json()["error"]
        assert client.get("/healthz").status_code == 503


def test_a_changed_index_file_stops_the_server_too(world: dict, tmp_path: Path) -> None:
    _, searcher, client = _served(world, tmp_path, "h5")
    with searcher, client:
        assert client.get("/search", params={"q": CAPTIONS[1]}).status_code == 200
        rows = tmp_path / "index" / "rows.npy"
        rows.write_bytes(rows.read_bytes())  # rewritten in place: a new mtime
        os.utime(rows, ns=(0, 0))
        r = client.get("/search", params={"q": CAPTIONS[1]})
        assert r.status_code == 503 and "rows.npy" in r.json()["error"]


def test_abstain_report_against_a_naive_count(tmp_path: Path) -> None:
    from dab_pipeline.stages.serve import abstain_report

    rng = np.random.default_rng(0)
    cost = rng.standard_normal((40, 12)).astype(np.float32)
    gt = rng.integers(0, 12, 40)
    run = tmp_path / "run"
    run.mkdir()
    write_costs(
        run / "costs_test.npz",
        CostMatrix(
            cost=cost,
            query_ids=np.array([f"q{i}" for i in range(40)]),
            video_ids=np.array([f"v{j}" for j in range(12)]),
            gt=gt,
        ),
    )
    srt = np.sort(cost, axis=1)
    margin = srt[:, 1] - srt[:, 0]
    t = float(np.median(margin))
    keep = [i for i in range(40) if margin[i] >= t]
    precision = np.mean([np.argmin(cost[i]) == gt[i] for i in keep])
    rep = abstain_report(run, t)["test"]
    assert rep["coverage"] == pytest.approx(len(keep) / 40)
    assert rep["precision_at_1"] == pytest.approx(precision)


# ----------------------------------------------------------------------------- a real server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_real_server_answers_a_bounded_concurrent_load(world: dict, tmp_path: Path) -> None:
    """`dab serve` in a subprocess on a free loopback port; 8 clients x 50 queries, every one answered."""
    import subprocess
    import sys
    import urllib.parse
    import urllib.request

    pytest.importorskip("uvicorn")
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dab_pipeline.cli",
            "serve",
            "--run",
            str(world["run"]),
            "--features",
            str(world["store"]),
            "--index",
            str(world["index"]),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--threads",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/healthz", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the server did not come up: {proc.stderr.read() if proc.poll() is not None else ''}")
                time.sleep(0.2)
        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()

        def client(c: int) -> None:
            for i in range(50):
                q = urllib.parse.quote_plus(f"{CAPTIONS[(c + i) % len(CAPTIONS)]} {i}")
                t0 = time.perf_counter()
                try:
                    body = json.loads(urllib.request.urlopen(f"{base}/search?q={q}&k=3", timeout=60).read())
                    ok = len(body["hits"]) == 3
                except OSError as exc:
                    ok, body = False, str(exc)
                with lock:
                    latencies.append(time.perf_counter() - t0)
                    if not ok:
                        errors.append(str(body)[:200])

        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads), "a client hung"
        assert errors == [] and len(latencies) == 400
        ms = 1000 * np.array(latencies)
        print(f"\n8 clients x 50 queries: p50 {np.percentile(ms, 50):.1f} ms, p99 {np.percentile(ms, 99):.1f} ms")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ----------------------------------------------------------------------------- a low-rank covariance run (issue 36)


@pytest.mark.parametrize("variant, cov", [("prob", "lowrank:2"), ("dab", "lowrank:2"), ("dab", "mixture:2")])
def test_a_lowrank_run_indexes_pooled_searches_and_serves_like_exact_scoring(
    world: dict, tmp_path: Path, variant: str, cov: str
) -> None:
    """lowrank:2 and mixture:2: `dab index --vector pooled`, `dab search` with and without --index and /search agree with the
    exact scoring of every pair (the reference path of scoring/covariance.py)."""
    from fastapi.testclient import TestClient

    from dab_pipeline.scoring import score_all
    from dab_pipeline.stages.serve import ServeSettings, create_app

    run, model = hand_made_run(tmp_path / "run", world["store"], variant, model_kw={"covariance": cov})
    out = invoke(["index", "--features", world["store"], "--out", tmp_path / "idx", "--vector", "pooled", "--run", run])
    assert out.exit_code == 0, out.output
    with open_store(world["store"]) as st:
        feats = st.load_split("test")
    ref = score_all(model, feats.text[[1]], feats.frames, feats.frame_mask).cost[0]
    order = np.argsort(ref, kind="stable")[:3]
    expected = [str(feats.video_ids[j]) for j in order]
    exact = run_search(SearchConfig(run, world["store"], [CAPTIONS[1]], k=3, device="cpu"))[0]
    short = run_search(
        SearchConfig(run, world["store"], [CAPTIONS[1]], k=3, device="cpu", index=tmp_path / "idx", shortlist=6)
    )[0]
    for res in (exact, short):
        assert [h.video_id for h in res.hits] == expected
        np.testing.assert_allclose([h.cost for h in res.hits], ref[order], rtol=1e-4, atol=1e-5)
    out = invoke(
        ["search", "--run", run, "--features", world["store"], "--index", tmp_path / "idx", "--device", "cpu"]
        + ["-k", "3", "--shortlist", "6", "--json", CAPTIONS[1]]
    )
    assert out.exit_code == 0, out.output
    assert [h["video_id"] for h in json.loads(out.output)[0]["hits"]] == expected
    out = invoke(
        ["search", "--run", run, "--features", world["store"], "--device", "cpu", "-k", "3", "--json", CAPTIONS[1]]
    )
    assert out.exit_code == 0, out.output
    assert [h["video_id"] for h in json.loads(out.output)[0]["hits"]] == expected
    searcher = Searcher(run, world["store"], index=tmp_path / "idx", device="cpu")
    app = create_app(searcher, ServeSettings(k=5, max_k=5, shortlist=6), None)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/search", params={"q": CAPTIONS[1], "k": 3})
    searcher.close()
    assert r.status_code == 200, r.text
    assert [h["video_id"] for h in r.json()["hits"]] == expected


# ----------------------------------------------------------------------------- queries batched (issue 38)

BATCH_LOAD = [(CAPTIONS[i % len(CAPTIONS)] + ("" if i < 8 else f" number {i}"), 1 + i % 5) for i in range(12)]


def _batched(world: dict, max_batch: int, **kw):
    """A Searcher over the world's index and a test client whose server batches up to ``max_batch`` queries."""
    from fastapi.testclient import TestClient

    from dab_pipeline.stages.serve import ServeSettings, create_app

    searcher = Searcher(world["run"], world["store"], index=world["index"], device="cpu")
    app = create_app(searcher, ServeSettings(k=5, max_k=5, shortlist=3, max_batch=max_batch, **kw))
    return searcher, TestClient(app, raise_server_exceptions=False)


def _send_together(client, load: list[tuple[str, int]], hold: bool = False) -> list:
    """Each (q, k) of ``load`` from its own thread, released together by a barrier; ``hold``: the server's
    batcher held until every one is queued, so they are gathered in batches of exactly max_batch."""
    batcher = client.app.state.batcher
    barrier = threading.Barrier(len(load))
    out: list = [None] * len(load)

    def send(i: int) -> None:
        barrier.wait()
        out[i] = client.get("/search", params={"q": load[i][0], "k": load[i][1]})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(load))]
    with batcher.hold() if hold else contextlib.nullcontext():
        for t in threads:
            t.start()
        if hold:
            assert batcher.wait_queued(len(load), timeout=120)
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a request was never answered"
    return out


def _alone(world: dict, load: list[tuple[str, int]]) -> list[dict]:
    """What each query gets from a server that answers one query at a time (--max-batch 1), one after another."""
    searcher, client = _batched(world, max_batch=1)
    with searcher, client:
        return [client.get("/search", params={"q": q, "k": k}).json() for q, k in load]


def _assert_same_answer(got: dict, alone: dict) -> None:
    assert [h["video_id"] for h in got["hits"]] == [h["video_id"] for h in alone["hits"]]
    np.testing.assert_allclose([h["cost"] for h in got["hits"]], [h["cost"] for h in alone["hits"]], rtol=1e-4)
    assert got["margin"] == pytest.approx(alone["margin"], rel=1e-3, abs=1e-4)
    assert (got["k"], got["shortlist"], got["abstain"]) == (alone["k"], alone["shortlist"], alone["abstain"])


@pytest.mark.parametrize("hold", [False, True], ids=["barrier", "held"])
def test_queries_sent_together_get_what_each_gets_alone(world: dict, hold: bool) -> None:
    """12 requests released together by a barrier against --max-batch 4; held: gathered 4 + 4 + 4 for certain."""
    alone = _alone(world, BATCH_LOAD)
    searcher, client = _batched(world, max_batch=4)
    with searcher, client:
        out = _send_together(client, BATCH_LOAD, hold=hold)
        stats = client.get("/healthz").json()["batching"]
    for r, ref in zip(out, alone):
        assert r.status_code == 200, r.text
        _assert_same_answer(r.json(), ref)
    assert stats["queries"] == len(BATCH_LOAD) and stats["largest"] <= 4
    if hold:
        assert stats["sizes"] == {"4": 3}


def test_a_batch_gathers_what_waits_and_max_batch_1_answers_one_at_a_time(world: dict) -> None:
    for max_batch, sizes in ((4, {"4": 1, "2": 1}), (1, {"1": 6})):
        searcher, client = _batched(world, max_batch=max_batch)
        with searcher, client:
            out = _send_together(client, BATCH_LOAD[:6], hold=True)
            assert [r.status_code for r in out] == [200] * 6
            health = client.get("/healthz").json()["batching"]
        assert health["sizes"] == sizes and health["max_batch"] == max_batch


def test_a_query_that_breaks_its_batch_fails_alone(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that raises (a bug, not the store) is answered again one query at a time: only its culprit fails."""
    load = [(CAPTIONS[0], 2), ("boom", 2), (CAPTIONS[3], 3)]
    alone = _alone(world, [load[0], load[2]])
    searcher, client = _batched(world, max_batch=4)
    real = searcher.search_batch

    def fragile(queries, k=10, **kw):
        if "boom" in queries:
            raise RuntimeError("secret internals")
        return real(queries, k, **kw)

    monkeypatch.setattr(searcher, "search_batch", fragile)
    with searcher, client:
        out = _send_together(client, load, hold=True)
        assert client.get("/healthz").json()["batching"]["sizes"] == {"3": 1}
    assert out[1].status_code == 500 and out[1].json() == {"error": "internal error (RuntimeError)"}
    for r, ref in zip((out[0], out[2]), alone):
        assert r.status_code == 200
        _assert_same_answer(r.json(), ref)


def test_a_batch_read_from_a_changed_store_is_a_503_for_each_of_its_queries(world: dict, tmp_path: Path) -> None:
    store, searcher, client = _served(world, tmp_path, "h5")  # the default batching: up to 16 queries
    with searcher, client:
        assert client.get("/search", params={"q": CAPTIONS[1]}).status_code == 200
        batcher = client.app.state.batcher
        out: list = [None] * 3

        def send(i: int) -> None:
            out[i] = client.get("/search", params={"q": CAPTIONS[i], "k": 2})

        threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
        with batcher.hold():
            for t in threads:
                t.start()
            assert batcher.wait_queued(3, timeout=120)
            _truncate(store, tmp_path)  # under the queued batch
        for t in threads:
            t.join(120)
        assert [r.status_code for r in out] == [503] * 3
        assert all("restart `dab serve`" in r.json()["error"] for r in out)
        assert client.get("/healthz").status_code == 503
        assert client.get("/healthz").json()["ok"] is False


def test_batch_options_reach_the_server_and_bad_ones_are_refused(world: dict, monkeypatch) -> None:
    pytest.importorskip("uvicorn")
    import click

    from dab_pipeline.stages.serve import ServeSettings, backends

    for bad in (["--max-batch", "0"], ["--batch-wait-ms", "-1"], ["--batch-wait-ms", "nan"]):
        out = invoke(["serve", "--run", world["run"], "--features", world["store"], *bad])
        assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    for kw in ({"max_batch": 0}, {"batch_wait_ms": float("nan")}, {"batch_wait_ms": -1.0}):
        with pytest.raises(ConfigError):
            ServeSettings(**kw)
    seen: list = []

    class Loaded:
        num_videos = 0

        def close(self) -> None:
            pass

    def create_app(searcher, settings, abstain):
        seen.append(settings)
        raise click.ClickException("stopped before serving")

    monkeypatch.setattr(backends, "load_searcher", lambda *a, **k: Loaded())
    monkeypatch.setattr(backends, "create_app", create_app)
    argv = ["serve", "--run", world["run"], "--features", world["store"], "--port", "0"]
    out = invoke([*argv, "--max-batch", "8", "--batch-wait-ms", "2.5"])
    assert out.exit_code == 1 and "stopped before serving" in out.output
    assert (seen[-1].max_batch, seen[-1].batch_wait_ms) == (8, 2.5)
    invoke(argv)
    assert (seen[-1].max_batch, seen[-1].batch_wait_ms) == (16, 5.0)  # the defaults


@pytest.mark.parametrize("has_httptools", [True, False])
def test_serving_without_httptools_says_so_once(world: dict, monkeypatch, has_httptools: bool) -> None:
    """uvicorn's pure-Python h11 parser serves a few hundred requests a second on 2 cores: one warning line names
    the serve extra's httptools; none where it is installed."""
    pytest.importorskip("uvicorn")
    import click

    from dab_pipeline.stages.serve import backends

    class Loaded:
        num_videos = 0

        def close(self) -> None:
            pass

    class Stop(click.ClickException):
        pass

    def no_run(self, sockets=None):
        raise Stop("stopped before serving")

    monkeypatch.setattr(backends, "load_searcher", lambda *a, **k: Loaded())
    monkeypatch.setattr(backends, "create_app", lambda *a: object())
    monkeypatch.setattr(backends, "has_httptools", lambda: has_httptools)
    import uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", no_run)
    out = invoke(["serve", "--run", world["run"], "--features", world["store"], "--port", "0"])
    assert out.exit_code == 1 and "stopped before serving" in out.output
    assert out.output.count("httptools") == (0 if has_httptools else 1)


def test_serves_warnings_wrap_at_120_columns_in_a_log_as_dab_searchs_do(world: dict, monkeypatch) -> None:
    """`dab serve > serve.log 2>&1` wrote the gallery warning as one line of 228 columns; `dab search` wraps the
    same warning between words at 120. The line saying where the server answers keeps its URL whole."""
    import dab_pipeline.stages.serve as serve_stage
    from dab_pipeline.core.events import Event

    warning = (
        "the run was calibrated on a gallery of 400 videos (split 'all' of /tmp/demo_out/store.h5), not this one of "
        "100 (split 'test'): its probabilities, sets and risk decisions hold there only (docs/uncertainty.md)"
    )
    url = "http://127.0.0.1:8000/" + "long-path/" * 12

    def run_serve(cfg, progress) -> None:
        progress(Event("warning", message=warning))
        progress(Event("info", message=f"serving 6 videos of {cfg.features} on {url} (Ctrl-C stops)"))

    monkeypatch.setattr(serve_stage, "run_serve", run_serve)
    out = invoke(["serve", "--run", world["run"], "--features", world["store"], "--port", "0"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith("warning: the run was calibrated") and len(lines[0]) <= 120, lines
    assert " ".join(" ".join(lines[:-1]).split()) == f"warning: {warning}"  # every word, in order
    assert url in lines[-1]  # the URL, whole, to copy
