"""`dab serve` over a run calibrated on another gallery than the one it serves: a set or a risk decision asked of
the API or the page is refused with the server's own way out (restart it on the gallery calibrated on, or after
calibrating on this one where that can be done), not `dab search`'s options."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dab_pipeline.search import Searcher
from dab_pipeline.stages.calibrate import CalibrateConfig, run_calibrate

from ..helpers.models import calibrated_run
from ..helpers.stores import SEARCH_CAPTIONS

pytest.importorskip("sklearn")
pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run calibrated on every video of its store (`--gallery all`), a copy calibrated on split 'val'."""
    root = tmp_path_factory.mktemp("served-gallery")
    on_all, store = calibrated_run(root)
    on_val = shutil.copytree(on_all, root / "val")
    run_calibrate(CalibrateConfig(run=on_val, device="cpu"))
    return {"store": store, "all": on_all, "val": Path(on_val)}


def _refusals(run: Path, store: Path, split: str) -> tuple[str, str]:
    """What the API and the page say to a set asked of a server of ``split``."""
    from fastapi.testclient import TestClient

    from dab_pipeline.stages.serve import create_app

    with Searcher(run, store, split=split, device="cpu") as s, TestClient(create_app(s)) as c:
        api = c.get("/search", params={"q": SEARCH_CAPTIONS[0], "coverage": "0.9"})
        page = c.get("/", params={"q": SEARCH_CAPTIONS[0], "max_risk": "0.2"})
    assert api.status_code == 400 and page.status_code == 400, (api.text, page.status_code)
    assert 'data-error="1"' in page.text
    return api.json()["error"], page.text


def test_a_server_of_another_gallery_says_to_restart_it_on_the_one_calibrated_on(runs: dict) -> None:
    """Served split 'test', calibrated on 'all': `search --split all` is a `dab search` option a server's user
    cannot give, and 'test' cannot be calibrated on (it lacks the 'val' videos): only the restart is offered."""
    import html

    said, page = _refusals(runs["all"], runs["store"], "test")
    assert said == (
        f"{runs['all']} was calibrated on another gallery than this server's (split 'test'): restart it with "
        "`dab serve --split all` for sets and risk decisions"
    )
    assert said in html.unescape(page)  # the page says what the API says
    assert "search --split" not in said and "dab calibrate" not in said


def test_a_server_of_a_gallery_that_can_be_calibrated_on_offers_that_too(runs: dict) -> None:
    import html

    said, page = _refusals(runs["val"], runs["store"], "all")
    assert said.startswith(f"{runs['val']} was calibrated on another gallery than this server's (split 'all'): ")
    assert said.endswith(
        f"restart it with `dab serve --split val` for sets and risk decisions, or after "
        f"`dab calibrate --run {runs['val']} --gallery all`"
    )
    assert said in html.unescape(page)
