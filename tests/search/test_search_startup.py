"""A search's start-up (issue 61, item 6): the search path imports neither open_clip's package nor what it
imports (torchvision, with torch._dynamo, and timm: about 1.5 s of CPU), and a search of a store built with a
plain CLIP encodes its query with dab's TextTower. Checked in a fresh interpreter; no times are asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..helpers.models import hand_made_run
from ..helpers.stores import SEARCH_CAPTIONS, text_store

HEAVY = ("open_clip", "torchvision", "timm", "torch._dynamo")

SEARCH = """
import json, sys
import dab_pipeline.search, dab_pipeline.stages.search  # the library's and `dab search`'s
after_import = [m for m in {heavy!r} if m in sys.modules]
from dab_pipeline.search import Searcher
with Searcher({run!r}, {store!r}) as searcher:
    hits = [h.video_id for h in searcher.search([{query!r}], k=2)[0].hits]
    encoder = type(searcher.bundle.model).__name__
print(json.dumps({{"after_import": after_import, "after_search": [m for m in {heavy!r} if m in sys.modules],
                  "encoder": encoder, "hits": hits}}))
"""


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("startup")
    store = text_store(root / "store.h5")
    run, _ = hand_made_run(root / "run", store, "dab")
    code = SEARCH.format(heavy=HEAVY, run=str(run), store=str(store), query=SEARCH_CAPTIONS[0])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_search_leaves_open_clip_torchvision_and_timm_out(searched: dict) -> None:
    assert searched["after_import"] == []


def test_a_search_encodes_its_query_without_open_clip(searched: dict) -> None:
    assert searched["encoder"] == "TextTower"
    assert searched["after_search"] == [] and len(searched["hits"]) == 2
