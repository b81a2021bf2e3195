"""The backend interface and its HDF5 implementation (one writer per file)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..core.errors import StoreError, WriteError
from ..core.write_errors import check_free_space, reserve_blocks, write_failure
from .layout import COMPRESSED, ZERO_INIT, array_specs, index_runs


class Backend:
    """Row-oriented access to the arrays of one store (``name`` like ``videos/frames``)."""

    kind: str
    path: Path

    def attrs(self) -> dict: ...
    def shape(self, name: str) -> tuple[int, ...]: ...
    def read_all(self, name: str) -> np.ndarray: ...
    def read_strings(self, name: str) -> np.ndarray: ...
    def read_range(self, name: str, start: int, stop: int, out: np.ndarray) -> None: ...
    def write_range(self, name: str, start: int, values: np.ndarray) -> None: ...
    def write_prefix(self, name: str, row: int, values: np.ndarray) -> None: ...
    def flush(self) -> None: ...
    def _reserve(self, nbytes: int, span: tuple[int, int] | None) -> bool:
        """Reserve the disk blocks of a write (see :meth:`_writing`); False where the file system cannot."""
        if self._fd is None:
            return False
        inside = span is None or reserve_blocks(self._fd, self.path, span[0], span[1])
        grows = (nbytes if span is None else 0) + H5_WRITE_SLACK
        end = os.fstat(self._fd).st_size
        return inside and reserve_blocks(self._fd, self.path, end, grows, past_end=True)

    def stored_bytes(self, name: str) -> int: ...
    def close(self) -> None: ...

    def read_runs(self, name: str, runs: Sequence[tuple[int, int]], out: np.ndarray) -> None:
        """Rows of each ``[start, stop)`` run, one after another, into ``out``."""
        j = 0
        for a, b in runs:
            self.read_range(name, a, b, out[j : j + (b - a)])
            j += b - a

    def read_rows(self, name: str, idx_sorted: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Rows ``idx_sorted`` (sorted, unique), in ``out`` or in a new array it returns."""
        self.read_runs(name, index_runs(idx_sorted), out)
        return out


# Headroom a write needs beyond its own bytes: HDF5's metadata and the thumbnails' new deflate chunks.
H5_WRITE_SLACK = 256 << 10

_UNCLOSED: list[str] = []


def unclosed_files() -> list[str]:
    """HDF5 files this process could not close after a failed write (a full disk).

    HDF5 tries again when the interpreter exits and crashes on the same full disk (SIGSEGV): a program
    that finds this list non-empty ends with ``os._exit`` after reporting the failure (the ``dab`` CLI does)."""
    return list(_UNCLOSED)


def _raise_if_damaged(path: Path, exc: BaseException) -> None:
    """A StoreError for HDF5's signs of a file whose end-of-file record is behind its data: what a write that
    failed on a full disk, with nothing reserved, can leave (HDF5 then refuses to allocate or size anything)."""
    if "addr overflow" in str(exc):
        raise StoreError(
            f"{path} is damaged: HDF5's record of where the file ends is behind its data (a write "
            "failed on a full disk); rebuild it: the same `dab extract` command with --overwrite"
        ) from None


def h5_locking_kwargs() -> dict:
    # An explicit HDF5_USE_FILE_LOCKING wins (HDF5 reads it itself); otherwise
    # lock where the file system can, and carry on where it cannot (NFS, some FUSE).
    return {} if "HDF5_USE_FILE_LOCKING" in os.environ else {"locking": "best-effort"}


