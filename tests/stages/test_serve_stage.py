"""dab serve as a stage: the URL a server prints and the socket it binds (the config, the backends and the CLI over
them are below, as they come)."""

from __future__ import annotations

import socket

import pytest

from dab_pipeline.core.errors import DabError
from dab_pipeline.stages.serve import bind_socket, served_url


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
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "dab_pipeline"
    built = [
        f"{path.relative_to(root)}:{node.lineno}"
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).as_posix() != "search/searcher.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Searcher"
    ]
    assert built == []
