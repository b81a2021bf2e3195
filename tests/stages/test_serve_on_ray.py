"""dab serve --ray: the CLI's checks before any replica starts, the retry policy, and (slow) the Serve application
on a local Ray cluster: the same answers and page as `dab serve`, a re-rank replica killed under load replaced with
no query lost or answered wrongly."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import ServiceUnavailableError, StoreError
from dab_pipeline.index import build_sharded_index
from dab_pipeline.store import open_store

from ..helpers.models import hand_made_run
from ..helpers.runner import invoke
from ..helpers.stores import text_store

pytest.importorskip("faiss")

CAPTIONS = [f"{a} {b} in the {c}" for a in ("a dog", "a cat", "two kids", "a car") for b in ("runs", "sleeps", "jumps")
            for c in ("park", "snow", "kitchen", "street", "rain")]  # fmt: skip
TEST_VIDEOS = 48


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("on-ray")
    store = text_store(root / "s.h5", CAPTIONS, test_videos=TEST_VIDEOS, frames=4)
    run, _ = hand_made_run(root / "run", store)
    with open_store(store) as st:
        build_sharded_index(st, root / "idx", shards=3, split="test", factory="IVF4,Flat", nprobe=4)
    return {"store": store, "run": run, "index": root / "idx", "root": root}


def serve_args(world: dict, *extra: str) -> list:
    return ["serve", "--run", world["run"], "--features", world["store"], "--index", world["index"], *extra]


def test_ray_options_without_ray_are_refused_in_one_line(world: dict) -> None:
    res = invoke(serve_args(world, "--replicas", "2", "--ray-address", "host:6379"))
    assert res.exit_code == 2 and "--replicas, --ray-address needs --ray" in res.output
    assert "Traceback" not in res.output


def test_ray_absent_names_the_extra(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where the extra is not installed
    res = invoke(serve_args(world, "--ray"))
    assert res.exit_code == 2 and "pip install 'dab-pipeline[ray]'" in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_a_bad_index_is_one_line_before_ray_starts(
    world: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver checks the run, the store and the shards (without their FAISS files) as every replica will."""
    pytest.importorskip("ray")
    from dab_pipeline.stages.serve import on_ray

    monkeypatch.setattr(on_ray, "deploy", lambda *a, **kw: pytest.fail("deployed"))
    other = text_store(tmp_path / "other.h5", CAPTIONS[:-1], test_videos=TEST_VIDEOS, frames=4)
    with open_store(other) as st:
        build_sharded_index(st, tmp_path / "idx", shards=2, split="test", factory="Flat")
    res = invoke(serve_args({**world, "index": tmp_path / "idx"}, "--ray"))
    assert res.exit_code != 0 and "was built from another store" in res.output, res.output
    assert "Traceback" not in res.output
    (tmp_path / "idx" / "shard-001" / "index.json").unlink()
    res = invoke(serve_args({**world, "index": tmp_path / "idx"}, "--ray"))
    assert res.exit_code != 0 and "shard-001 is not a dab index folder" in res.output, res.output


