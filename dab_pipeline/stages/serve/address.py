"""Where a server listens: the socket bound before anything loads, and the URL it is served on."""

from __future__ import annotations

import errno
import socket

from ...core.errors import DabError

__all__ = ["bind_socket", "served_url"]


def served_url(host: str, port: int) -> str:
    """The URL a server on ``host:port`` answers at: ``http://host:port/``, an IPv6 address in brackets
    (``http://[::1]:8000/``)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not listening yet: clients are refused, not queued, while the run and
    the index load); a one-line :class:`DabError` when the address cannot be had (not a mistake in the options:
    another program holds the port). IPv6 when the host has a colon, as uvicorn does."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart needs no wait
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        what = "in use by another program" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise DabError(f"cannot listen on {host}:{port}: {what}") from None
    return sock
