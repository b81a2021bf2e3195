"""dab serve as a stage (issue 62, item 1): the URL a server prints, the socket it binds, ServeConfig and its
checks, the backends by name, the CLI that only builds the config and calls run_serve, one way to build a Searcher.
That it serves: tests/stages/test_serve.py (a real server) and test_serve_on_ray.py."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from dab_pipeline.core.errors import DabError
from dab_pipeline.stages.serve import bind_socket, served_url

from ..helpers.runner import invoke


@pytest.mark.parametrize(
    "host, port, url",
    [
        ("127.0.0.1", 8000, "http://127.0.0.1:8000/"),
        ("localhost", 0, "http://localhost:0/"),
        ("::1", 8080, "http://[::1]:8080/"),
        ("::", 80, "http://[::]:80/"),
        ("fe80::1%eth0", 9000, "http://[fe80::1%eth0]:9000/"),
    ],
)
def test_the_served_url_brackets_an_ipv6_host(host: str, port: int, url: str) -> None:
    assert served_url(host, port) == url


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(DabError, match=f"^cannot listen on 127.0.0.1:{port}: in use by another program$") as err:
            bind_socket("127.0.0.1", port)
    assert err.value.exit_code == 1
    with bind_socket("127.0.0.1", 0) as sock:  # not listening yet: bound only
        assert sock.getsockname()[1] > 0


def test_every_stage_builds_its_searcher_one_way() -> None:
    """The package builds a Searcher through search.open_searcher only (issue 62, item 1: dab search, dab serve, its
    Ray replicas and dab calibrate each called the constructor with their own choice of options)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "dab_pipeline"
    built = [
        f"{path.relative_to(root)}:{node.lineno}"
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).as_posix() != "search/searcher.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Searcher"
    ]
    assert built == []


def _given(tmp_path):
    """Paths that exist, for the CLI's path checks (nothing is loaded: run_serve is replaced)."""
    for name in ("run", "store.h5", "index"):
        (tmp_path / name).mkdir()
    (tmp_path / "about.json").write_text("{}")
    return tmp_path / "run", tmp_path / "store.h5", tmp_path / "index", tmp_path / "about.json"


@pytest.mark.parametrize("on_ray", [False, True], ids=["local", "ray"])
def test_the_cli_runs_the_config_a_python_caller_builds(tmp_path, monkeypatch: pytest.MonkeyPatch, on_ray) -> None:
    """`dab serve` parses its options into a ServeConfig and calls run_serve: a script that builds the same config
    runs what the command runs."""
    import dab_pipeline.stages.serve as stage
    from dab_pipeline.stages.serve import ServeConfig

    got: list = []
    monkeypatch.setattr(stage, "run_serve", lambda cfg, progress: got.append(cfg))
    run, store, index, about = _given(tmp_path)
    argv = ["serve", "--run", run, "--features", store, "--index", index, "--split", "val", "--host", "::1"]
    argv += ["--port", "0", "-k", "7", "--shortlist", "30", "--abstain-below", "0.5", "--descriptions", about]
    argv += ["--max-batch", "4", "--batch-wait-ms", "2", "--threads", "3", "--device", "cpu", "--dtype", "bfloat16"]
    if on_ray:
        argv += ["--ray", "--replicas", "2", "--shard-replicas", "3", "--ray-address", "host:6379"]
    out = invoke(argv)
    assert out.exit_code == 0, out.output
    ray = {"backend": "ray", "replicas": 2, "shard_replicas": 3, "ray_address": "host:6379"} if on_ray else {}
    assert got == [
        ServeConfig(
            run=str(run), features=str(store), index=str(index), split="val", host="::1", port=0, k=7, shortlist=30,
            abstain_below=0.5, descriptions=str(about), max_batch=4, batch_wait_ms=2.0, threads=3, device="cpu",
            dtype="bfloat16", **ray,
        )
    ]  # fmt: skip
    out = invoke(["serve", "--run", run, "--features", store])
    assert out.exit_code == 0 and got[-1] == ServeConfig(run, store)  # the CLI's defaults are the config's


def test_an_unknown_backend_lists_the_valid_ones() -> None:
    from dab_pipeline.core.errors import UnknownNameError
    from dab_pipeline.stages.serve import SERVE_BACKENDS, ServeConfig

    assert SERVE_BACKENDS.names() == ["local", "ray"]
    with pytest.raises(UnknownNameError, match=r"^unknown serve backend 'uvicorn'; valid: local, ray$"):
        SERVE_BACKENDS.get("uvicorn")
    with pytest.raises(UnknownNameError, match=r"^unknown serve backend 'Ray'; valid: local, ray$"):
        ServeConfig("run", "store.h5", backend="Ray")


@pytest.mark.parametrize(
    "values, said",
    [
        ({"replicas": 2}, "backend 'local' takes no replicas (the ray backend's options)"),
        ({"shard_replicas": 2, "ray_address": "x:1"}, "takes no shard_replicas, ray_address"),
        ({"port": 70000}, "port must be within 0..65535, got 70000"),
        ({"threads": 0}, "threads must be a positive integer, got 0"),
        ({"k": 101}, "k must be at most 100"),
        ({"shortlist": 0}, "shortlist must be a positive integer, got 0"),
        ({"batch_wait_ms": -1.0}, "batch_wait_ms must be within"),
        ({"abstain_below": float("nan")}, "abstain_below must be a finite"),
    ],
)
def test_a_config_no_server_could_run_is_refused_when_built(values: dict, said: str) -> None:
    from dab_pipeline.core.errors import ConfigError
    from dab_pipeline.stages.serve import ServeConfig

    with pytest.raises(ConfigError, match=re.escape(said)):
        ServeConfig("run", "store.h5", **values)
    cfg = ServeConfig("runs/dab", "store.h5", backend="ray", replicas=2)  # the ray backend's own options
    assert cfg.settings().title == "dab search: dab" and cfg.searcher_options().run == Path("runs/dab")


def test_the_serve_configs_integers_are_ints_and_a_bad_one_is_one_line(tmp_path) -> None:
    from dab_pipeline.core.errors import ConfigError
    from dab_pipeline.stages.serve import ServeConfig

    cfg = ServeConfig(run=tmp_path, features=tmp_path / "s.h5", port="8000", threads=2)
    assert cfg.port == 8000 and isinstance(cfg.port, int)
    for bad in ({"threads": 2.5}, {"port": "80a"}, {"replicas": True}):
        with pytest.raises(ConfigError, match="must be an integer"):
            ServeConfig(run=tmp_path, features=tmp_path / "s.h5", **bad)
