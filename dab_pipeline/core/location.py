"""Where a store lives: a local path, or an fsspec URL of object storage (``s3://bucket/store.zarr``, ``gs://``,
``memory://``, ...).

A URL travels through configs and run folders as its string; :func:`location` turns what a user gave into a
``Path`` or a :class:`StoreURL`. Credentials never travel with it: fsspec's filesystems read them from the usual
environment variables and config files (for S3: ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``~/.aws/...``,
``AWS_ENDPOINT_URL``), so nothing secret reaches a config.json, a log or an error line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import ConfigError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")

# The extra that brings each protocol's filesystem (fsspec names the package; dab names the extra).
PROTOCOL_EXTRAS = {"s3": "dab-pipeline[s3]", "s3a": "dab-pipeline[s3]"}


def is_url(value: Any) -> bool:
    """Whether ``value`` is a string of the form ``protocol://...`` (a Path never is)."""
    return isinstance(value, str) and _SCHEME.match(value) is not None


@dataclass(frozen=True)
class StoreURL:
    """A store on an fsspec filesystem, named by its URL; the few Path-like questions dab asks of a store."""

    url: str

    def __post_init__(self) -> None:
        m = _SCHEME.match(self.url)
        if m is None:
            raise ConfigError(f"{self.url!r} is not a URL (expected protocol://bucket/path)")
        rest = self.url[m.end() :]
        netloc = rest.split("/", 1)[0]
        if "@" in netloc:
            raise ConfigError(
                f"{self.protocol}://...@{netloc.split('@', 1)[1]}: credentials in a store URL are refused (they would "
                "be written into run folders and logs); set them in the environment or the filesystem's config files"
            )
        if not rest.strip("/"):
            raise ConfigError(f"{self.url!r} names no bucket or path")

    @property
    def protocol(self) -> str:
        return _SCHEME.match(self.url).group(1).lower()  # type: ignore[union-attr]

    @property
    def fs_path(self) -> str:
        """The path as the filesystem names it: the URL without ``protocol://`` and a trailing slash."""
        return self.url[_SCHEME.match(self.url).end() :].rstrip("/")  # type: ignore[union-attr]

    @property
    def name(self) -> str:
        return PurePosixPath(self.fs_path).name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.fs_path).suffix

    @property
    def stem(self) -> str:
        return PurePosixPath(self.fs_path).stem

    def __str__(self) -> str:
        return self.url.rstrip("/")

    def __truediv__(self, part: str) -> "StoreURL":
        return StoreURL(f"{str(self)}/{part}")

    def resolve(self) -> "StoreURL":
        return self

    def filesystem(self) -> Any:
        """The fsspec filesystem of this URL, configured from the environment only (see the module's doc)."""
        return filesystem(self.protocol)

    def exists(self) -> bool:
        return bool(self.filesystem().exists(self.fs_path))

    def is_dir(self) -> bool:
        return bool(self.filesystem().isdir(self.fs_path))

    def is_file(self) -> bool:
        return bool(self.filesystem().isfile(self.fs_path))


def location(value: str | os.PathLike | StoreURL) -> Path | StoreURL:
    """``value`` as a local ``Path``, or a :class:`StoreURL` when it is ``protocol://...`` (``file://`` is local)."""
    if isinstance(value, (StoreURL, Path)):
        return value
    text = os.fspath(value)
    if not is_url(text):
        return Path(text)
    if text.lower().startswith("file://"):
        return Path(text[len("file://") :])
    url = StoreURL(text)
    filesystem_class(url.protocol)  # an unknown protocol, or one whose package is missing, is said here, once
    return url


# Connections fail fast, so an unreachable endpoint is one line within seconds, not minutes of botocore's own
# back-off; dab's reads retry on their own terms (store/backend_remote.py).
_S3_CONFIG = {"connect_timeout": 5, "read_timeout": 30, "retries": {"max_attempts": 2, "mode": "standard"}}


def storage_options(protocol: str) -> dict[str, Any]:
    """The options dab passes to ``protocol``'s filesystem: timeouts only, never credentials."""
    if protocol in ("s3", "s3a"):
        return {"config_kwargs": dict(_S3_CONFIG), "skip_instance_cache": True}
    return {}


def filesystem(protocol: str, **extra: Any) -> Any:
    """A fresh fsspec filesystem for ``protocol``: ConfigError for an unknown protocol or a missing package."""
    fs = filesystem_class(protocol)(**storage_options(protocol), **extra)
    quiet_retries(fs)
    return fs


def quiet_retries(fs: Any) -> None:
    """s3fs retries a failed call 5 times inside each of its layers (25 tries of a range, each with botocore's
    own): one try each there, so dab's read policy (store/backend_remote.py) is the one that counts."""
    if hasattr(fs, "retries"):
        fs.retries = 1


def filesystem_class(protocol: str) -> type:
    """fsspec's filesystem class for ``protocol``; ConfigError naming the protocol (and the extra to install)."""
    try:
        import fsspec
        from fsspec.registry import known_implementations
    except ImportError:  # pragma: no cover - zarr brings fsspec
        raise ConfigError("store URLs need the fsspec package: pip install fsspec") from None
    if protocol not in known_implementations and protocol not in fsspec.registry:
        known = sorted(p for p in known_implementations if p.isalpha())
        raise ConfigError(f"unknown storage protocol {protocol!r}; fsspec knows: {', '.join(known)}")
    try:
        return fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        extra = PROTOCOL_EXTRAS.get(protocol)
        hint = f"pip install '{extra}'" if extra else str(exc).splitlines()[0]
        raise ConfigError(f"{protocol}:// stores need a package that is not installed: {hint}") from None
