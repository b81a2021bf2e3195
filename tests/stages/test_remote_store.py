"""The pipeline on a store in S3 (a local moto endpoint the test starts): extract, train (with its test
evaluation), index and search through the URL give what they give on the same store on disk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ..helpers.runner import extract_args, invoke
from ..helpers.s3 import CuttingProxy, local_s3, s3_environment

TRAIN = [
    "--variant",
    "dab",
    "--quiet",
    *[x for s in ("epochs=1", "batch_size=4", "model.steps=2") for x in ("--set", s)],
]


@pytest.fixture(scope="module")
def s3():
    with local_s3() as endpoint:
        yield endpoint


def _ok(args: list) -> str:
    res = invoke([str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.slow  # about 25 s: two extractions, two trainings
def test_extract_train_index_search_through_an_s3_url(s3: str, tiny_folder_dataset: Path, tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    url, disk = "s3://dab/tiny.zarr", tmp_path / "tiny.zarr"
    for out in (url, disk):
        _ok(extract_args(tiny_folder_dataset, "--store-dtype", "float32", "--quiet", out=out))
    assert "nothing to do" in _ok(extract_args(tiny_folder_dataset, out=url))  # a rerun resumes: complete
    metrics = {}
    for name, store in (("url", url), ("disk", disk)):
        run = tmp_path / f"run_{name}"
        _ok(["train", "--features", store, "--out", run, *TRAIN])
        assert json.loads((run / "config.json").read_text())["features"] == str(store)
        metrics[name] = (run / "metrics.jsonl").read_text().splitlines()[-1]
        _ok(
            [
                "index",
                "--features",
                store,
                "--run",
                run,
                "--split",
                "all",
                "--out",
                tmp_path / f"index_{name}",
                "--quiet",
            ]
        )
    assert _numbers(metrics["url"]) == _numbers(metrics["disk"])  # the same training on the same bytes
    searches = {}
    for name, store in (("url", url), ("disk", disk)):
        run, index = tmp_path / f"run_{name}", tmp_path / f"index_{name}"
        for extra in ([], ["--index", index]):
            out = _ok(
                [
                    "search",
                    "--run",
                    run,
                    "--features",
                    store,
                    "--split",
                    "all",
                    "-k",
                    "3",
                    "--json",
                    *extra,
                    "another caption of clip 2",
                ]
            )
            searches[(name, bool(extra))] = [(h["video_id"], h["cost"]) for h in json.loads(out)[0]["hits"]]
    # the same videos in the same order; costs within a tolerance: with and without the index the re-rank scores
    # batches of other shapes, whose last bits may differ (a rounding to 4 places flipped once, 113.9612 / .9611)
    want = searches[("disk", True)]
    for key, got in searches.items():
        assert [v for v, _ in got] == [v for v, _ in want], key
        np.testing.assert_allclose([c for _, c in got], [c for _, c in want], rtol=1e-5, err_msg=str(key))
    _serve_answers_as_search(url, tmp_path / "run_url", tmp_path / "index_url", searches[("disk", True)])


def _serve_answers_as_search(url: str, run: Path, index: Path, want: list) -> None:
    """dab serve's app over the s3:// store answers what dab search answered on disk, and stays healthy."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from dab_pipeline.search import Searcher
    from dab_pipeline.stages.serve import ServeSettings, create_app

    searcher = Searcher(run, url, index=index, split="all", device="cpu")
    try:
        with TestClient(create_app(searcher, ServeSettings(k=3, max_k=3))) as client:
            body = client.get("/search", params={"q": "another caption of clip 2", "k": 3}).json()
            assert [h["video_id"] for h in body["hits"]] == [v for v, _ in want]
            np.testing.assert_allclose([h["cost"] for h in body["hits"]], [c for _, c in want], rtol=1e-5)
            assert client.get("/healthz").status_code == 200
    finally:
        searcher.close()


def _numbers(line: str) -> dict:
    return {
        k: v
        for k, v in json.loads(line).items()
        if isinstance(v, (int, float)) and "second" not in k and "time" not in k
    }


def test_bad_urls_are_one_line(s3: str, tmp_path: Path) -> None:
    for args, said in (
        (["index", "--features", "nope://b/s.zarr", "--out", tmp_path / "i"], "unknown storage protocol 'nope'"),
        (["index", "--features", "s3://dab/absent.zarr", "--out", tmp_path / "i"], "does not exist"),
        (["index", "--features", "s3://k:secret@dab/s.zarr", "--out", tmp_path / "i"], "credentials in a store URL"),
    ):
        res = invoke([str(a) for a in args])
        assert res.exit_code != 0 and said in res.output and "Traceback" not in res.output, res.output
        assert "secret" not in res.output


@pytest.mark.slow  # about 15 s: two extractions through moto (the store's half is quick: test_remote.py)
def test_losing_the_endpoint_during_an_extract_is_one_line_and_the_same_command_resumes(
    s3: str, tiny_folder_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 59, item 6: the endpoint lost once the first batch is written is one line saying how to resume (it was
    three chained tracebacks from write_thumbnails), and the same command, the endpoint back, finishes the store."""
    from dab_pipeline.store import STATUS_OK, FeatureStore, open_store

    url = "s3://dab/lost-extract.zarr"  # moto keeps one state a process: a name no other test uses
    args = extract_args(tiny_folder_dataset, "--quiet", "--frames", "2", "--limit", "4", out=url)
    proxy = CuttingProxy(int(s3.rsplit(":", 1)[1]))
    write_videos = FeatureStore.write_videos

    def then_lose_the_endpoint(self, *a, **k):
        write_videos(self, *a, **k)
        proxy.go_down()

    try:
        with monkeypatch.context() as m, s3_environment(proxy.endpoint):
            m.setattr(FeatureStore, "write_videos", then_lose_the_endpoint)
            res = invoke(args)
    finally:
        proxy.close()
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert lines[0].startswith(f"Error: cannot write {url}/videos/"), lines[0]
    assert "check the endpoint and the network" in lines[0] and "rerun the same command to resume" in lines[0]
    assert "2 already done" in _ok(args)  # the endpoint back (moto itself): the batch written before is kept
    with open_store(url) as st:
        assert st.is_complete and (st.status() == STATUS_OK).all()


@pytest.mark.slow  # about 7 s: a process of its own (torch's import); the store's half is quick (test_remote.py)
def test_an_s3_extract_closes_its_http_sessions(s3: str, tiny_folder_dataset: Path) -> None:
    """issue 59, item 8e: every s3:// extract ended with aiohttp's "ERROR:asyncio:Unclosed client session" (zarr's
    asynchronous filesystems were never closed); they show only as the process ends, so it runs as a user's does."""
    args = extract_args(tiny_folder_dataset, "--quiet", "--frames", "2", "--limit", "2", out="s3://dab/closed.zarr")
    done = subprocess.run(
        [sys.executable, "-m", "dab_pipeline.cli", *args], capture_output=True, text=True, timeout=300
    )  # the environment (moto's endpoint, its keys) is the test's
    assert done.returncode == 0, done.stderr
    assert "2 videos encoded" in done.stdout, done.stdout
    assert "Unclosed" not in done.stderr and "asyncio" not in done.stderr, done.stderr
