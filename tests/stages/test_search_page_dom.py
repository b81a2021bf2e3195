"""The search page shows the conformal set on the hits and the unanswered state (issue 61, item 3): the DOM as
served, and as headless Chromium builds it where Chromium is installed (scripts/screenshot_search.sh's browser)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ..helpers.models import hand_made_run
from ..helpers.stores import SEARCH_CAPTIONS, text_store

pytest.importorskip("sklearn")
pytest.importorskip("fastapi")

VAL = [f"a {c} {t}" for c in ("red", "blue", "green", "white", "black") for t in ("ball", "dog", "car", "cat")]


class _Elements(HTMLParser):
    """Every element's tag and attributes, and the page's text."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data) -> None:
        self.text.append(data)


def _dom(html: str) -> _Elements:
    p = _Elements()
    p.feed(html)
    return p


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fastapi.testclient import TestClient

    from dab_pipeline.search import Searcher
    from dab_pipeline.stages.calibrate import CalibrateConfig, run_calibrate
    from dab_pipeline.stages.serve import create_app

    root = tmp_path_factory.mktemp("page")
    store = text_store(root / "store.h5", SEARCH_CAPTIONS + VAL, frames=4, splits=["test"] * 8 + ["val"] * 20)
    run, _ = hand_made_run(root / "run", store, "dab")
    run_calibrate(CalibrateConfig(run=run, device="cpu", gallery="all"))
    with Searcher(run, store, split="all", device="cpu") as s, TestClient(create_app(s)) as c:
        got = c.get("/", params={"q": "a red ball", "coverage": "0.9", "max_risk": "0.01"})
    assert got.status_code == 200, got.text
    return got.text


def _check(dom: _Elements) -> None:
    hits = [a for tag, a in dom.elements if tag == "div" and "data-rank" in a]
    marked = [a for a in hits if a.get("data-in-set") == "1"]
    assert hits and marked and all("in-set" in a["class"] for a in marked)  # the set's hits are marked
    rows = [a for tag, a in dom.elements if tag == "div" and a.get("data-unanswered") == "1"]
    assert len(rows) == 1 and "unanswered" in rows[0]["class"]  # max risk 0.01 answers nothing: the hits say so
    text = " ".join(" ".join(dom.text).split())
    assert "not answered" in text and "in the 90 % set" in text
    assert "scored videos, by cost" in text and "re-ranked videos" not in text  # every video was scored
    rest = [a for tag, a in dom.elements if tag == "details" and "data-set-rest" in a]
    size = next(int(a["data-set-size"]) for tag, a in dom.elements if "data-set-size" in a)
    assert (int(rest[0]["data-set-rest"]) if rest else 0) == size - len(marked)  # the rest of the set, paged


def test_the_page_marks_the_set_and_the_unanswered_hits(page: str) -> None:
    _check(_dom(page))


def test_headless_chromium_builds_the_same_marks(page: str, tmp_path: Path) -> None:
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chrome is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium)")
    html = tmp_path / "page.html"
    html.write_text(page)
    done = subprocess.run(
        [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--dump-dom", html.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "<html" in done.stdout, done.stderr[-2000:]
    _check(_dom(done.stdout))
