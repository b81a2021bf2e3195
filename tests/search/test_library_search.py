"""A newcomer's library: videos without captions extracted and searched whole (--split all) with a run trained
elsewhere, words the model cannot read named, and one default precision for search, serve and the API."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline.clip_models import load_clip, unknown_words
from dab_pipeline.core.choices import DEFAULT_SCORE_DTYPE
from dab_pipeline.search import Searcher
from dab_pipeline.stages.search import SearchConfig, run_search
from dab_pipeline.store import open_store

from ..helpers.models import hand_made_run
from ..helpers.runner import invoke
from ..helpers.stores import SEARCH_CAPTIONS, text_store
from ..helpers.videos import write_index_video


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A folder of 4 videos and no annotations, extracted with dab-tiny; a run trained on another store."""
    root = tmp_path_factory.mktemp("library")
    (root / "videos" / "trip").mkdir(parents=True)
    for i, name in enumerate(("a.mp4", "b.mp4", "trip/c.mp4", "trip/d.mp4")):
        write_index_video(root / "videos" / name, 6 + 3 * i, (32, 24))
    store = root / "library.h5"
    args = ["extract", "--dataset", "folder", "--videos", root / "videos", "--model", "dab-tiny", "--workers", "0"]
    res = invoke([*args, "--out", store, "--quiet"])
    assert res.exit_code == 0, res.output
    elsewhere = text_store(root / "elsewhere.h5")
    run, _ = hand_made_run(root / "run", elsewhere, "dab")
    return {"root": root, "store": store, "run": run}


def test_a_folder_without_annotations_is_one_uncaptioned_split(library: dict) -> None:
    with open_store(library["store"]) as st:
        assert st.splits() == ["uncaptioned"] and st.num_captions == 0
        assert sorted(st.video_ids.tolist()) == ["a", "b", "trip/c", "trip/d"]
        every = st.load_split("all")
        assert len(every.video_ids) == 4 and len(every.caption_ids) == 0
        np.testing.assert_array_equal(every.video_index, np.arange(4))


def test_the_whole_library_is_searched_with_split_all(library: dict) -> None:
    run, store = library["run"], library["store"]
    res = invoke(["search", "--run", run, "--features", store, "--split", "all", "-k", "4", "--json", "a query"])
    assert res.exit_code == 0, res.output
    hits = json.loads(res.stdout)[0]["hits"]
    assert sorted(h["video_id"] for h in hits) == ["a", "b", "trip/c", "trip/d"]
    refused = invoke(["search", "--run", run, "--features", store, "a query"])  # the default split, test
    assert refused.exit_code != 0 and "no split 'test'" in refused.output and "'all'" in refused.output
    assert "Traceback" not in refused.output


def test_an_index_over_every_split_answers_as_the_exact_search(library: dict) -> None:
    pytest.importorskip("faiss")
    run, store, index = library["run"], library["store"], library["root"] / "index"
    res = invoke(["index", "--features", store, "--split", "all", "--out", index])
    assert res.exit_code == 0, res.output
    exact = run_search(SearchConfig(run, store, ["a query"], k=4, split="all", device="cpu"))[0]
    short = run_search(SearchConfig(run, store, ["a query"], k=4, split="all", device="cpu", index=index, shortlist=4))[
        0
    ]
    assert [h.video_id for h in short.hits] == [h.video_id for h in exact.hits]
    np.testing.assert_allclose([h.cost for h in short.hits], [h.cost for h in exact.hits], rtol=1e-4)


def test_split_all_is_served(library: dict) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from dab_pipeline.stages.serve import create_app

    with Searcher(library["run"], library["store"], split="all", device="cpu") as searcher:
        with TestClient(create_app(searcher)) as client:
            assert client.get("/healthz").json()["videos"] == 4
            assert len(client.get("/search", params={"q": "a query", "k": 4}).json()["hits"]) == 4


def test_dab_world_names_the_words_it_cannot_read() -> None:
    bundle = load_clip("dab-world", None)
    got = unknown_words(bundle, ["a man talking in a car.", "a large red circle", "a Large, RED circle!"])
    assert got == [("man", "talking", "in", "car"), (), ()]
    # a model with its whole token table knows every word
    assert unknown_words(load_clip("dab-tiny", None), ["a man talking in a car"]) == [()]


@pytest.fixture()
def zebra_blind(tmp_path: Path):
    """A Searcher over a dab-tiny store whose CLIP has lost the tokens of 'zebra' (as dab-world lacks words)."""
    store = text_store(tmp_path / "store.h5")
    run, _ = hand_made_run(tmp_path / "run", store, "dab")
    warned: list[str] = []
    searcher = Searcher(run, store, device="cpu", warn=warned.append)
    table = searcher.bundle.model.token_embedding.weight  # (vocab, W)
    known = torch.ones(len(table), dtype=torch.bool)
    known[searcher.bundle.tokenizer.encode("zebra")] = False
    searcher.bundle.known_tokens = known  # ClipBundle.known_tokens, computed on first use: given here
    yield searcher, warned
    searcher.close()


def test_a_query_with_unknown_words_warns_once_and_its_result_says_so(zebra_blind) -> None:
    searcher, warned = zebra_blind
    res = searcher.search([SEARCH_CAPTIONS[0], "a zebra, running"], 2)
    assert res[0].unknown_words == () and res[1].unknown_words == ("zebra",)
    assert warned == [
        "query 'a zebra, running': dab-tiny does not know the word 'zebra' (no embedding): it is read as a blank; "
        "rephrase with words its captions use"
    ]
    batch = searcher.search_batch(["zebra", SEARCH_CAPTIONS[1]], 2)  # a server's batch: in the result, no log line
    assert batch[0].unknown_words == ("zebra",) and batch[1].unknown_words == () and len(warned) == 1


def test_the_api_and_the_page_show_the_unknown_words(zebra_blind) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from dab_pipeline.stages.serve import create_app

    searcher, _ = zebra_blind
    with TestClient(create_app(searcher)) as client:
        assert client.get("/search", params={"q": "a zebra"}).json()["unknown_words"] == ["zebra"]
        assert client.get("/search", params={"q": SEARCH_CAPTIONS[0]}).json()["unknown_words"] == []
        page = client.get("/", params={"q": "a zebra"}).text
        assert 'data-unknown-words="zebra"' in page and "does not know" in page


def test_search_serve_and_the_api_share_one_default_precision() -> None:
    """One confidence for one query: `dab search`, `dab serve`, SearchConfig, ServeConfig, SearcherOptions and
    Searcher default to the precision `dab train` scores a run's test costs in."""
    from dab_pipeline.cli import cli, register_commands
    from dab_pipeline.runs.config import TrainConfig

    register_commands()
    defaults = {
        name: next(p.default for p in cli.commands[name].params if p.name == "dtype") for name in ("search", "serve")
    }
    assert defaults == {"search": DEFAULT_SCORE_DTYPE, "serve": DEFAULT_SCORE_DTYPE}
    from dab_pipeline.search import SearcherOptions
    from dab_pipeline.stages.serve import ServeConfig

    for config in (ServeConfig, SearcherOptions):
        assert config.__dataclass_fields__["dtype"].default == DEFAULT_SCORE_DTYPE
    assert inspect.signature(Searcher).parameters["dtype"].default == DEFAULT_SCORE_DTYPE
    assert SearchConfig.__dataclass_fields__["dtype"].default == DEFAULT_SCORE_DTYPE
    assert TrainConfig.__dataclass_fields__["score_dtype"].default == DEFAULT_SCORE_DTYPE == "float32"
