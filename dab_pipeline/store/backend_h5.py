"""The backend interface and its HDF5 implementation (one writer per file)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.errors import StoreError
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
                raise StoreError(f"{path} is damaged: truncated to {have:,} bytes, while its HDF5 header expects "
                                 f"{want:,} (a copy or download cut short, or a disk that filled up); copy it again, "
                                 "or re-run `dab extract` into a new --out") from None
            if re.search(r"\block|unable to lock|lock(ing)? (failed|error)", msg, re.IGNORECASE):
                # HDF5 allows one writer and nobody else, or any number of readers.
                raise StoreError(
                    f"{path} is locked by another process ({'a writer is' if mode == 'r' else 'a reader or writer is'} "
                    f"using it); set HDF5_USE_FILE_LOCKING=FALSE to read it anyway [{e}]"
                ) from None
            raise StoreError(f"{path} is not a readable HDF5 file: {e}") from None
        self._ds: dict[str, Any] = {}

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
        self.raw(name)[start : start + len(values)] = values

    def write_prefix(self, name: str, row: int, values: np.ndarray) -> None:
        """The first len(values) entries of one row (the rest is left as it is: unwritten stays sparse)."""
        self.raw(name)[row, : len(values)] = values

    def flush(self) -> None:
        # Pushes HDF5's sieve buffer and metadata cache to the OS; the OS page
        # cache survives a SIGKILL of this process.
        self.f.flush()

    def stored_bytes(self, name: str) -> int:
        return int(self.raw(name).id.get_storage_size())

    def close(self) -> None:
        if self.f.id.valid:
            self.f.close()

    @staticmethod
    def create(tmp: Path, layout: dict, attrs: dict, init: dict[str, np.ndarray]) -> None:
        import h5py

        with h5py.File(tmp, "w", **h5_locking_kwargs()) as f:
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
                    f.create_dataset(spec.name, shape=spec.shape, dtype=spec.dtype, fillvalue=0,
                                     chunks=(min(16, max(1, spec.shape[0])), *spec.shape[1:]),
                                     compression="gzip", compression_opts=1)
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
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
