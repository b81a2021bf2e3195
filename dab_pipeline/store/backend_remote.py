"""A Zarr store on object storage (any fsspec URL): byte-range reads of only the rows asked for, retried on a
documented policy, never served from a partial read.

Reads of plain (uncompressed) arrays go straight to the chunk objects, as the local backend's preads do: one
ranged GET per run of consecutive rows within a chunk (one GET of the span when a chunk holds many runs),
issued together through fsspec's ``cat_ranges``. Arrays zarr must decode (strings, thumbnails) and every write
go through zarr's ``FsspecStore``.

Retry policy (docs/stores.md): a range that fails with anything but "not found" or "not allowed" (a dropped
connection, a timeout, a 5xx, a body shorter than asked) is asked again, up to ``READ_RETRIES`` more times
after waits of ``RETRY_WAIT_S * 2**k`` seconds; then the read fails with one line naming the object and the
cause. A short body is never returned: a range is used only when every byte of it arrived.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ..core.errors import DabError, StoreError, WriteError
from ..core.location import StoreURL, storage_options
from .backend_zarr import RawChunks, ZarrBackend
from .layout import index_runs

READ_RETRIES = 3  # tries after the first
RETRY_WAIT_S = 0.25  # the first wait; doubled each time (0.25, 0.5, 1 s)
SPAN_RUNS = 8  # more runs than this in one chunk: one GET of their span instead of one per run


@dataclass
class ReadStats:
    """What the raw reads asked of the object store (a benchmark reads it per query)."""

    requests: int = 0
    bytes: int = 0
    retries: int = 0


class RemoteZarrBackend(ZarrBackend):
    """ZarrBackend over an fsspec URL: no local locks (object storage has none; one writer at a time is the
    user's to keep, docs/stores.md), no ``.partial`` files to clean, reads by byte range."""

    def __init__(self, url: StoreURL, mode: str, writer: tuple[int, int] | None = None) -> None:
        self.url = url
        self.fs = url.filesystem()  # the synchronous filesystem dab's own range reads use
        self.stats = ReadStats()
        self._zarr_fs: Any = None  # the asynchronous filesystem of zarr's FsspecStore (_zarr_store), closed by close()
        try:
            super().__init__(url, mode, writer)  # type: ignore[arg-type]
        except BaseException:
            close_async_session(self._zarr_fs)
            raise

    def close(self) -> None:
        super().close()
        close_async_session(self._zarr_fs)
        self._zarr_fs = None

    # ---- what the local backend does with files, here on objects

    def _take_writer_lock(self, writer: tuple[int, int] | None = None) -> None:
        return None

    def _remove_partials(self) -> None:
        return None

    def _zarr_store(self, mode: str) -> Any:
        from zarr.storage import FsspecStore

        store = FsspecStore.from_url(
            str(self.url), storage_options=storage_options(self.url.protocol), read_only=mode == "r"
        )
        self._zarr_fs = store.fs
        return store

    def _chunk_root(self, name: str) -> str:
        return f"{self.url.fs_path}/{name}"

    def chunk_sizes(self, paths: list[str]) -> list[int | None]:
        """Each chunk object's size, None where it is missing: one listing per array, not one request a chunk."""
        sizes: dict[str, int] = {}
        for folder in sorted({p.rsplit("/c/", 1)[0] for p in paths}):
            try:
                listing = self.fs.find(folder, detail=True)
            except FileNotFoundError:
                continue
            except Exception as exc:
                raise StoreError(f"{self.url}: cannot list {folder}: {remote_reason(exc)}") from None
            sizes.update({self._key(k): int(v.get("size") or 0) for k, v in listing.items()})
        return [sizes.get(self._key(p)) for p in paths]

    def _key(self, path: str) -> str:
        # one spelling of an object's path (the memory filesystem lists "/bucket/...", s3 "bucket/...")
        return str(self.fs._strip_protocol(path)).strip("/")

    def total_bytes(self) -> int:
        try:
            return int(self.fs.du(self.url.fs_path, total=True))
        except Exception as exc:
            raise StoreError(f"{self.url}: cannot list the store: {remote_reason(exc)}") from None

    # ---- writes

    def write_range(self, name: str, start: int, values: np.ndarray) -> None:
        with self._write_errors(name):
            self.raw(name)[start : start + len(values)] = values

    def write_prefix(self, name: str, row: int, values: np.ndarray) -> None:
        with self._write_errors(name):
            self.raw(name)[row, : len(values)] = values

    @contextlib.contextmanager
    def _write_errors(self, name: str) -> Iterator[None]:
        """A write the object store did not take (the endpoint lost, access refused) as one WriteError naming the
        array and the cause: the local backend names a full disk the same way, and extraction adds how to resume.
        Not retried here (botocore has tried twice): what was written is kept, so the same command resumes later."""
        try:
            yield
        except DabError:
            raise
        except Exception as exc:
            raise WriteError(f"cannot write {self.url}/{name}: {remote_reason(exc)}; {remote_advice(exc)}") from None

    # ---- reads

    def read_range(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        raw = self.raw_chunks(name)
        if raw is None:
            out[...] = self._through_zarr(lambda: self.raw(name)[start:stop])
            return
        rows = np.arange(start, stop, dtype=np.int64)
        self.read_rows(name, rows, out)

    def read_rows(self, name: str, idx_sorted: np.ndarray, out: np.ndarray) -> np.ndarray:
        raw = self.raw_chunks(name)
        if raw is None or len(idx_sorted) == 0:
            if raw is None and len(idx_sorted):
                out[...] = self._through_zarr(lambda: self.raw(name).get_orthogonal_selection((idx_sorted,)))
            return out
        rb = raw.row_bytes
        flat = out.reshape(len(out), -1).view(np.uint8)  # (B, row_bytes)
        plan = _plan(raw, np.asarray(idx_sorted, np.int64))
        blobs = self._fetch(name, [(raw.chunk_file(c), a * rb, b * rb) for c, a, b, _, _ in plan])
        for (c, a, b, lo, rows), blob in zip(plan, blobs):
            if blob is None:  # a missing chunk object: zarr's zeros (a strict array has raised already)
                flat[lo : lo + len(rows)] = 0
                continue
            flat[lo : lo + len(rows)] = np.frombuffer(blob, np.uint8).reshape(-1, rb)[rows - a]
        return out

    def _fetch(self, name: str, ranges: list[tuple[str, int, int]]) -> list[bytes | None]:
        """The bytes of every (object, start, end) range, each whole; None for a missing object (see module doc)."""
        result: list[bytes | None] = [None] * len(ranges)
        todo = list(range(len(ranges)))
        for attempt in range(READ_RETRIES + 1):
            paths, starts, ends = zip(*(ranges[i] for i in todo))
            self.stats.requests += len(todo)
            try:
                got = self.fs.cat_ranges(list(paths), list(starts), list(ends), on_error="return")
            except Exception as exc:  # the whole batch failed (a filesystem that does not return errors)
                got = [exc] * len(todo)
            failed: list[int] = []
            last: Any = None
            for i, blob in zip(todo, got):
                path, start, end = ranges[i]
                if isinstance(blob, FileNotFoundError):
                    self._missing(name, path)
                    continue
                if isinstance(blob, PermissionError):
                    raise StoreError(f"{self.url}: reading {path} is not allowed: {remote_reason(blob)}") from None
                if isinstance(blob, BaseException) or len(blob) != end - start:
                    if not isinstance(blob, BaseException) and self._shorter_object(path, end):
                        raise StoreError(f"{self.url}: chunk object {path} is truncated (under {end} bytes)")
                    failed.append(i)
                    last = blob
                    continue
                self.stats.bytes += len(blob)
                result[i] = bytes(blob)
            if not failed:
                return result
            if attempt == READ_RETRIES:
                why = remote_reason(last) if isinstance(last, BaseException) else "a short read"
                raise StoreError(
                    f"{self.url}: reading {ranges[failed[0]][0]} failed {READ_RETRIES + 1} times ({why}); nothing "
                    "was served from it: check the endpoint and the network, and run again"
                )
            self.stats.retries += len(failed)
            time.sleep(RETRY_WAIT_S * 2**attempt)
            todo = failed
        return result  # pragma: no cover

    def _shorter_object(self, path: str, end: int) -> bool:
        """Whether the object itself ends before ``end`` (damage), rather than the connection (retried)."""
        try:
            return int(self.fs.size(path)) < end
        except Exception:
            return False

    def _through_zarr(self, read: Any) -> Any:
        for attempt in range(READ_RETRIES + 1):
            try:
                return read()
            except StoreError:
                raise
            except (FileNotFoundError, PermissionError) as exc:
                raise StoreError(f"{self.url}: {remote_reason(exc)}") from None
            except Exception as exc:
                if attempt == READ_RETRIES:
                    raise StoreError(
                        f"{self.url}: a read failed {READ_RETRIES + 1} times ({remote_reason(exc)}); check the "
                        "endpoint and the network, and run again"
                    ) from None
                self.stats.retries += 1
                time.sleep(RETRY_WAIT_S * 2**attempt)

    def read_all(self, name: str) -> np.ndarray:
        if self.raw_chunks(name) is None:
            return self._through_zarr(lambda: self.raw(name)[...])
        return super().read_all(name)

    def read_strings(self, name: str) -> np.ndarray:
        return self._through_zarr(lambda: ZarrBackend.read_strings(self, name))


def _plan(raw: RawChunks, idx_sorted: np.ndarray) -> list[tuple[int, int, int, int, np.ndarray]]:
    """The ranges that read ``idx_sorted``: [(chunk, first row, end row, position in out, rows within chunk)]."""
    plan = []
    chunk_of = idx_sorted // raw.rows_per_chunk
    bounds = np.flatnonzero(np.diff(chunk_of)) + 1
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(idx_sorted)]])):
        c = int(chunk_of[lo])
        rows = idx_sorted[lo:hi] - c * raw.rows_per_chunk  # (n,) rows within the chunk
        runs = index_runs(rows)
        if len(runs) > SPAN_RUNS:
            plan.append((c, int(rows[0]), int(rows[-1]) + 1, int(lo), rows))
            continue
        j = int(lo)
        for a, b in runs:
            plan.append((c, int(a), int(b), j, rows[j - lo : j - lo + b - a]))
            j += b - a
    return plan


