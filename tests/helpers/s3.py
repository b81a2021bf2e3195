"""A real S3 endpoint on this machine for the object-storage tests: moto's server (moto[server], the S3 API over
HTTP on a local port, in a thread of the test process), and a TCP proxy in front of it that can cut a response
mid-body, as a dropped connection does.

moto is the S3 server the Python ecosystem tests against (boto3's and s3fs's own suites use it); it needs no
binary, no container and no network, so the tests start and stop it themselves.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
from contextlib import contextmanager
from typing import Iterator

import pytest

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def s3_environment(endpoint: str) -> Iterator[None]:
    """The environment an S3 client reads (credentials and endpoint), restored afterwards."""
    saved = {k: os.environ.get(k) for k in (*ENV, "AWS_ENDPOINT_URL")}
    os.environ.update(ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def local_s3(buckets: tuple[str, ...] = ("dab",)) -> Iterator[str]:
    """Start moto's S3 server on a free port with ``buckets``; -> its endpoint URL (stopped at the end)."""
    pytest.importorskip("s3fs", reason="the s3 extra (s3fs) is not installed")
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        with s3_environment(endpoint):
            import boto3

            client = boto3.client("s3", endpoint_url=endpoint)
            for b in buckets:
                client.create_bucket(Bucket=b)
            yield endpoint
    finally:
        server.stop()


class CuttingProxy:
    """A TCP proxy to ``upstream`` that, while :meth:`cut` is armed, resets a connection after forwarding
    ``after`` more bytes of a response: the client sees a body end early, as on a dropped connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self._lock = threading.Lock()
        self._cuts = 0
        self._after = 0
        self.cut_count = 0
        self._sock = socket.create_server(("127.0.0.1", self.port))
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self, times: int, after: int) -> None:
        """Reset the next ``times`` responses (any connection) ``after`` bytes into them."""
        with self._lock:
            self._cuts, self._after = times, after

    def close(self) -> None:
        self._stop = True
        self._sock.close()

    def go_down(self) -> None:
        """Lose the endpoint, as when the network drops: new connections are refused, and a response on a
        connection already open is reset before its first byte."""
        self.close()
        self.cut(times=1 << 30, after=0)

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, response: bool) -> None:
        sent = 0  # bytes of the current cut's budget forwarded on this connection
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if response:
                    with self._lock:
                        armed = self._cuts > 0
                    if armed and sent + len(data) > self._after:
                        dst.sendall(data[: max(0, self._after - sent)])
                        with self._lock:
                            self._cuts -= 1
                            self.cut_count += 1
                        _reset(dst)
                        _reset(src)
                        return
                    sent += len(data) if armed else 0
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass


def _reset(s: socket.socket) -> None:
    """Drop the connection now: shutdown wakes the other pump's blocked recv (a plain close would wait for it), and
    SO_LINGER 0 makes the close a reset."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.shutdown(socket.SHUT_RDWR)
        s.close()
    except OSError:
        pass
