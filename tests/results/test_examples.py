"""Result pages (examples.html, dab search --html): thumbnails in the store, sampling, and what the page shows."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dab_pipeline.metrics import t2v_ranks
from dab_pipeline.results.page import select_queries
from dab_pipeline.results.thumbnails import THUMB_BYTES, make_thumbnail
from dab_pipeline.runs.costfile import read_costs
from dab_pipeline.store import open_store

from ..helpers.runner import extract_args, invoke


class _Page(HTMLParser):
    """Query blocks, their hits and images, as the browser would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[dict] = []
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        a = dict(attrs)
        if tag == "div" and "data-query" in a:
            self.queries.append({"hits": [], "gt_rank": None})
        elif tag == "div" and "data-rank" in a and self.queries:
            self.queries[-1]["hits"].append((int(a["data-rank"]), a["data-video"]))
        elif tag == "span" and "data-gt-rank" in a and self.queries:
            self.queries[-1]["gt_rank"] = int(a["data-gt-rank"])
        elif tag == "img":
            self.images.append(a["src"])


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    page.close()
    return page


def _decodes(uri: str) -> tuple[int, int]:
    head, data = uri.split(",", 1)
    assert head in ("data:image/jpeg;base64", "data:image/png;base64"), head
    img = Image.open(io.BytesIO(base64.b64decode(data)))
    img.load()
    return img.size


def test_thumbnail_is_a_small_strip_of_real_frames() -> None:
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (240, 320, 3), dtype=np.uint8) for _ in range(12)]
    mask = np.array([True] * 5 + [False] * 7)
    data = make_thumbnail(frames, mask)
    assert len(data) <= THUMB_BYTES
    img = Image.open(io.BytesIO(data))
    assert img.format == "JPEG" and img.height == 96 and img.width == 3 * 128


def test_selection_spreads_over_confidence_and_keeps_failures() -> None:
    rng = np.random.default_rng(1)
    cost = rng.standard_normal((200, 50))
    gt = rng.integers(0, 50, 200)
    a = select_queries(cost, gt, 24, seed=3)
    assert len(a) == 24 == len(set(a.tolist()))
    np.testing.assert_array_equal(a, select_queries(cost, gt, 24, seed=3))  # deterministic per seed
    assert not np.array_equal(a, select_queries(cost, gt, 24, seed=4))
    ranks = t2v_ranks(cost, gt)
    assert (ranks[a] > 1).sum() >= 6  # a quarter failures (most queries fail on a random matrix anyway)
    margin = np.sort(cost, 1)[:, 1] - np.sort(cost, 1)[:, 0]
    assert margin[a].max() > np.quantile(margin, 0.8) and margin[a].min() < np.quantile(margin, 0.2)
    assert list(margin[a]) == sorted(margin[a], reverse=True)  # most confident first
    assert len(select_queries(cost[:5], gt[:5], 24)) == 5


def _extract(captions: Path, out: Path, *extra: str):
    args = extract_args(captions, "--dtype", "float32", "--quiet", *extra, out=out)
    return invoke(args, catch_exceptions=False)


def _train(store: Path, out: Path):
    # scored on the train split (8 captions x 4 videos), so the page has failures and successes
    args = [
        "train",
        "--features",
        str(store),
        "--variant",
        "xpool",
        "--epochs",
        "1",
        "--batch-size",
        "2",
        "--set",
        "test_split=train",
        "--out",
        str(out),
        "--quiet",
    ]
    return invoke(args, catch_exceptions=False)


@pytest.mark.slow
def test_examples_page_shows_what_the_cost_matrix_says(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    store, run = tmp_path / "s.h5", tmp_path / "run"
    assert _extract(tiny_folder_dataset, store).exit_code == 0
    with open_store(store) as st:
        assert st.thumbnail_bytes == THUMB_BYTES and "thumbnails" in st.manifest
        assert all(t is not None for t in st.read_thumbnails(range(st.num_videos)))
    assert _train(store, run).exit_code == 0
    res = invoke(["evaluate", "--run", str(run), "--examples", "5"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    page = _parse(run / "examples.html")
    assert len(page.queries) == 5
    assert page.images and all(_decodes(u) for u in page.images)  # every embedded image decodes
    cm = read_costs(run / "costs_train.h5")
    cost, gt = cm.to_cost() if hasattr(cm, "to_cost") else cm.cost, np.asarray(cm.gt)
    ranks = t2v_ranks(cost, gt)
    picks = select_queries(cost, gt, 5, seed=0)
    assert [q["gt_rank"] for q in page.queries] == [int(ranks[i]) for i in picks]
    for q, i in zip(page.queries, picks):
        order = np.argsort(cost[i], kind="stable")[:4]
        assert [v for _, v in q["hits"]] == [str(cm.video_ids[j]) for j in order]
        assert [r for r, _ in q["hits"]] == list(range(1, len(order) + 1))
    again = tmp_path / "again"
    invoke(["evaluate", "--run", str(run), "--examples", "5", "--out", str(again)], catch_exceptions=False)
    strip = lambda p: re.sub(r"data:image/png;base64,[^\"]+", "", p.read_text())  # noqa: E731
    assert strip(again / "examples.html") == strip(run / "examples.html")  # the same page again

    html = tmp_path / "search.html"
    res = invoke(
        [
            "search",
            "--run",
            str(run),
            "--features",
            str(store),
            "--split",
            "train",
            "-k",
            "3",
            "--html",
            str(html),
            "clip number 1",
            "another caption",
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    page = _parse(html)
    assert len(page.queries) == 2 and all(len(q["hits"]) == 3 for q in page.queries)
    assert all(_decodes(u) for u in page.images)


@pytest.mark.slow
def test_a_store_without_thumbnails_gives_a_page_without_images(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    store, run = tmp_path / "old.h5", tmp_path / "run"
    assert _extract(tiny_folder_dataset, store, "--set", "thumbnails=false").exit_code == 0
    with open_store(store) as st:
        assert st.thumbnail_bytes == 0 and st.read_thumbnails([0, 1]) == [None, None]
    assert _train(store, run).exit_code == 0
    res = invoke(["evaluate", "--run", str(run), "--examples", "3", "--no-plots"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    page = _parse(run / "examples.html")
    assert len(page.queries) == 3 and page.images == []
    assert "no thumbnail" in (run / "examples.html").read_text()