# botocore's errors for a request it had no credentials to sign (named, so that gs:// and az:// need no botocore)
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}

CREDENTIALS_HINT = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, or write them in "
    "~/.aws/credentials"
)


def missing_credentials(exc: BaseException) -> bool:
    """Whether the client found no credentials to sign a request with (not an endpoint it could not reach)."""
    return any(c.__name__ in _NO_CREDENTIALS for c in type(exc).__mro__)


def remote_advice(exc: BaseException) -> str:
    """What to check after a failed request: the credentials, access, or the endpoint and the network."""
    if missing_credentials(exc):
        return f"no credentials were found: {CREDENTIALS_HINT}"
    if isinstance(exc, PermissionError):
        return "access was refused: check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...) and the bucket's policy"
    return "check the endpoint and the network"


def close_async_session(fs: Any) -> None:
    """Close the HTTP session of zarr's asynchronous filesystem ``fs`` (None: nothing to close).

    s3fs closes the sessions of its synchronous filesystems when they are collected, but not those of asynchronous
    ones, which zarr's FsspecStore makes: left open, aiohttp logs "Unclosed client session" as the process ends.
    The session lives on zarr's event loop (zarr awaits the filesystem there), so it is closed there."""
    creator = getattr(fs, "_s3creator", None)
    if creator is None:
        return
    fs._s3creator = fs._s3 = None  # a later request of the same filesystem opens a new session
    from zarr.core.sync import sync

    try:
        sync(creator.__aexit__(None, None, None), timeout=10)
    except Exception:
        pass  # tidying up: a session that will not close must not hide the outcome of the work itself


def remote_reason(exc: BaseException) -> str:
    """One line of what an object store said (botocore's and aiohttp's messages run long)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
