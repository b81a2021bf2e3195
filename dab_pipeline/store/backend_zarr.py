"""The Zarr v3 backend: raw chunk reads, share locks outside the hierarchy, multi-writer layouts."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import StoreError
from ..core.write_errors import named_write_errors
from .backend_h5 import Backend, H5Backend
from .layout import (
    COMPRESSED,
    CREATING,
    LEGACY_LOCK,
    SHARE_LOCK,
    ZARR_CHUNK_BYTES,
    array_specs,
    chunk_rows_in_unit,
    index_runs,
    zstd,
)


@dataclass(frozen=True)
class RawChunks:
    """How to read an uncompressed zarr array straight from its chunk files."""

    root: str
    rows_per_chunk: int
    row_shape: tuple[int, ...]
    dtype: np.dtype
    ndim: int
    metadata: Any

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize

    def chunk_file(self, c: int) -> str:
        return os.path.join(self.root, self.metadata.encode_chunk_key((c,) + (0,) * (self.ndim - 1)))


class ZarrBackend(Backend):
    kind = "zarr"

    def __init__(self, path: Path, mode: str, writer: tuple[int, int] | None = None) -> None:
        import zarr

        self.path = path
        self._lock_fd: int | None = None
        self._share_lock_fd: int | None = None
        self._share_lock_path: Path | None = None
        if mode == "a":
            self._take_writer_lock(writer)
            if writer is None:
                # Not in multi-writer mode: another writer's temporary file may be in flight.
                self._remove_partials()
        try:
            self.g = zarr.open_group(self._zarr_store(mode), mode="r" if mode == "r" else "r+")
        except Exception as e:  # zarr raises FileNotFoundError / ValueError / JSONDecodeError
            self._release_writer_lock()
            raise StoreError(f"{path} is not a readable zarr store: {type(e).__name__}: {e}") from None
        self._arr: dict[str, Any] = {}
        self._raw: dict[str, RawChunks | None] = {}
        self.mode = mode
        # set by a long-lived reader (dab serve): a chunk file changed after this time is refused, not read
        self.unchanged_since_ns: int | None = None

    def _zarr_store(self, mode: str) -> Any:
        """What zarr opens: the folder's path here, an fsspec store for a URL (backend_remote)."""
        return str(self.path)

    def _chunk_root(self, name: str) -> str:
        """Where array ``name``'s chunk files lie, as this backend reads them."""
        return str(self.path / name)

    def chunk_sizes(self, paths: list[str]) -> list[int | None]:
        """Each chunk file's size, None where it is missing."""
        out: list[int | None] = []
        for p in paths:
            try:
                out.append(os.stat(p).st_size)
            except FileNotFoundError:
                out.append(None)
        return out

    def total_bytes(self) -> int:
        """Bytes of every file of the store."""
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def _take_writer_lock(self, writer: tuple[int, int] | None = None) -> None:
        if not self.path.is_dir():
            return  # open_group reports the real problem
        # flock dies with its process, so a SIGKILLed writer never leaves a stale lock.
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if writer is None else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(f"{self.path} is locked: another process has it open for writing") from None
        self._lock_fd = fd
        if writer is None:
            (self.path / LEGACY_LOCK).unlink(missing_ok=True)
        else:
            rank, world = writer
            share_lock = self.path.parent / SHARE_LOCK.format(store=self.path.name, rank=rank, world=world)
            sfd = os.open(share_lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(sfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(sfd)
                self._release_writer_lock()
                raise StoreError(
                    f"{self.path} is locked: another process is already writer {rank} of {world}"
                ) from None
            self._share_lock_fd = sfd
            self._share_lock_path = share_lock

    def _release_writer_lock(self) -> None:
        if self._share_lock_fd is not None:
            # Removed while still held, so no lock files pile up next to the store.
            if self._share_lock_path is not None:
                self._share_lock_path.unlink(missing_ok=True)
            os.close(self._share_lock_fd)
            self._share_lock_fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _remove_partials(self) -> None:
        # A writer killed inside zarr's temp-then-rename leaves "<chunk>.<uuid>.partial"
        # files; they are never read, only clutter.
        if self.path.is_dir():
            for p in self.path.rglob("*.partial"):
                p.unlink(missing_ok=True)

    # Arrays whose rows are read only where the store says they were written (ok videos, done
    # captions): there a missing chunk file is damage, not zarr's sparse zeros. FeatureStore sets it.
    strict: frozenset[str] = frozenset()

    def _missing(self, name: str, path: str) -> None:
        """A chunk file absent where zarr would give zeros: zeros for a sparse array, an error for a strict one."""
        if name in self.strict:
            raise StoreError(
                f"{self.path} is damaged: chunk file {path} of array {name!r} is missing, while the "
                "store records its rows as written; `dab inspect --verify` lists every missing chunk, "
                "and `dab extract ... --overwrite` rebuilds the store"
            )

    def chunk_files(self, name: str, chunks: np.ndarray) -> list[str] | None:
        """The chunk files of ``chunks`` (indices along the first axis), or None for an array not read raw."""
        raw = self.raw_chunks(name)
        return None if raw is None else [raw.chunk_file(int(c)) for c in chunks]

    def raw(self, name: str) -> Any:
        a = self._arr.get(name)
        if a is None:
            try:
                a = self.g[name]
            except KeyError:
                raise StoreError(f"{self.path}: array {name!r} is missing") from None
            if self.mode != "r":
                # zarr drops a chunk whose values are all zero (its fill value) by default; written rows must
                # leave a chunk file, so a missing one is damage, never data (FeatureStore.missing_chunks)
                a = a.with_config({"write_empty_chunks": True})
            self._arr[name] = a
        return a

    def raw_chunks(self, name: str) -> RawChunks | None:
        """Direct chunk-file access when the array is plain little-endian bytes, else None."""
        if name in self._raw:
            return self._raw[name]
        from zarr.codecs import BytesCodec

        a = self.raw(name)
        md = a.metadata
        info = None
        codecs = getattr(md, "codecs", ())
        dt = np.dtype(a.dtype) if not isinstance(a.dtype, np.dtypes.StringDType) else None
        if (
            dt is not None
            and dt.kind in "biuf"
            and len(codecs) == 1
            and isinstance(codecs[0], BytesCodec)
            and (dt.itemsize == 1 or dt.byteorder in ("<", "=") and np.little_endian)
            and tuple(a.chunks[1:]) == tuple(a.shape[1:])
            and float(md.fill_value) == 0
            and hasattr(md, "encode_chunk_key")
        ):
            info = RawChunks(self._chunk_root(name), int(a.chunks[0]), tuple(a.shape[1:]), dt, a.ndim, md)
        self._raw[name] = info
        return info

    def attrs(self) -> dict:
        return dict(self.g.attrs.asdict())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.raw(name).shape)

    def read_all(self, name: str) -> np.ndarray:
        raw = self.raw_chunks(name)
        if raw is None:
            return self.raw(name)[...]
        n = self.raw(name).shape[0]
        out = np.empty((n, *raw.row_shape), raw.dtype)
        self.read_range(name, 0, n, out)
        return out

    def read_strings(self, name: str) -> np.ndarray:
        vals = self.raw(name)[...]
        # zarr hands back numpy's variable-width StringDType; the API promises "<U".
        return np.asarray(vals.tolist(), dtype=str) if len(vals) else np.zeros(0, dtype="<U1")

    def read_range(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        raw = self.raw_chunks(name)
        if raw is None:
            out[...] = self.raw(name)[start:stop]
            return
        # zarr's own indexing costs ~0.5 ms per call; a pread per chunk segment
        # costs microseconds. Uncompressed v3 chunks are the C-order bytes of a
        # full (edge chunks included) chunk, so a row's offset is plain arithmetic.
        rb = raw.row_bytes
        flat = out.reshape(len(out), -1).view(np.uint8).reshape(-1) if out.size else None
        row = start
        while row < stop:
            c = row // raw.rows_per_chunk
            hi = min(stop, (c + 1) * raw.rows_per_chunk)
            seg_out = slice((row - start) * rb, (hi - start) * rb)
            path = raw.chunk_file(c)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                # zarr drops chunks that are all fill value (0); in a strict array that is damage
                self._missing(name, path)
                out[row - start : hi - start] = 0
                row = hi
                continue
            try:
                self._check_unchanged(fd, path)
                want = (hi - row) * rb
                got = os.preadv(fd, [memoryview(flat[seg_out])], (row - c * raw.rows_per_chunk) * rb) if want else 0
            finally:
                os.close(fd)
            if got != want:
                raise StoreError(f"{self.path}: chunk file {path} is truncated ({got} of {want} bytes readable)")
            row = hi

    def _check_unchanged(self, fd: int, path: str) -> None:
        """A StoreError for a chunk file written after ``unchanged_since_ns`` (its ctime, which no copy can set
        back): a store rewritten in place under a reader that opened it earlier."""
        if self.unchanged_since_ns is not None and os.fstat(fd).st_ctime_ns > self.unchanged_since_ns:
            raise StoreError(f"{self.path}: chunk file {path} was written after the store was opened")

    def read_rows(self, name: str, idx_sorted: np.ndarray, out: np.ndarray) -> np.ndarray:
        raw = self.raw_chunks(name)
        if raw is None or len(idx_sorted) == 0:
            return super().read_rows(name, idx_sorted, out)
        # One open per chunk file touched; inside it, one pread per run of
        # consecutive rows, or one pread of the span when runs are many.
        rb = raw.row_bytes
        flat = out.reshape(len(out), -1).view(np.uint8)  # (B, row_bytes)
        chunk_of = idx_sorted // raw.rows_per_chunk
        bounds = np.flatnonzero(np.diff(chunk_of)) + 1
        for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(idx_sorted)]])):
            c = int(chunk_of[lo])
            rows = idx_sorted[lo:hi] - c * raw.rows_per_chunk  # rows within the chunk
            path = raw.chunk_file(c)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                self._missing(name, path)
                out[lo:hi] = 0  # zarr drops chunks that are all fill value (0)
                continue
            try:
                self._check_unchanged(fd, path)
                runs = index_runs(rows)
                if len(runs) <= 8:
                    j = lo
                    for a, b in runs:
                        got = os.preadv(fd, [memoryview(flat[j : j + b - a]).cast("B")], a * rb)
                        if got != (b - a) * rb:
                            raise StoreError(f"{self.path}: chunk file {path} is truncated")
                        j += b - a
                else:
                    first, last = int(rows[0]), int(rows[-1]) + 1
                    span = os.pread(fd, (last - first) * rb, first * rb)
                    if len(span) != (last - first) * rb:
                        raise StoreError(f"{self.path}: chunk file {path} is truncated")
                    flat[lo:hi] = np.frombuffer(span, np.uint8).reshape(-1, rb)[rows - first]
            finally:
                os.close(fd)
        return out

    def write_range(self, name: str, start: int, values: np.ndarray) -> None:
        with named_write_errors(self.path):
            self.raw(name)[start : start + len(values)] = values

    def write_prefix(self, name: str, row: int, values: np.ndarray) -> None:
        """The first len(values) entries of one row (the rest is left as it is: unwritten stays sparse)."""
        with named_write_errors(self.path):
            self.raw(name)[row, : len(values)] = values

    def flush(self) -> None:
        # zarr's LocalStore has finished (written + renamed) every chunk file by
        # the time an assignment returns; nothing is buffered in this process.
        pass

    def stored_bytes(self, name: str) -> int:
        return int(self.raw(name).nbytes_stored())

    def close(self) -> None:
        self._arr.clear()
        self._release_writer_lock()

    @staticmethod
    def create(tmp: Any, layout: dict, attrs: dict, init: dict[str, np.ndarray]) -> None:
        """Write a new store at ``tmp`` (a folder path, or a zarr store object for a URL); its dab attributes are
        written last, so a store without them was never finished (layout.CREATING marks it meanwhile)."""
        import zarr

        g = zarr.open_group(str(tmp) if isinstance(tmp, Path) else tmp, mode="w-")
        g.attrs.update({CREATING: True})
        share_rows = layout.get("share_rows")
        for spec in array_specs(layout):
            n = spec.shape[0]
            if spec.dtype is None:
                a = g.create_array(spec.name, shape=spec.shape, dtype=str, chunks=(max(n, 1),))
                if n:
                    a[...] = np.asarray(init[spec.name], dtype=str)
                continue
            row_bytes = int(np.prod(spec.shape[1:], dtype=np.int64)) * spec.dtype.itemsize
            rows = int(min(max(n, 1), max(1, ZARR_CHUNK_BYTES // max(row_bytes, 1))))
            if share_rows and spec.name.startswith("videos/"):
                # Multi-writer layout: no per-video chunk may straddle a share unit,
                # or two writers would rewrite the same chunk file (zarr rewrites
                # whole chunks) and one of them would lose its rows. Small arrays
                # (status, masks) get one unit a chunk; big ones keep ~1 MiB chunks
                # cut to a divisor of the unit.
                rows = chunk_rows_in_unit(rows, int(share_rows))
            # No sharding and no compression: a shard rewrite per batch costs a
            # whole shard, shard reads need an index lookup (measured 35-50 ms per
            # 32 random rows), and compression saved ~7% on float16 features.
            # Thumbnail rows are mostly zero padding after their JPEG: the one compressed array.
            compressors = None if spec.name not in COMPRESSED else [zstd()]
            a = g.create_array(
                spec.name,
                shape=spec.shape,
                dtype=spec.dtype,
                chunks=(rows, *spec.shape[1:]),
                compressors=compressors,
                fill_value=0,
                config={"write_empty_chunks": True},
            )
            if spec.name in init and n:
                a[...] = init[spec.name]
        g.attrs.put(attrs)  # replaces the CREATING mark: the store is whole


def backend_class(kind: str) -> type[Backend]:
    return H5Backend if kind == "hdf5" else ZarrBackend