def test_the_cli_deploys_what_it_was_given(world: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from dab_pipeline.stages.serve import on_ray

    got = {}

    def deploy(cfg, host, port, address=None, connected=None):
        got.update(cfg=cfg, host=host, port=port, address=address)
        raise KeyboardInterrupt  # as Ctrl-C: the CLI shuts Serve down and exits

    monkeypatch.setattr(on_ray, "deploy", deploy)
    monkeypatch.setattr(on_ray, "shutdown", lambda: got.update(shut=True))
    monkeypatch.chdir(world["root"])
    args = ["serve", "--run", "run", "--features", "s.h5", "--index", "idx", "--ray", "--replicas", "3"]
    res = invoke([*args, "--shard-replicas", "2", "--threads", "1", "--port", "0", "--ray-address", "x:1", "-k", "7"])
    assert res.exit_code == 0, res.output
    cfg = got["cfg"]
    assert (cfg.replicas, cfg.shard_replicas, cfg.threads, cfg.settings.k) == (3, 2, 1, 7)
    # paths as every machine of the cluster reads them, not relative to this shell's folder
    assert (cfg.run_dir, cfg.features, cfg.index_dir) == tuple(
        str(world[n].resolve()) for n in ("run", "store", "index")
    )
    assert got["port"] > 0 and got["address"] == "x:1" and got["shut"]
    assert "3 re-rank replica(s), 3 shard deployment(s)" in res.output


class _Lost:
    """A handle whose first ``lose`` requests fail as a dead replica's do, then answer ``answer``."""

    def __init__(self, lose: int, answer) -> None:
        from ray.exceptions import ActorDiedError

        self.left, self.out, self.error = lose, answer, ActorDiedError
        self.asked = 0
        self.answer = self

    def remote(self, items: list):
        self.asked += 1
        if self.left:
            self.left -= 1
            raise self.error()
        return _Done([self.out] * len(items))


class _Done:
    def __init__(self, out) -> None:
        self.out = out

    def __await__(self):
        yield from ()
        return self.out

    def result(self):
        return self.out


@pytest.mark.parametrize("lose", [0, 1, 3])
def test_a_query_whose_replica_died_is_asked_again(lose: int, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    import asyncio

    from dab_pipeline.stages.serve import on_ray

    monkeypatch.setattr(on_ray, "RETRY_WAIT_S", 0.0)
    for how in ("answer", "submit"):
        handle = _Lost(lose, "the answer")
        answers = on_ray.RayAnswers(handle, on_ray.RayServeConfig(run_dir="r", features="s"))
        out = asyncio.run(answers.answer("q", 3)) if how == "answer" else answers.submit("q", 3)
        assert out == "the answer" and handle.asked == lose + 1
        stats = answers.stats()
        answers.close()
        assert (stats["queries"], stats["retried"], stats["failed"]) == (1, lose, 0)


def test_a_query_lost_more_than_the_retries_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    import asyncio

    from dab_pipeline.stages.serve import on_ray

    monkeypatch.setattr(on_ray, "RETRY_WAIT_S", 0.0)
    for how in ("answer", "submit"):
        handle = _Lost(on_ray.RETRIES + 1, "never")
        answers = on_ray.RayAnswers(handle, on_ray.RayServeConfig(run_dir="r", features="s"))
        with pytest.raises(ServiceUnavailableError, match=f"lost {on_ray.RETRIES + 1} times"):
            asyncio.run(answers.answer("q", 3)) if how == "answer" else answers.submit("q", 3)
        answers.close()
        assert handle.asked == on_ray.RETRIES + 1 and answers.stats()["failed"] == 1


def test_a_replica_error_is_the_query_s_own_and_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch returns each query's error as a value (the others of the batch keep their answers)."""
    pytest.importorskip("ray")
    import asyncio

    from dab_pipeline.stages.serve import on_ray

    handle = _Lost(0, StoreError("store.h5 changed"))
    answers = on_ray.RayAnswers(handle, on_ray.RayServeConfig(run_dir="r", features="s"))
    with pytest.raises(StoreError, match="store.h5 changed"):
        asyncio.run(answers.answer("q", 3))
    answers.close()
    assert handle.asked == 1 and answers.stats()["failed"] == 1


def test_shard_requests_lost_when_sent_or_awaited_are_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """shard_call: every shard asked before any answer is awaited; a request lost as it is sent or while it runs
    is sent again, and each shard's answer is its own."""
    pytest.importorskip("ray")
    from ray.exceptions import ActorDiedError

    from dab_pipeline.stages.serve import on_ray

    monkeypatch.setattr(on_ray, "RETRY_WAIT_S", 0.0)

    class Shard:
        def __init__(self, name: str, lose_at_send: int, lose_at_result: int) -> None:
            self.name, self.send, self.result_ = name, lose_at_send, lose_at_result
            self.candidates = self
            self.asked = 0

        def remote(self, x):
            self.asked += 1
            if self.send:
                self.send -= 1
                raise ActorDiedError()
            shard = self

            class Response:
                def result(self):
                    if shard.result_:
                        shard.result_ -= 1
                        raise ActorDiedError()
                    return (shard.name, x)

            return Response()

    shards = [Shard("a", 1, 0), Shard("b", 0, 2), Shard("c", 0, 0)]
    out = on_ray.shard_call(shards)("candidates", {0: (1,), 1: (2,), 2: (3,)})
    assert out == {0: ("a", 1), 1: ("b", 2), 2: ("c", 3)}
    assert [s.asked for s in shards] == [2, 3, 1]


# --------------------------------------------------------------------------- a local Ray cluster (slow)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _same_answer(got: dict, want: dict, what: str) -> None:
    assert [h["video_id"] for h in got["hits"]] == [h["video_id"] for h in want["hits"]], what
    np.testing.assert_allclose([h["cost"] for h in got["hits"]], [h["cost"] for h in want["hits"]], rtol=1e-4)
    assert got["margin"] == pytest.approx(want["margin"], rel=1e-3, abs=1e-4), what
    assert got["abstain"] == want["abstain"], what


@pytest.mark.slow
def test_ray_serve_answers_as_dab_serve_and_survives_a_killed_replica(world: dict) -> None:
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.serve")
    from fastapi.testclient import TestClient

    from dab_pipeline.search import Searcher
    from dab_pipeline.stages.serve import ServeSettings, create_app
    from dab_pipeline.stages.serve.on_ray import RayServeConfig, deploy, shutdown

    settings = ServeSettings(k=5, shortlist=20, abstain_below=1.0, max_batch=8)
    queries = [CAPTIONS[i] for i in range(0, TEST_VIDEOS, 4)] + ["a horse in the snow", "nothing like the others"]
    with Searcher(world["run"], world["store"], index=world["index"], device="cpu") as searcher:
        local = TestClient(create_app(searcher, settings))
        want = {q: local.get("/search", params={"q": q, "k": 5}).json() for q in queries}
        bad = local.get("/search", params={"q": "", "k": 5})
    cfg = RayServeConfig(
        run_dir=str(world["run"]), features=str(world["store"]), index_dir=str(world["index"]), settings=settings,
        replicas=2, threads=1,
    )  # fmt: skip
    try:
        url = deploy(cfg, "127.0.0.1", _free_port())
        for q in queries:  # the same answers as dab serve's app in this process
            status, body = _get(f"{url}search?{urllib.parse.urlencode({'q': q, 'k': 5})}")
            assert status == 200, body
            _same_answer(json.loads(body), want[q], q)
        status, body = _get(f"{url}search?q=&k=5")  # the same checks, the same one-line refusal
        assert (status, json.loads(body)) == (bad.status_code, bad.json())
        status, body = _get(f"{url}?{urllib.parse.urlencode({'q': queries[0]})}")
        assert status == 200 and all(h["video_id"].encode() in body for h in want[queries[0]]["hits"])
        health = json.loads(_get(f"{url}healthz")[1])
        assert health["ok"] and health["batching"]["engine"] == "ray serve" and health["batching"]["shards"] == 3

        # under load, one of the two re-rank replicas killed: every query answered, and right. A replica runs one
        # batch at a time and the ingress keeps one in flight a replica, so a kill almost always costs a batch in
        # flight, asked again of the other replica; where it fell between two batches (nothing lost, nothing to
        # show), the replacement is killed in its turn, at most 3 kills in all
        clients = 3 * 2 * settings.max_batch
        for kill in range(3):
            killed = _kill_one_under_load(ray, url, queries, want, clients)
            _wait_for_a_replacement(ray, killed)
            stats = json.loads(_get(f"{url}healthz")[1])["batching"]
            assert stats["failed"] == 0, stats
            if stats["retried"]:
                break
        assert stats["retried"] >= 1, stats  # a kill did cost queries in flight: the retry answered them
        assert stats["queries"] >= 2 * stats["batches"], stats  # the queries were gathered into batches
        status, body = _get(f"{url}search?{urllib.parse.urlencode({'q': queries[1], 'k': 5})}")
        assert status == 200
        _same_answer(json.loads(body), want[queries[1]], queries[1])
    finally:
        shutdown()


def _kill_one_under_load(ray, url: str, queries: list[str], want: dict, clients: int) -> str:
    """``clients`` clients send 6 queries each; once a sixth are answered a re-rank replica is killed; every query
    must be answered, and right. -> the killed replica's name."""
    before = _rerank_replicas(ray)
    assert len(before) == 2

    def ask(i: int) -> tuple[str, int, bytes]:
        q = queries[i % len(queries)]
        return (q, *_get(f"{url}search?{urllib.parse.urlencode({'q': q, 'k': 5})}"))

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(ask, i) for i in range(6 * clients)]
        while sum(f.done() for f in futures) < clients:
            time.sleep(0.02)
        ray.kill(ray.get_actor(before[0], namespace="serve"), no_restart=True)
        answered = [f.result() for f in futures]
    for q, status, body in answered:
        assert status == 200, body
        _same_answer(json.loads(body), want[q], q)
    return before[0]


def _wait_for_a_replacement(ray, killed: str) -> None:
    deadline = time.monotonic() + 180  # Serve starts a replacement: two replicas again, one of them new
    while not (len(now := _rerank_replicas(ray)) == 2 and killed not in now and _running(ray)):
        assert time.monotonic() < deadline, f"no replacement replica: {now}"
        time.sleep(1)


def _rerank_replicas(ray) -> list[str]:
    named = ray.util.list_named_actors(all_namespaces=True)  # the live ones
    return sorted(a["name"] for a in named if a["name"].startswith("SERVE_REPLICA::dab#rerank#"))


def _running(ray) -> bool:
    from ray import serve

    app = serve.status().applications.get("dab")
    return app is not None and app.deployments["rerank"].replica_states.get("RUNNING", 0) == 2