class H5Backend(Backend):
    kind = "hdf5"

    def __init__(self, path: Path, mode: str) -> None:
        import h5py

        self.path = path
        try:
            self.f = h5py.File(path, "r" if mode == "r" else "r+", **h5_locking_kwargs())
        except OSError as e:
            msg = str(e)
            trunc = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", msg)
            if trunc:  # HDF5's header records the file's size: a copy or download cut short, or a full disk
                have, want = (int(x) for x in trunc.groups())
                raise StoreError(
                    f"{path} is damaged: truncated to {have:,} bytes, while its HDF5 header expects "
                    f"{want:,} (a copy or download cut short, or a disk that filled up); copy it again, "
                    "or re-run `dab extract` into a new --out"
                ) from None
            if re.search(r"\block|unable to lock|lock(ing)? (failed|error)", msg, re.IGNORECASE):
                # HDF5 allows one writer and nobody else, or any number of readers.
                raise StoreError(
                    f"{path} is locked by another process ({'a writer is' if mode == 'r' else 'a reader or writer is'} "
                    f"using it); set HDF5_USE_FILE_LOCKING=FALSE to read it anyway [{e}]"
                ) from None
            raise StoreError(f"{path} is not a readable HDF5 file: {e}") from None
        self._ds: dict[str, Any] = {}
        self._failed = False  # a write failed: HDF5 cannot close the file cleanly any more
        # a second descriptor of the file, for reserving the blocks of writes before HDF5 makes them
        try:
            self._fd = os.open(path, os.O_RDWR) if mode != "r" else None
        except OSError:
            self.f.close()
            raise

    def raw(self, name: str) -> Any:
        ds = self._ds.get(name)
        if ds is None:
            try:
                ds = self.f[name]
            except KeyError:
                raise StoreError(f"{self.path}: array {name!r} is missing") from None
            self._ds[name] = ds
        return ds

    def attrs(self) -> dict:
        out = {}
        for k in ("dab_store_format", "layout", "manifest"):
            if k in self.f.attrs:
                v = self.f.attrs[k]
                out[k] = json.loads(v) if isinstance(v, (str, bytes)) else int(v)
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.raw(name).shape)

    def read_all(self, name: str) -> np.ndarray:
        return self.raw(name)[()]

    def read_strings(self, name: str) -> np.ndarray:
        vals = self.raw(name).asstr()[()]
        return np.asarray(vals, dtype=str) if len(vals) else np.zeros(0, dtype="<U1")

    def read_range(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        out[...] = self.raw(name)[start:stop]

    def read_rows(self, name: str, idx_sorted: np.ndarray, out: np.ndarray) -> np.ndarray:
        runs = index_runs(idx_sorted)
        if len(runs) <= 2:
            self.read_runs(name, runs, out)
            return out
        # On a contiguous dataset a sorted index list is one H5Dread of a
        # hyperslab union: ~15 us a row at 32 rows, ~8 us at 7000, where one
        # slice per run costs ~50 us of h5py overhead each. (Fancy indexing
        # is only slow on *chunked* datasets: 7.5 ms for 32 rows.)
        return self.raw(name)[idx_sorted]

    def write_range(self, name: str, start: int, values: np.ndarray) -> None:
        with self._writing(values.nbytes, self._span(name, start, len(values))):
            self.raw(name)[start : start + len(values)] = values

    def write_prefix(self, name: str, row: int, values: np.ndarray) -> None:
        """The first len(values) entries of one row (the rest is left as it is: unwritten stays sparse)."""
        span = self._span(name, row, 1)
        with self._writing(values.nbytes, None if span is None else (span[0], values.nbytes)):
            self.raw(name)[row, : len(values)] = values

    def flush(self) -> None:
        # Pushes HDF5's sieve buffer and metadata cache to the OS; the OS page
        # cache survives a SIGKILL of this process.
        with self._writing(0, None):
            self.f.flush()

    def _span(self, name: str, start: int, rows: int) -> tuple[int, int] | None:
        """(file offset, bytes) of ``rows`` rows of a contiguous array from ``start``; None for a chunked one."""
        ds = self.raw(name)
        offset = ds.id.get_offset()
        if offset is None:
            return None
        row = ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64))
        return offset + start * row, rows * row

    @contextlib.contextmanager
    def _writing(self, nbytes: int, span: tuple[int, int] | None) -> Iterator[None]:
        """A write of ``nbytes`` (at ``span`` of the file, or appended), refused up front when the disk cannot
        take it, named when it fails anyway.

        Before HDF5 writes, the blocks it will write get their disk space (``fallocate``): the rows of a
        contiguous array where they lie, and room past the end of the file for what grows (the thumbnails'
        chunks, HDF5's metadata). That matters: HDF5 cannot close a file whose write failed (its caches stay
        dirty, its end-of-file record stale) and crashes flushing it when the interpreter exits."""
        if self._failed:
            raise WriteError(f"cannot write {self.path}: an earlier write to it failed")
        if not self._reserve(nbytes, span):
            check_free_space(self.path, nbytes + H5_WRITE_SLACK)
        try:
            yield
        except (OSError, RuntimeError) as exc:
            named = write_failure(exc, self.path)
            if named is None:
                _raise_if_damaged(self.path, exc)
                raise
            self._failed = True
            raise named from exc

    def stored_bytes(self, name: str) -> int:
        try:
            return int(self.raw(name).id.get_storage_size())
        except RuntimeError as exc:
            _raise_if_damaged(self.path, exc)
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self.f.id.valid:
            return
        try:
            self.f.close()
        except (OSError, RuntimeError):
            if not self._failed:
                raise
            # its failed write was reported; what the file held before it is on disk (set statuses vouch for it)
            _UNCLOSED.append(str(self.path))

    @staticmethod
    def create(tmp: Path, layout: dict, attrs: dict, init: dict[str, np.ndarray]) -> None:
        import h5py

        f = h5py.File(tmp, "w", **h5_locking_kwargs())
        try:
            _fill_new_file(f, layout, attrs, init)
        except BaseException:
            try:
                f.close()
            except (OSError, RuntimeError):  # its writes failed (a full disk): HDF5 would crash at exit
                _UNCLOSED.append(str(tmp))
            raise
        f.close()
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fill_new_file(f: Any, layout: dict, attrs: dict, init: dict[str, np.ndarray]) -> None:
    """A new store's attributes and arrays, written into the open h5py file ``f``."""
    import h5py

    for k, v in attrs.items():
        f.attrs[k] = v if isinstance(v, int) else json.dumps(v, sort_keys=True)
    for spec in array_specs(layout):
        if spec.dtype is None:
            # Strings are written once, here, before the file is published.
            f.create_dataset(spec.name, data=np.asarray(init[spec.name], dtype=object), dtype=h5py.string_dtype())
            continue
        if spec.name in COMPRESSED:
            # JPEG rows padded with zeros: chunked + deflate stores about the JPEGs' bytes
            # (a contiguous array would hold every row's padding: the sieve buffer writes it).
            f.create_dataset(
                spec.name,
                shape=spec.shape,
                dtype=spec.dtype,
                fillvalue=0,
                chunks=(min(16, max(1, spec.shape[0])), *spec.shape[1:]),
                compression="gzip",
                compression_opts=1,
            )
            continue
        # Contiguous + early allocation: every byte of every array has its
        # file address now, so later writes are pure raw-data writes.
        # fill_time "never" keeps big arrays sparse on disk until written.
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        ds = f.create_dataset(spec.name, shape=spec.shape, dtype=spec.dtype, dcpl=dcpl, fill_time="never")
        if spec.name in init:
            ds[...] = init[spec.name]
        elif spec.name in ZERO_INIT:
            # Unwritten "never"-filled storage is formally undefined; the
            # flags and masks are read before anything is written.
            ds[...] = np.zeros(spec.shape, spec.dtype)
    f.flush()
