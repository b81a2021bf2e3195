"""The feature store: CLIP features written once by ``dab extract``, read many times.

One logical layout (see ``docs/store-format.md``), two backends picked by the path
suffix: ``.h5`` / ``.hdf5`` (h5py) and ``.zarr`` (zarr v3 on the local file system).

Crash safety (a run killed at any point, SIGKILL included, leaves a store that
opens and resumes) rests on three rules:

* creation is atomic: the whole store is built under a hidden temporary name in
  the same folder and renamed into place, so a killed creation leaves no store;
* every array is preallocated at creation (the dataset index is known up front),
  so extraction only ever overwrites raw array data and never touches HDF5
  metadata (no resizing, no attribute rewrites, no variable-length heap writes);
  zarr's LocalStore writes each chunk file under a temporary name and renames it,
  so a chunk is either the old or the new one;
* a batch's data is written and flushed before its ``status`` / ``done`` flags
  are flipped (and flushed), so a flag never points at half-written data.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .errors import StoreError
from .fsutil import publish, remove_path, temp_sibling

__all__ = [
    "FORMAT_VERSION",
    "STATUS_PENDING",
    "STATUS_OK",
    "STATUS_FAILED",
    "STATUS_MISSING",
    "STATUS_NAMES",
    "ERROR_BYTES",
    "HDF5_SUFFIXES",
    "ZARR_SUFFIXES",
    "FeatureStore",
    "SplitFeatures",
    "create_store",
    "open_store",
    "manifest_compatible",
    "store_backend",
    "default_share_rows",
    "video_share",
    "merge_parts",
]

FORMAT_VERSION = 1

STATUS_PENDING = 0
STATUS_OK = 1
STATUS_FAILED = 2
STATUS_MISSING = 3
STATUS_NAMES = {STATUS_PENDING: "pending", STATUS_OK: "ok", STATUS_FAILED: "failed", STATUS_MISSING: "missing"}

# Messages live in a preallocated fixed-width byte row per video (videos/error): the
# reason of a failed video, or the decoder's warnings for an ok one (truncated file,
# damaged packets). A growing table of variable-length strings would rewrite HDF5
# metadata (heap, B-tree, dataspace) on every append, which a SIGKILL can tear.
ERROR_BYTES = 1024

HDF5_SUFFIXES = (".h5", ".hdf5")
ZARR_SUFFIXES = (".zarr",)
_ALL_SUFFIXES = HDF5_SUFFIXES + ZARR_SUFFIXES

# zarr chunks along the row axis are sized to about this many bytes: big enough
# that a whole-split read is a few large reads, small enough that rewriting the
# chunk of a batch (zarr rewrites whole chunks) stays cheap.
_ZARR_CHUNK_BYTES = 1 << 20

_STRING_ARRAYS = frozenset({"videos/ids", "videos/split", "captions/ids", "captions/split", "captions/text"})
# Writers lock the store folder itself (flock on a directory needs no file, so nothing
# foreign sits inside the zarr hierarchy: plain zarr readers would warn about it).
# Multi-writer mode (distributed extraction into one zarr store): every writer holds
# the folder's lock *shared* (so a single writer, which takes it exclusively, is kept
# out) and its own per-share lock file, next to the store, exclusively (one writer per share).
_SHARE_LOCK = ".{store}.writer-{rank:05d}-of-{world:05d}.lock"
_LEGACY_LOCK = ".dab-writer.lock"  # inside the store, written by dab before the folder lock
# Largest share unit default_share_rows picks: a status chunk of 4 KiB.
_MAX_SHARE_ROWS = 4096
# Arrays read before they are written (all-pending flags): HDF5 writes real zeros into them.
_COMPRESSED = frozenset({"videos/thumbnail"})  # zarr: variable-length content in fixed rows


def _zstd():
    from zarr.codecs import ZstdCodec

    return ZstdCodec(level=3)


_ZERO_INIT = frozenset({"videos/status", "videos/num_video_frames", "videos/frame_mask", "captions/done",
                        "videos/thumbnail_size"})


def store_backend(path: str | os.PathLike) -> str:
    """``"hdf5"`` or ``"zarr"`` from the path suffix; anything else is a StoreError."""
    suffix = Path(path).suffix.lower()
    if suffix in HDF5_SUFFIXES:
        return "hdf5"
    if suffix in ZARR_SUFFIXES:
        return "zarr"
    raise StoreError(
        f"{path}: cannot tell the store format from the suffix {suffix or '(none)'!r}; "
        f"valid suffixes: {', '.join(_ALL_SUFFIXES)}"
    )


def manifest_compatible(existing: dict, new: dict, keys: Iterable[str]) -> list[str]:
    """Keys (dotted paths allowed, e.g. ``"dataset.options"``) whose values differ.

    Values are compared after a JSON round trip, so a tuple written into a store
    (read back as a list) is not reported as a difference. A key present on one
    side only counts as different.
    """
    missing = object()

    def lookup(d: dict, key: str) -> Any:
        cur: Any = d
        for part in key.split("."):
            if not isinstance(cur, dict) or part not in cur:
                return missing
            cur = cur[part]
        return cur

    def norm(v: Any) -> Any:
        return v if v is missing else json.loads(json.dumps(v, sort_keys=True, default=str))

    return [k for k in keys if norm(lookup(existing, k)) != norm(lookup(new, k))]


def default_share_rows(num_videos: int, world_size: int) -> int:
    """Rows of one share unit for ``world_size`` writers: a power of two, about 16 units per writer.

    Writers own whole units, so zarr chunks that never straddle a unit boundary
    are each written by one process. 16 units per writer keeps the shares within
    ~1/16 of each other; the power of two lets every array pick a chunk size that
    divides the unit (see ``create_store(share_rows=...)``).
    """
    if num_videos < 0 or world_size < 1:
        raise ValueError(f"need num_videos >= 0 and world_size >= 1, got {num_videos} and {world_size}")
    target = max(1, num_videos // (16 * world_size))
    return int(min(_MAX_SHARE_ROWS, 1 << (target.bit_length() - 1)))


def video_share(num_videos: int, share_rows: int, rank: int, world_size: int) -> np.ndarray:
    """Sorted video rows of writer ``rank``: the units ``u`` (of ``share_rows`` rows) with ``u % world_size == rank``.

    Deterministic in its arguments only, so a rerun with the same world size hands
    every writer the same videos; round robin over units keeps the shares within
    one unit of each other and spreads every split over all writers.
    """
    if share_rows < 1 or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"bad share: rows={share_rows}, rank={rank}, world_size={world_size}")
    units = np.arange(rank, -(-num_videos // share_rows), world_size, dtype=np.int64)  # (U_r,)
    rows = (units[:, None] * share_rows + np.arange(share_rows, dtype=np.int64)[None, :]).reshape(-1)
    return rows[rows < num_videos]


def _chunk_rows_in_unit(default_rows: int, share_rows: int) -> int:
    """Largest divisor of ``share_rows`` not above ``default_rows``: such chunks never straddle a unit."""
    for d in range(min(default_rows, share_rows), 0, -1):
        if share_rows % d == 0:
            return d
    return 1


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class _Spec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype | None  # None for strings


def _array_specs(layout: dict) -> list[_Spec]:
    """Every array of a store with this layout (the one place the layout is defined)."""
    n, m, f, d = layout["num_videos"], layout["num_captions"], layout["num_frames"], layout["dim"]
    dt = np.dtype(layout["dtype"])
    specs = [
        _Spec("videos/ids", (n,), None),
        _Spec("videos/split", (n,), None),
        _Spec("videos/status", (n,), np.dtype(np.int8)),
        _Spec("videos/num_video_frames", (n,), np.dtype(np.int32)),
        _Spec("videos/frame_mask", (n, f), np.dtype(bool)),
        _Spec("videos/frames", (n, f, d), dt),
        _Spec("videos/error", (n, ERROR_BYTES), np.dtype(np.uint8)),
        _Spec("captions/ids", (m,), None),
        _Spec("captions/split", (m,), None),
        _Spec("captions/text", (m,), None),
        _Spec("captions/video_index", (m,), np.dtype(np.int64)),
        _Spec("captions/done", (m,), np.dtype(bool)),
        _Spec("captions/features", (m, d), dt),
    ]
    state_layout = layout["state_layout"]
    views = int(layout.get("train_views") or 0)  # augmented training views (0 in stores made before them)
    thumb = int(layout.get("thumbnail_bytes") or 0)  # JPEG thumbnails (0 in stores made before them)
    if thumb:
        specs.append(_Spec("videos/thumbnail", (n, thumb), np.dtype(np.uint8)))
        specs.append(_Spec("videos/thumbnail_size", (n,), np.dtype(np.int32)))
    if views:
        specs.append(_Spec("videos/views", (n, views, f, d), dt))
    if state_layout != "none":
        specs.append(_Spec("videos/states", (n, f, *layout["vision_state_shape"]), dt))
        if views:
            specs.append(_Spec("videos/view_states", (n, views, f, *layout["vision_state_shape"]), dt))
    if state_layout == "pooled":
        specs.append(_Spec("captions/states", (m, layout["text_state_width"]), dt))
    elif state_layout == "tokens":
        specs.append(_Spec("captions/token_states", (layout["num_text_tokens"], layout["text_state_width"]), dt))
        specs.append(_Spec("captions/token_offsets", (m + 1,), np.dtype(np.int64)))
    return specs


def _runs(sorted_idx: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs ``[start, stop)`` of consecutive values in a sorted unique index array."""
    if len(sorted_idx) == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_idx) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(sorted_idx)]])
    return [(int(sorted_idx[a]), int(sorted_idx[b - 1]) + 1) for a, b in zip(starts, stops)]


# -------------------------------------------------------------------------- backends


class _Backend:
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
        self.read_runs(name, _runs(idx_sorted), out)
        return out


def _h5_locking_kwargs() -> dict:
    # An explicit HDF5_USE_FILE_LOCKING wins (HDF5 reads it itself); otherwise
    # lock where the file system can, and carry on where it cannot (NFS, some FUSE).
    return {} if "HDF5_USE_FILE_LOCKING" in os.environ else {"locking": "best-effort"}


class _H5Backend(_Backend):
    kind = "hdf5"

    def __init__(self, path: Path, mode: str) -> None:
        import h5py

        self.path = path
        try:
            self.f = h5py.File(path, "r" if mode == "r" else "r+", **_h5_locking_kwargs())
        except OSError as e:
            if "lock" in str(e).lower():
                # HDF5 allows one writer and nobody else, or any number of readers.
                raise StoreError(
                    f"{path} is locked by another process ({'a writer is' if mode == 'r' else 'a reader or writer is'} "
                    f"using it); set HDF5_USE_FILE_LOCKING=FALSE to read it anyway [{e}]"
                ) from None
            raise StoreError(f"{path} is not a readable HDF5 file: {e}") from None
        self._ds: dict[str, Any] = {}

    def _get(self, name: str) -> Any:
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
        return tuple(self._get(name).shape)

    def read_all(self, name: str) -> np.ndarray:
        return self._get(name)[()]

    def read_strings(self, name: str) -> np.ndarray:
        vals = self._get(name).asstr()[()]
        return np.asarray(vals, dtype=str) if len(vals) else np.zeros(0, dtype="<U1")

    def read_range(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        out[...] = self._get(name)[start:stop]

    def read_rows(self, name: str, idx_sorted: np.ndarray, out: np.ndarray) -> np.ndarray:
        runs = _runs(idx_sorted)
        if len(runs) <= 2:
            self.read_runs(name, runs, out)
            return out
        # On a contiguous dataset a sorted index list is one H5Dread of a
        # hyperslab union: ~15 us a row at 32 rows, ~8 us at 7000, where one
        # slice per run costs ~50 us of h5py overhead each. (Fancy indexing
        # is only slow on *chunked* datasets: 7.5 ms for 32 rows.)
        return self._get(name)[idx_sorted]

    def write_range(self, name: str, start: int, values: np.ndarray) -> None:
        self._get(name)[start : start + len(values)] = values

    def write_prefix(self, name: str, row: int, values: np.ndarray) -> None:
        """The first len(values) entries of one row (the rest is left as it is: unwritten stays sparse)."""
        self._get(name)[row, : len(values)] = values

    def flush(self) -> None:
        # Pushes HDF5's sieve buffer and metadata cache to the OS; the OS page
        # cache survives a SIGKILL of this process.
        self.f.flush()

    def stored_bytes(self, name: str) -> int:
        return int(self._get(name).id.get_storage_size())

    def close(self) -> None:
        if self.f.id.valid:
            self.f.close()

    @staticmethod
    def create(tmp: Path, layout: dict, attrs: dict, init: dict[str, np.ndarray]) -> None:
        import h5py

        with h5py.File(tmp, "w", **_h5_locking_kwargs()) as f:
            for k, v in attrs.items():
                f.attrs[k] = v if isinstance(v, int) else json.dumps(v, sort_keys=True)
            for spec in _array_specs(layout):
                if spec.dtype is None:
                    # Strings are written once, here, before the file is published.
                    f.create_dataset(spec.name, data=np.asarray(init[spec.name], dtype=object), dtype=h5py.string_dtype())
                    continue
                if spec.name in _COMPRESSED:
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
                elif spec.name in _ZERO_INIT:
                    # Unwritten "never"-filled storage is formally undefined; the
                    # flags and masks are read before anything is written.
                    ds[...] = np.zeros(spec.shape, spec.dtype)
            f.flush()
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class _RawChunks:
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


class _ZarrBackend(_Backend):
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
            self.g = zarr.open_group(str(path), mode="r" if mode == "r" else "r+")
        except Exception as e:  # zarr raises FileNotFoundError / ValueError / JSONDecodeError
            self._release_writer_lock()
            raise StoreError(f"{path} is not a readable zarr store: {type(e).__name__}: {e}") from None
        self._arr: dict[str, Any] = {}
        self._raw: dict[str, _RawChunks | None] = {}

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
            (self.path / _LEGACY_LOCK).unlink(missing_ok=True)
        else:
            rank, world = writer
            share_lock = self.path.parent / _SHARE_LOCK.format(store=self.path.name, rank=rank, world=world)
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

    def _get(self, name: str) -> Any:
        a = self._arr.get(name)
        if a is None:
            try:
                a = self.g[name]
            except KeyError:
                raise StoreError(f"{self.path}: array {name!r} is missing") from None
            self._arr[name] = a
        return a

    def _raw_chunks(self, name: str) -> _RawChunks | None:
        """Direct chunk-file access when the array is plain little-endian bytes, else None."""
        if name in self._raw:
            return self._raw[name]
        from zarr.codecs import BytesCodec

        a = self._get(name)
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
            info = _RawChunks(str(self.path / name), int(a.chunks[0]), tuple(a.shape[1:]), dt, a.ndim, md)
        self._raw[name] = info
        return info

    def attrs(self) -> dict:
        return dict(self.g.attrs.asdict())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._get(name).shape)

    def read_all(self, name: str) -> np.ndarray:
        raw = self._raw_chunks(name)
        if raw is None:
            return self._get(name)[...]
        n = self._get(name).shape[0]
        out = np.empty((n, *raw.row_shape), raw.dtype)
        self.read_range(name, 0, n, out)
        return out

    def read_strings(self, name: str) -> np.ndarray:
        vals = self._get(name)[...]
        # zarr hands back numpy's variable-width StringDType; the API promises "<U".
        return np.asarray(vals.tolist(), dtype=str) if len(vals) else np.zeros(0, dtype="<U1")

    def read_range(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        raw = self._raw_chunks(name)
        if raw is None:
            out[...] = self._get(name)[start:stop]
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
                # zarr drops chunks that are all fill value (0).
                out[row - start : hi - start] = 0
                row = hi
                continue
            try:
                want = (hi - row) * rb
                got = os.preadv(fd, [memoryview(flat[seg_out])], (row - c * raw.rows_per_chunk) * rb) if want else 0
            finally:
                os.close(fd)
            if got != want:
                raise StoreError(f"{self.path}: chunk file {path} is truncated ({got} of {want} bytes readable)")
            row = hi

    def read_rows(self, name: str, idx_sorted: np.ndarray, out: np.ndarray) -> np.ndarray:
        raw = self._raw_chunks(name)
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
                out[lo:hi] = 0  # zarr drops chunks that are all fill value (0)
                continue
            try:
                runs = _runs(rows)
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
        self._get(name)[start : start + len(values)] = values

    def write_prefix(self, name: str, row: int, values: np.ndarray) -> None:
        """The first len(values) entries of one row (the rest is left as it is: unwritten stays sparse)."""
        self._get(name)[row, : len(values)] = values

    def flush(self) -> None:
        # zarr's LocalStore has finished (written + renamed) every chunk file by
        # the time an assignment returns; nothing is buffered in this process.
        pass

    def stored_bytes(self, name: str) -> int:
        return int(self._get(name).nbytes_stored())

    def close(self) -> None:
        self._arr.clear()
        self._release_writer_lock()

    @staticmethod
    def create(tmp: Path, layout: dict, attrs: dict, init: dict[str, np.ndarray]) -> None:
        import zarr

        g = zarr.open_group(str(tmp), mode="w-")
        g.attrs.update(attrs)
        share_rows = layout.get("share_rows")
        for spec in _array_specs(layout):
            n = spec.shape[0]
            if spec.dtype is None:
                a = g.create_array(spec.name, shape=spec.shape, dtype=str, chunks=(max(n, 1),))
                if n:
                    a[...] = np.asarray(init[spec.name], dtype=str)
                continue
            row_bytes = int(np.prod(spec.shape[1:], dtype=np.int64)) * spec.dtype.itemsize
            rows = int(min(max(n, 1), max(1, _ZARR_CHUNK_BYTES // max(row_bytes, 1))))
            if share_rows and spec.name.startswith("videos/"):
                # Multi-writer layout: no per-video chunk may straddle a share unit,
                # or two writers would rewrite the same chunk file (zarr rewrites
                # whole chunks) and one of them would lose its rows. Small arrays
                # (status, masks) get one unit a chunk; big ones keep ~1 MiB chunks
                # cut to a divisor of the unit.
                rows = _chunk_rows_in_unit(rows, int(share_rows))
            # No sharding and no compression: a shard rewrite per batch costs a
            # whole shard, shard reads need an index lookup (measured 35-50 ms per
            # 32 random rows), and compression saved ~7% on float16 features.
            # Thumbnail rows are mostly zero padding after their JPEG: the one compressed array.
            compressors = None if spec.name not in _COMPRESSED else [_zstd()]
            a = g.create_array(
                spec.name,
                shape=spec.shape,
                dtype=spec.dtype,
                chunks=(rows, *spec.shape[1:]),
                compressors=compressors,
                fill_value=0,
            )
            if spec.name in init and n:
                a[...] = init[spec.name]


def _message_rows(messages: Sequence[str]) -> np.ndarray:
    """(B, ERROR_BYTES) uint8: each message as UTF-8, cut at a character boundary, zero padded."""
    rows = np.zeros((len(messages), ERROR_BYTES), np.uint8)
    for i, m in enumerate(messages):
        raw = str(m).encode("utf-8")[:ERROR_BYTES].decode("utf-8", "ignore").encode("utf-8")
        rows[i, : len(raw)] = np.frombuffer(raw, np.uint8)
    return rows


def _backend_class(kind: str) -> type[_Backend]:
    return _H5Backend if kind == "hdf5" else _ZarrBackend


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -------------------------------------------------------------------------- splits


@dataclass
class SplitFeatures:
    """Everything of one split in RAM, ready for training or scoring.

    Only videos with status ok are included; captions whose video is not ok (or
    whose features were never written) are dropped and counted.
    """

    split: str
    video_ids: np.ndarray  # (V,) str
    frames: np.ndarray  # (V, F, D) float32
    frame_mask: np.ndarray  # (V, F) bool
    caption_ids: np.ndarray  # (Q,) str
    caption_video: np.ndarray  # (Q,) int64, index into video_ids
    text: np.ndarray  # (Q, D) float32
    video_index: np.ndarray  # (V,) int64, rows in the store (for read_videos / read_vision_states)
    caption_index: np.ndarray  # (Q,) int64, rows in the store
    num_excluded_videos: int = 0  # videos of the split that are failed, missing or pending
    num_dropped_captions: int = 0  # captions of the split left out (their video excluded / not written)
    # Partial fine-tuning states, kept in the store dtype (float16 by default)
    # because token grids are large; cast per batch.
    vision_states: np.ndarray | None = None  # (V, F, W) pooled | (V, F, L, W) tokens
    text_states: np.ndarray | None = None  # (Q, W) pooled | (sum_q T_q, W) tokens, flat
    text_lengths: np.ndarray | None = None  # (Q,) int64 tokens per caption (token layout)
    text_offsets: np.ndarray | None = None  # (Q + 1,) int64 into text_states rows (token layout)
    # Augmented training views (load_split(..., with_views=True) on a store made with train_views)
    views: np.ndarray | None = None  # (V, N, F, D) float32
    view_states: np.ndarray | None = None  # (V, N, F, W) | (V, N, F, L, W), store dtype (with states)

    @property
    def num_videos(self) -> int:
        return len(self.video_ids)

    @property
    def num_captions(self) -> int:
        return len(self.caption_ids)

    def text_state_batch(self, rows: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token states of captions ``rows`` padded to the longest: ((B, T, W) float32, lengths (B,))."""
        if self.text_states is None or self.text_offsets is None or self.text_lengths is None:
            raise ValueError("this split holds no token-level text states (load_split(..., with_states=True) on a K>0 store)")
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self.text_lengths[rows]
        states, offsets = self.text_states, self.text_offsets

        def fill(j: int, dest: np.ndarray) -> None:
            dest[:] = states[offsets[rows[j]]: offsets[rows[j] + 1]]

        return pad_ragged(lengths, states.shape[1], fill), lengths


def pad_ragged(lengths: np.ndarray, width: int, fill: Callable[[int, np.ndarray], None]) -> np.ndarray:
    """Ragged token states -> zero-padded (B, T_max, W) float32; ``fill(j, dest)`` writes row j's (T_j, W)."""
    out = np.zeros((len(lengths), int(np.max(lengths, initial=0)), width), np.float32)
    for j, n in enumerate(lengths):
        fill(j, out[j, : int(n)])
    return out


# --------------------------------------------------------------------------- store


class FeatureStore:
    """An open feature store; use :func:`create_store` / :func:`open_store` to get one."""

    def __init__(self, path: Path, backend: _Backend, mode: str, writer: tuple[int, int] | None = None) -> None:
        self.path = path
        self._b = backend
        self.mode = mode
        self.writer = writer
        # Multi-writer mode: the rows this writer may touch (None: all of them).
        self._own_videos: np.ndarray | None = None
        try:
            self._load_header()
            if writer is not None:
                self._init_writer_share(*writer)
        except Exception:
            backend.close()
            raise

    def _init_writer_share(self, rank: int, world: int) -> None:
        if not (isinstance(rank, int) and isinstance(world, int) and 0 <= rank < world):
            raise ValueError(f"writer must be (rank, world_size) with 0 <= rank < world_size, got {(rank, world)}")
        rows = self.share_rows
        if rows is None and world > 1:
            raise StoreError(
                f"{self.path} was created for a single writer (its chunks are not aligned to shares); "
                f"it cannot take {world} concurrent writers: finish it with one process, or pass --overwrite"
            )
        own = np.zeros(self.num_videos, bool)
        own[video_share(self.num_videos, rows or max(1, self.num_videos), rank, world)] = True
        self._own_videos = own

    # -- opening ---------------------------------------------------------------

    def _load_header(self) -> None:
        attrs = self._b.attrs()
        fmt = attrs.get("dab_store_format")
        if fmt is None or "layout" not in attrs or "manifest" not in attrs:
            raise StoreError(f"{self.path} is not a dab feature store (no dab_store_format/layout/manifest attributes)")
        if int(fmt) > FORMAT_VERSION:
            raise StoreError(
                f"{self.path} has store format {fmt}; this dab reads format {FORMAT_VERSION} or older (upgrade dab)"
            )
        self.layout: dict = attrs["layout"]
        self.manifest: dict = attrs["manifest"]
        try:
            specs = _array_specs(self.layout)
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"{self.path}: malformed layout attribute ({e})") from None
        self._specs = {spec.name: spec for spec in specs}
        for spec in specs:
            shape = self._b.shape(spec.name)
            if shape != spec.shape:
                raise StoreError(f"{self.path}: array {spec.name!r} has shape {shape}, expected {spec.shape}")
        self.video_ids = self._b.read_strings("videos/ids")  # (N,) str
        self.video_split = self._b.read_strings("videos/split")  # (N,) str
        self.caption_ids = self._b.read_strings("captions/ids")  # (M,) str
        self.caption_split = self._b.read_strings("captions/split")  # (M,) str
        self.caption_video_index = np.asarray(self._b.read_all("captions/video_index"), np.int64)  # (M,)
        if self.state_layout == "tokens":
            self._token_offsets = np.asarray(self._b.read_all("captions/token_offsets"), np.int64)  # (M+1,)
            self._token_lengths = np.diff(self._token_offsets)  # (M,)
        if self.num_captions and (self.caption_video_index.min() < 0 or self.caption_video_index.max() >= self.num_videos):
            raise StoreError(f"{self.path}: captions/video_index points outside the {self.num_videos} videos")

    # -- shape of the store ----------------------------------------------------

    @property
    def backend(self) -> str:
        return self._b.kind

    @property
    def num_videos(self) -> int:
        return int(self.layout["num_videos"])

    @property
    def num_captions(self) -> int:
        return int(self.layout["num_captions"])

    @property
    def num_frames(self) -> int:
        return int(self.layout["num_frames"])

    @property
    def dim(self) -> int:
        return int(self.layout["dim"])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.layout["dtype"])

    @property
    def state_layout(self) -> str:
        """``"none"``, ``"pooled"`` (K=0: pre-LN pooled states) or ``"tokens"`` (K>0)."""
        return str(self.layout["state_layout"])

    @property
    def has_states(self) -> bool:
        return self.state_layout != "none"

    @property
    def trainable_blocks(self) -> int | None:
        """K from the manifest (0 for pooled states); None when the store holds no states."""
        if not self.has_states:
            return None
        k = self.manifest.get("trainable_blocks")
        return int(k) if k is not None else (0 if self.state_layout == "pooled" else None)

    @property
    def vision_state_shape(self) -> tuple[int, ...] | None:
        s = self.layout.get("vision_state_shape")
        return tuple(s) if s is not None else None

    @property
    def text_state_width(self) -> int | None:
        w = self.layout.get("text_state_width")
        return int(w) if w is not None else None

    @property
    def text_state_lengths(self) -> np.ndarray | None:
        """(M,) int64 token count per caption (token layout), else None."""
        return self._token_lengths if self.state_layout == "tokens" else None

    @property
    def share_rows(self) -> int | None:
        """Rows of one writer share unit (multi-writer layouts), else None."""
        r = self.layout.get("share_rows")
        return int(r) if r is not None else None

    def video_share(self, rank: int, world_size: int) -> np.ndarray:
        """Sorted rows of writer ``rank`` of ``world_size`` (see :func:`video_share`)."""
        rows = self.share_rows or default_share_rows(self.num_videos, world_size)
        return video_share(self.num_videos, rows, rank, world_size)

    @cached_property
    def caption_text(self) -> np.ndarray:
        """(M,) str, read on first use (training never needs it)."""
        return self._b.read_strings("captions/text")

    def splits(self) -> list[str]:
        return sorted(set(self.video_split.tolist()) | set(self.caption_split.tolist()))

    # -- status ----------------------------------------------------------------

    def status(self) -> np.ndarray:
        """(N,) int8 per video: 0 pending, 1 ok, 2 failed, 3 missing on disk."""
        return np.asarray(self._b.read_all("videos/status"), np.int8)

    def done(self) -> np.ndarray:
        """(N,) bool: the video needs no more work (ok, failed or missing)."""
        return self.status() != STATUS_PENDING

    def pending_videos(self, include_failed: bool = False) -> np.ndarray:
        """Indices still to extract (status pending; plus failed ones to retry them)."""
        st = self.status()
        todo = st == STATUS_PENDING
        if include_failed:
            todo |= st == STATUS_FAILED
        return np.flatnonzero(todo)

    def num_video_frames(self) -> np.ndarray:
        """(N,) int32 frames in each source video (0 until the video is written)."""
        return np.asarray(self._b.read_all("videos/num_video_frames"), np.int32)

    def caption_done(self) -> np.ndarray:
        """(M,) bool: the caption's features are written."""
        return np.asarray(self._b.read_all("captions/done"), bool)

    def pending_captions(self) -> np.ndarray:
        return np.flatnonzero(~self.caption_done())

    def captions_done(self) -> bool:
        return bool(self.caption_done().all())

    @property
    def is_complete(self) -> bool:
        return not (self.status() == STATUS_PENDING).any() and self.captions_done()

    def failures(self) -> list[tuple[str, str]]:
        """(video_id, error message) of every failed video, in store order."""
        return self._messages(np.flatnonzero(self.status() == STATUS_FAILED))

    def warnings(self) -> list[tuple[str, str]]:
        """(video_id, decoder warnings) of every ok video that has some, in store order."""
        return [m for m in self._messages(np.flatnonzero(self.status() == STATUS_OK)) if m[1]]

    def _messages(self, idx: np.ndarray) -> list[tuple[str, str]]:
        if len(idx) == 0:
            return []
        rows = self._read_rows("videos/error", idx)  # (B, ERROR_BYTES) uint8
        return [(str(self.video_ids[i]), bytes(r).rstrip(b"\0").decode("utf-8", "replace")) for i, r in zip(idx, rows)]

    # -- writing ---------------------------------------------------------------

    def _require_writable(self) -> None:
        if self.mode != "a":
            raise StoreError(f"{self.path} is open read-only; open it with mode='a' to write")

    def _require_own_videos(self, idx: np.ndarray) -> None:
        """Multi-writer mode: a writer touches only its share (other rows' chunks belong to other processes)."""
        if self._own_videos is not None and len(idx) and not self._own_videos[idx].all():
            bad = idx[~self._own_videos[idx]]
            raise ValueError(
                f"writer {self.writer[0]} of {self.writer[1]} may not write videos outside its share: "
                f"{self.video_ids[bad[:5]].tolist()}"
            )

    def _require_caption_writer(self) -> None:
        if self.writer is not None and self.writer[0] != 0:
            raise ValueError(f"captions are written by writer 0 only (this is writer {self.writer[0]} of {self.writer[1]})")

    def _indices(self, indices: Iterable[int] | np.ndarray, n: int, what: str) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{what} indices must lie in [0, {n}); got {idx.min()}..{idx.max()}")
        if len(np.unique(idx)) != len(idx):
            raise ValueError(f"{what} indices repeat within one batch: {idx.tolist()}")
        return idx

    def _write_rows(self, name: str, idx_sorted: np.ndarray, values: np.ndarray) -> None:
        j = 0
        for a, b in _runs(idx_sorted):
            self._b.write_range(name, a, values[j : j + (b - a)])
            j += b - a

    def _set_status(self, idx: np.ndarray, value: int) -> None:
        idx = np.sort(idx)
        self._write_rows("videos/status", idx, np.full(len(idx), value, np.int8))
        self._b.flush()

    def _cast(self, x: Any, shape: tuple[int, ...], what: str, ids: np.ndarray) -> np.ndarray:
        arr = np.asarray(x)
        if arr.shape != shape:
            raise ValueError(f"{what} has shape {arr.shape}, expected {shape}")
        with np.errstate(over="ignore"):  # overflow is reported below, by name
            out = arr.astype(self.dtype, copy=False)
        if out.dtype.kind == "f" and not np.isfinite(out).all():
            bad = np.unique(np.nonzero(~np.isfinite(out.reshape(len(out), -1)))[0])
            raise ValueError(
                f"{what} of {ids[bad].tolist()} is not finite in {self.dtype} (NaN/inf, or beyond float16 range)"
            )
        return out

    def write_videos(
        self,
        indices: Sequence[int] | np.ndarray,
        frames: np.ndarray,
        frame_mask: np.ndarray,
        num_video_frames: Sequence[int] | np.ndarray,
        vision_states: np.ndarray | None = None,
        warnings: Sequence[str | None] | None = None,
    ) -> None:
        """Write a batch of videos' features, then mark them ok.

        frames (B, F, D), frame_mask (B, F), num_video_frames (B,), vision_states
        (B, F, W) or (B, F, L, W) when the store holds states (required then),
        warnings (B,) a message per video or None (kept in videos/error, 1 KiB each).
        """
        self._require_writable()
        idx = self._indices(indices, self.num_videos, "video")
        self._require_own_videos(idx)
        b, f, d = len(idx), self.num_frames, self.dim
        ids = self.video_ids[idx]
        feats = self._cast(frames, (b, f, d), "frames", ids)  # (B, F, D)
        mask = np.asarray(frame_mask)
        if mask.shape != (b, f):
            raise ValueError(f"frame_mask has shape {mask.shape}, expected {(b, f)}")
        nvf = np.asarray(num_video_frames).reshape(-1)
        if nvf.shape != (b,):
            raise ValueError(f"num_video_frames has shape {nvf.shape}, expected {(b,)}")
        states = None
        if self.has_states:
            if vision_states is None:
                raise ValueError(f"{self.path} stores vision states ({self.state_layout}); write_videos needs vision_states")
            states = self._cast(vision_states, (b, f, *self.vision_state_shape), "vision_states", ids)
        elif vision_states is not None:
            raise ValueError(f"{self.path} was created without vision states; vision_states must be None")

        if warnings is not None and len(warnings) != b:
            raise ValueError(f"warnings has {len(warnings)} entries, expected {b}")
        notes = _message_rows([w or "" for w in warnings] if warnings is not None else [""] * b)  # (B, E)

        order = np.argsort(idx, kind="stable")
        idx = idx[order]
        # Always written: a retried video that failed before must not keep its old message.
        self._write_rows("videos/error", idx, notes[order])
        self._write_rows("videos/frames", idx, feats[order])
        self._write_rows("videos/frame_mask", idx, mask[order].astype(bool))
        self._write_rows("videos/num_video_frames", idx, nvf[order].astype(np.int32))
        if states is not None:
            self._write_rows("videos/states", idx, states[order])
        # Data reaches the file before the flag that vouches for it.
        self._b.flush()
        self._set_status(idx, STATUS_OK)

    def mark_failed(self, index: int, error: str) -> None:
        """Record that video ``index`` failed, with its error message (truncated to 1 KiB of UTF-8)."""
        self._require_writable()
        idx = self._indices([index], self.num_videos, "video")
        self._require_own_videos(idx)
        self._write_rows("videos/error", idx, _message_rows([error]))
        self._b.flush()
        self._set_status(idx, STATUS_FAILED)

    def mark_missing(self, indices: Sequence[int] | np.ndarray) -> None:
        """Record that these videos are listed by the dataset but absent on disk."""
        self._require_writable()
        idx = self._indices(indices, self.num_videos, "video")
        self._require_own_videos(idx)
        self._set_status(idx, STATUS_MISSING)

    def write_captions(
        self,
        indices: Sequence[int] | np.ndarray,
        text: np.ndarray,
        text_states: np.ndarray | Sequence[np.ndarray] | None = None,
    ) -> None:
        """Write a batch of captions' features, then mark them done.

        text (B, D); text_states: (B, W) for pooled states, or a sequence of B
        arrays (T_i, W) with T_i the length given at creation, for token states.
        """
        self._require_writable()
        self._require_caption_writer()
        idx = self._indices(indices, self.num_captions, "caption")
        b = len(idx)
        ids = self.caption_ids[idx]
        feats = self._cast(text, (b, self.dim), "text", ids)  # (B, D)
        order = np.argsort(idx, kind="stable")
        sidx = idx[order]
        if self.state_layout == "none" and text_states is not None:
            raise ValueError(f"{self.path} was created without text states; text_states must be None")
        if self.has_states and text_states is None:
            raise ValueError(f"{self.path} stores text states ({self.state_layout}); write_captions needs text_states")

        self._write_rows("captions/features", sidx, feats[order])
        if self.state_layout == "pooled":
            st = self._cast(text_states, (b, self.text_state_width), "text_states", ids)  # (B, W)
            self._write_rows("captions/states", sidx, st[order])
        elif self.state_layout == "tokens":
            seq = list(text_states)  # type: ignore[arg-type]
            if len(seq) != b:
                raise ValueError(f"text_states holds {len(seq)} captions, expected {b}")
            lengths = self.text_state_lengths
            parts = []
            for q in order:
                want = (int(lengths[idx[q]]), self.text_state_width)
                parts.append(self._cast(seq[q], want, f"text_states of caption {ids[q]!r}", ids[q : q + 1]))
            # Consecutive captions are consecutive in the flat token array: one write per run.
            j = 0
            for a, e in _runs(sidx):
                rows = np.concatenate(parts[j : j + (e - a)], axis=0)  # (sum T, W)
                self._b.write_range("captions/token_states", int(self._token_offsets[a]), rows)
                j += e - a
        self._b.flush()
        self._write_rows("captions/done", sidx, np.ones(b, bool))
        self._b.flush()

    # -- reading ---------------------------------------------------------------

    def _read_rows(self, name: str, idx_sorted: np.ndarray) -> np.ndarray:
        """Rows ``idx_sorted`` (sorted, unique) of an array, in the store dtype."""
        shape = self._b.shape(name)
        out = np.empty((len(idx_sorted), *shape[1:]), dtype=self._dtype_of(name))
        return self._b.read_rows(name, idx_sorted, out)

    def _dtype_of(self, name: str) -> np.dtype:
        return self._specs[name].dtype

    def _read_any(self, name: str, indices: Sequence[int] | np.ndarray, n: int, what: str) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{what} indices must lie in [0, {n}); got {idx.min()}..{idx.max()}")
        uniq, inverse = np.unique(idx, return_inverse=True)
        rows = self._read_rows(name, uniq)
        return rows if len(uniq) == len(idx) and (uniq == idx).all() else rows[inverse]

    def _require_ok(self, idx: np.ndarray) -> None:
        st = self.status()[idx]
        bad = st != STATUS_OK
        if bad.any():
            desc = ", ".join(f"{self.video_ids[i]} ({STATUS_NAMES.get(int(s), s)})" for i, s in zip(idx[bad][:5], st[bad][:5]))
            raise StoreError(f"{self.path}: videos without features requested: {desc}")

    def read_videos(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Random access for training batches: frames (B, F, D) float32, mask (B, F) bool.

        Every requested video must have status ok (StoreError otherwise).
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        self._require_ok(idx)
        frames = self._read_any("videos/frames", idx, self.num_videos, "video").astype(np.float32)
        mask = self._read_any("videos/frame_mask", idx, self.num_videos, "video").astype(bool)
        return frames, mask

    def read_vision_states(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """(B, F, W) or (B, F, L, W) in the store dtype."""
        if not self.has_states:
            raise StoreError(f"{self.path} holds no vision states (created without trainable_blocks)")
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        self._require_ok(idx)
        return self._read_any("videos/states", idx, self.num_videos, "video")

    def read_text_states(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Pooled: ((B, W), None); tokens: ((B, T_max, W) float32 zero-padded, lengths (B,))."""
        if not self.has_states:
            raise StoreError(f"{self.path} holds no text states (created without trainable_blocks)")
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if self.state_layout == "pooled":
            return self._read_any("captions/states", idx, self.num_captions, "caption"), None
        lengths = self.text_state_lengths[idx]
        buf = np.empty((int(lengths.max(initial=0)), self.text_state_width), self.dtype)

        def fill(j: int, dest: np.ndarray) -> None:
            o, n = int(self._token_offsets[idx[j]]), int(lengths[j])
            self._b.read_range("captions/token_states", o, o + n, buf[:n])  # in the store's dtype
            dest[:] = buf[:n]

        return pad_ragged(lengths, self.text_state_width, fill), lengths

    @property
    def train_views(self) -> int:
        """Augmented views stored per training video (0: none)."""
        return int(self.layout.get("train_views") or 0)

    def _optional_rows(self, indices: Sequence[int] | np.ndarray, present: int, what: str) -> np.ndarray:
        """Checked video rows for writing an optional array (``present``: its layout size, 0 when absent)."""
        self._require_writable()
        if not present:
            raise ValueError(f"{self.path} was created without {what}")
        idx = self._indices(indices, self.num_videos, "video")
        self._require_own_videos(idx)
        return idx

    @property
    def thumbnail_bytes(self) -> int:
        """Bytes reserved per video for its JPEG thumbnail (0: the store has none)."""
        return int(self.layout.get("thumbnail_bytes") or 0)

    def write_thumbnails(self, indices: Sequence[int] | np.ndarray, jpegs: Sequence[bytes | None]) -> None:
        """Write videos' JPEG thumbnails (each at most :attr:`thumbnail_bytes`; None: no thumbnail)."""
        cap = self.thumbnail_bytes
        idx = self._optional_rows(indices, cap, "thumbnails")
        if len(jpegs) != len(idx):
            raise ValueError(f"{len(jpegs)} thumbnails for {len(idx)} videos")
        sizes = np.zeros(len(idx), np.int32)
        for j, data in enumerate(jpegs):
            if data:
                if len(data) > cap:
                    raise ValueError(f"thumbnail of {self.video_ids[idx[j]]} is {len(data)} bytes; at most {cap}")
                # only the JPEG's own bytes: the row's padding is never written (sparse in HDF5, compressed in zarr)
                self._b.write_prefix("videos/thumbnail", int(idx[j]), np.frombuffer(data, np.uint8))
                sizes[j] = len(data)
        order = np.argsort(idx, kind="stable")
        self._write_rows("videos/thumbnail_size", idx[order], sizes[order])

    def read_thumbnails(self, indices: Sequence[int] | np.ndarray) -> list[bytes | None]:
        """The JPEG thumbnails of these videos (None where there is none, or the store has none)."""
        idx = self._indices(indices, self.num_videos, "video")
        if not self.thumbnail_bytes or len(idx) == 0:
            return [None] * len(idx)
        sizes = self._read_any("videos/thumbnail_size", idx, self.num_videos, "video")
        status = self.status()[idx]
        rows = self._read_any("videos/thumbnail", idx, self.num_videos, "video")
        return [bytes(rows[j, : sizes[j]]) if status[j] == STATUS_OK and sizes[j] > 0 else None
                for j in range(len(idx))]

    def write_views(self, indices: Sequence[int] | np.ndarray, views: np.ndarray,
                    view_states: np.ndarray | None = None) -> None:
        """Write the augmented views of training videos; call before :meth:`write_videos` marks them ok.

        views (B, N, F, D); view_states (B, N, F, W) | (B, N, F, L, W), required when the store
        holds states.
        """
        n_views = self.train_views
        idx = self._optional_rows(indices, n_views, "train_views (augmented views)")
        ids = self.video_ids[idx]
        b, f, d = len(idx), self.num_frames, self.dim
        v = self._cast(views, (b, n_views, f, d), "views", ids)  # (B, N, F, D)
        vs = None
        if self.has_states:
            if view_states is None:
                raise ValueError(f"{self.path} stores vision states; write_views needs view_states")
            vs = self._cast(view_states, (b, n_views, f, *self.vision_state_shape), "view_states", ids)
        order = np.argsort(idx, kind="stable")
        self._write_rows("videos/views", idx[order], v[order])
        if vs is not None:
            self._write_rows("videos/view_states", idx[order], vs[order])

    def load_split(self, split: str, with_states: bool = False, with_views: bool = False) -> SplitFeatures:
        """Every ok video of ``split`` and the written captions pointing at them, in RAM.

        ``with_views``: also the augmented views (only training videos have them written).
        """
        if split not in self.splits():
            raise StoreError(f"{self.path}: no split {split!r}; splits in this store: {', '.join(self.splits()) or '(none)'}")
        if with_states and not self.has_states:
            raise StoreError(f"{self.path} holds no states; re-extract with trainable_blocks set to load them")
        status = self.status()
        in_split = self.video_split == split
        vidx = np.flatnonzero(in_split & (status == STATUS_OK))  # (V,) store rows
        remap = np.full(self.num_videos, -1, np.int64)
        remap[vidx] = np.arange(len(vidx))
        cap_in = np.flatnonzero(self.caption_split == split)
        cvid = remap[self.caption_video_index[cap_in]]
        keep = (cvid >= 0) & self.caption_done()[cap_in]
        cidx = cap_in[keep]  # (Q,) store rows

        sf = SplitFeatures(
            split=split,
            video_ids=self.video_ids[vidx],
            frames=self._read_rows("videos/frames", vidx).astype(np.float32),
            frame_mask=self._read_rows("videos/frame_mask", vidx).astype(bool),
            caption_ids=self.caption_ids[cidx],
            caption_video=cvid[keep],
            text=self._read_rows("captions/features", cidx).astype(np.float32),
            video_index=vidx,
            caption_index=cidx,
            num_excluded_videos=int(in_split.sum() - len(vidx)),
            num_dropped_captions=int(len(cap_in) - len(cidx)),
        )
        if with_views:
            if not self.train_views:
                raise StoreError(f"{self.path} holds no augmented views (extracted without --train-views)")
            sf.views = self._read_rows("videos/views", vidx).astype(np.float32)
            if with_states and self.has_states:
                sf.view_states = self._read_rows("videos/view_states", vidx)
        if with_states:
            sf.vision_states = self._read_rows("videos/states", vidx)
            if self.state_layout == "pooled":
                sf.text_states = self._read_rows("captions/states", cidx)
            else:
                lengths = self.text_state_lengths[cidx]
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
                flat = np.empty((int(offsets[-1]), self.text_state_width), self.dtype)  # (sum T, W)
                # Captions consecutive in the store are consecutive in the flat array.
                runs = [(int(self._token_offsets[a]), int(self._token_offsets[b])) for a, b in _runs(cidx)]
                self._b.read_runs("captions/token_states", runs, flat)
                sf.text_states, sf.text_lengths, sf.text_offsets = flat, lengths, offsets
        return sf

    # -- reporting -------------------------------------------------------------

    def summary(self) -> dict:
        """Counts per split and status, and per-array sizes (for ``dab inspect``)."""
        status = self.status()
        cdone = self.caption_done()

        def counts(st: np.ndarray) -> dict[str, int]:
            return {name: int((st == code).sum()) for code, name in STATUS_NAMES.items()}

        splits = {}
        for s in self.splits():
            vs = self.video_split == s
            cs = self.caption_split == s
            splits[s] = {
                "videos": int(vs.sum()),
                **counts(status[vs]),
                "captions": int(cs.sum()),
                "captions_done": int(cdone[cs].sum()),
            }
        arrays = {}
        for spec in _array_specs(self.layout):
            logical = None if spec.dtype is None else int(np.prod(spec.shape, dtype=np.int64)) * spec.dtype.itemsize
            arrays[spec.name] = {
                "shape": list(spec.shape),
                "dtype": "str" if spec.dtype is None else str(spec.dtype),
                "nbytes": logical,
                "stored_bytes": self._b.stored_bytes(spec.name),
            }
        if self.path.is_dir():
            disk = sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())
        else:
            disk = self.path.stat().st_size
        return {
            "path": str(self.path),
            "backend": self.backend,
            "format": FORMAT_VERSION,
            "num_videos": self.num_videos,
            "num_captions": self.num_captions,
            "num_frames": self.num_frames,
            "dim": self.dim,
            "dtype": str(self.dtype),
            "state_layout": self.state_layout,
            "trainable_blocks": self.trainable_blocks,
            "videos": counts(status),
            "videos_with_warnings": len(self.warnings()),
            "captions": {"done": int(cdone.sum()), "pending": int((~cdone).sum())},
            "complete": bool((status != STATUS_PENDING).all() and cdone.all()),
            "splits": splits,
            "arrays": arrays,
            "file_bytes": int(disk),
        }

    # -- lifetime --------------------------------------------------------------

    def close(self) -> None:
        self._b.close()

    def __enter__(self) -> "FeatureStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"FeatureStore({str(self.path)!r}, backend={self.backend}, videos={self.num_videos}, "
            f"captions={self.num_captions}, frames={self.num_frames}, dim={self.dim}, dtype={self.dtype}, "
            f"states={self.state_layout}, mode={self.mode!r})"
        )


# ------------------------------------------------------------------- create / open


def open_store(path: str | os.PathLike, mode: str = "r", *, writer: tuple[int, int] | None = None) -> FeatureStore:
    """Open an existing store; ``mode`` is ``"r"`` (read) or ``"a"`` (resume writing).

    ``writer=(rank, world_size)`` (mode "a", zarr only) opens it as one of
    ``world_size`` concurrent writers: it may write only the videos of its share
    (:meth:`FeatureStore.video_share`) and, for rank 0, the captions. The store
    must have been created with ``share_rows`` (chunks aligned to shares) unless
    ``world_size`` is 1. Stale ``.partial`` files are not cleaned in this mode
    (another writer's may be in flight): open the store once with plain mode "a"
    before the writers start.
    """
    if mode not in ("r", "a"):
        raise ValueError(f"mode must be 'r' or 'a', got {mode!r}")
    p = Path(path)
    kind = store_backend(p)
    if not p.exists():
        raise StoreError(f"feature store {p} does not exist")
    if kind == "hdf5" and p.is_dir():
        raise StoreError(f"{p} is a folder, expected an HDF5 file")
    if kind == "zarr" and not p.is_dir():
        raise StoreError(f"{p} is a file, expected a zarr folder")
    if writer is not None:
        if mode != "a":
            raise ValueError("writer=(rank, world_size) needs mode='a'")
        if kind != "zarr":
            raise StoreError(
                f"{p}: HDF5 allows one writer per file; concurrent writers need a .zarr store "
                "(distributed extraction into HDF5 writes one part file per process and merges them)"
            )
        return FeatureStore(p, _ZarrBackend(p, mode, writer=tuple(writer)), mode, writer=tuple(writer))
    return FeatureStore(p, _backend_class(kind)(p, mode), mode)


def _str_array(values: Sequence[str] | np.ndarray, n: int | None, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=str).reshape(-1) if len(values) else np.zeros(0, dtype="<U1")
    if n is not None and len(arr) != n:
        raise ValueError(f"{what} has {len(arr)} entries, expected {n}")
    return arr


def _check_unique(ids: np.ndarray, what: str) -> None:
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"{what} repeat: {uniq[counts > 1][:5].tolist()}")


def create_store(
    path: str | os.PathLike,
    *,
    manifest: dict,
    video_ids: Sequence[str] | np.ndarray,
    video_split: Sequence[str] | np.ndarray,
    caption_ids: Sequence[str] | np.ndarray,
    caption_video_index: Sequence[int] | np.ndarray,
    caption_text: Sequence[str] | np.ndarray,
    caption_split: Sequence[str] | np.ndarray,
    num_frames: int,
    dim: int,
    dtype: str = "float16",
    vision_state_shape: tuple[int, ...] | None = None,
    text_state_width: int | None = None,
    text_state_lengths: Sequence[int] | np.ndarray | None = None,
    overwrite: bool = False,
    share_rows: int | None = None,
    train_views: int = 0,
    thumbnail_bytes: int = 0,
) -> FeatureStore:
    """Build a fully preallocated store atomically and return it open for writing (mode "a").

    train_views: augmented views per video (videos/views (N, F, D) rows, and videos/view_states
    with states); only training videos get them written, the other rows stay unwritten.

    share_rows: lay the store out for several concurrent writers (zarr): every
    per-video array is chunked so that no chunk crosses a multiple of
    ``share_rows``, and the value is recorded in the layout; writers then own
    whole units (:func:`video_share`, ``open_store(..., writer=...)``). None
    (default) keeps the single-writer layout. HDF5 records it and ignores it.

    vision_state_shape: None (no states), (W,) pooled pre-LN states (K=0) or
    (L, W) tokens entering the last K blocks (K>0). text_state_width is required
    with either; text_state_lengths (M,) (tokens up to and including EOT) is
    required with tokens and forbidden otherwise.
    """
    p = Path(path)
    kind = store_backend(p)
    if (p.exists() or p.is_symlink()) and not overwrite:
        raise StoreError(f"{p} already exists; pass overwrite=True (--overwrite) to replace it, or open it to resume")
    if np.dtype(dtype) not in (np.dtype(np.float16), np.dtype(np.float32)):
        raise ValueError(f"dtype must be 'float16' or 'float32', got {dtype!r}")
    if int(num_frames) < 1 or int(dim) < 1:
        raise ValueError(f"num_frames and dim must be positive, got {num_frames} and {dim}")
    try:
        manifest_json = json.loads(json.dumps(manifest, sort_keys=True))
    except (TypeError, ValueError) as e:
        raise ValueError(f"manifest must be JSON-serialisable: {e}") from None

    vids = _str_array(video_ids, None, "video_ids")
    n = len(vids)
    vsplit = _str_array(video_split, n, "video_split")
    cids = _str_array(caption_ids, None, "caption_ids")
    m = len(cids)
    cvid = np.asarray(caption_video_index, dtype=np.int64).reshape(-1)
    if len(cvid) != m:
        raise ValueError(f"caption_video_index has {len(cvid)} entries, expected {m}")
    if m and (cvid.min() < 0 or cvid.max() >= n):
        raise ValueError(f"caption_video_index must lie in [0, {n}); got {cvid.min()}..{cvid.max()}")
    ctext = _str_array(caption_text, m, "caption_text")
    csplit = _str_array(caption_split, m, "caption_split")
    _check_unique(vids, "video ids")
    _check_unique(cids, "caption ids")

    layout: dict[str, Any] = {
        "num_videos": n,
        "num_captions": m,
        "num_frames": int(num_frames),
        "dim": int(dim),
        "dtype": np.dtype(dtype).name,
        "state_layout": "none",
        "vision_state_shape": None,
        "text_state_width": None,
        "num_text_tokens": None,
        "error_bytes": ERROR_BYTES,
    }
    if int(train_views) < 0:
        raise ValueError(f"train_views must be >= 0, got {train_views}")
    if train_views:
        layout["train_views"] = int(train_views)
    if int(thumbnail_bytes) < 0:
        raise ValueError(f"thumbnail_bytes must be >= 0, got {thumbnail_bytes}")
    if thumbnail_bytes:
        layout["thumbnail_bytes"] = int(thumbnail_bytes)
    if share_rows is not None:
        if int(share_rows) < 1:
            raise ValueError(f"share_rows must be >= 1, got {share_rows}")
        layout["share_rows"] = int(share_rows)
    init: dict[str, np.ndarray] = {
        "videos/ids": vids,
        "videos/split": vsplit,
        "captions/ids": cids,
        "captions/split": csplit,
        "captions/text": ctext,
        "captions/video_index": cvid,
    }
    if vision_state_shape is not None:
        vss = tuple(int(x) for x in vision_state_shape)
        if len(vss) not in (1, 2) or min(vss) < 1:
            raise ValueError(f"vision_state_shape must be (W,) or (L, W), got {vision_state_shape!r}")
        if text_state_width is None or int(text_state_width) < 1:
            raise ValueError("text_state_width is required (positive) when vision_state_shape is given")
        layout["vision_state_shape"] = list(vss)
        layout["text_state_width"] = int(text_state_width)
        layout["state_layout"] = "pooled" if len(vss) == 1 else "tokens"
        if len(vss) == 2:
            if text_state_lengths is None:
                raise ValueError("text_state_lengths (M,) is required for token states (vision_state_shape (L, W))")
            lengths = np.asarray(text_state_lengths, dtype=np.int64).reshape(-1)
            if len(lengths) != m or (m and lengths.min() < 1):
                raise ValueError(f"text_state_lengths must be {m} positive token counts, got {len(lengths)} entries")
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (M+1,)
            layout["num_text_tokens"] = int(offsets[-1])
            init["captions/token_offsets"] = offsets
        elif text_state_lengths is not None:
            raise ValueError("text_state_lengths only applies to token states (vision_state_shape (L, W))")
    elif text_state_width is not None or text_state_lengths is not None:
        raise ValueError("text_state_width / text_state_lengths need vision_state_shape")

    attrs = {"dab_store_format": FORMAT_VERSION, "layout": layout, "manifest": manifest_json}
    for folder in (p.parent, *p.parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise StoreError(f"cannot create {p}: {folder} is a file, not a folder")
            break
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_sibling(p, "creating")
        try:
            _backend_class(kind).create(tmp, layout, attrs, init)
            publish(tmp, p, overwrite)
        except BaseException:
            _remove_quietly(tmp)  # its own failure must not hide the one that matters
            raise
    except OSError as exc:
        raise StoreError(f"cannot create {p}: {os_reason(exc)}") from None
    _fsync_dir(p.parent)
    return open_store(p, "a")


def os_reason(exc: OSError) -> str:
    """The operating system's words for ``exc`` (h5py wraps them in a long message)."""
    text = str(exc)
    # h5py: "Unable to create file (unable to open file: ..., errno = 30, error message = 'Read-only file system', ...)"
    marker = "error message = '"
    if marker in text:
        return text.split(marker, 1)[1].split("'", 1)[0]
    if exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    return text.splitlines()[0] if text else type(exc).__name__


def _remove_quietly(p: Path) -> None:
    try:
        remove_path(p)
    except OSError:
        pass


# ------------------------------------------------------------------------ merging


# Bytes copied per read/write while merging (bounds memory for token-state grids).
_MERGE_BLOCK_BYTES = 64 << 20


def _copy_rows(src: _Backend, dst: _Backend, name: str, runs: Sequence[tuple[int, int]], row_shape: tuple[int, ...],
               dtype: np.dtype) -> None:
    row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize)
    step = max(1, _MERGE_BLOCK_BYTES // row_bytes)
    for a, b in runs:
        for s in range(a, b, step):
            e = min(b, s + step)
            buf = np.empty((e - s, *row_shape), dtype)
            src.read_range(name, s, e, buf)
            dst.write_range(name, s, buf)


def merge_parts(
    dest: str | os.PathLike,
    parts: Sequence[str | os.PathLike],
    shares: Sequence[np.ndarray],
    *,
    overwrite: bool = False,
) -> Path:
    """Combine part stores into one store at ``dest``, atomically.

    Every part has the same layout and index arrays (the full dataset); part
    ``i`` contributes the video rows ``shares[i]`` (all of them done there:
    ok, failed or missing), part 0 the captions (all done there). The shares must
    cover every video exactly once. The merged store is built under a hidden
    temporary name next to ``dest`` and renamed into place only when complete, so
    a kill during the merge leaves the parts untouched and no half store (rerun
    to merge again). Root attributes (layout, manifest) come from part 0. The
    parts are left in place; the caller deletes them after this returns.
    """
    d = Path(dest)
    kind = store_backend(d)
    if len(parts) != len(shares) or not parts:
        raise ValueError(f"need one share per part, got {len(parts)} parts and {len(shares)} shares")
    # A kill during an earlier merge leaves its hidden temporary (a whole store's
    # worth of bytes); only one process merges a store, so it is safe to clear.
    for stale in d.parent.glob(f".{d.name}.merging-*"):
        remove_path(stale)
    opened: list[FeatureStore] = []
    tmp = temp_sibling(d, "merging")
    try:
        for p in parts:
            opened.append(open_store(p, "r"))
        ref = opened[0]
        n = ref.num_videos
        cover = np.zeros(n, np.int64)
        for st, share in zip(opened, shares):
            if st.layout != ref.layout or not (
                np.array_equal(st.video_ids, ref.video_ids) and np.array_equal(st.caption_ids, ref.caption_ids)
            ):
                raise StoreError(f"{st.path} does not hold the same videos/captions/layout as {ref.path}; cannot merge")
            share = np.asarray(share, np.int64)
            cover[share] += 1
            pending = int((st.status()[share] == STATUS_PENDING).sum())
            if pending:
                raise StoreError(f"{st.path} still has {pending} pending videos in its share; finish it before merging")
        if (cover != 1).any():
            raise ValueError(f"the shares must cover each of the {n} videos exactly once")
        if not ref.captions_done():
            raise StoreError(f"{ref.path} has {len(ref.pending_captions())} captions without features; cannot merge")

        init: dict[str, np.ndarray] = {
            "videos/ids": ref.video_ids,
            "videos/split": ref.video_split,
            "captions/ids": ref.caption_ids,
            "captions/split": ref.caption_split,
            "captions/text": ref.caption_text,
            "captions/video_index": ref.caption_video_index,
        }
        if ref.state_layout == "tokens":
            init["captions/token_offsets"] = ref._token_offsets
        attrs = {"dab_store_format": FORMAT_VERSION, "layout": ref.layout, "manifest": ref.manifest}
        cls = _backend_class(kind)
        cls.create(tmp, ref.layout, attrs, init)
        out = cls(tmp, "a")
        try:
            for spec in _array_specs(ref.layout):
                if spec.dtype is None or spec.name in init:
                    continue
                if spec.name.startswith("videos/"):
                    for st, share in zip(opened, shares):
                        _copy_rows(st._b, out, spec.name, _runs(np.sort(np.asarray(share, np.int64))),
                                   spec.shape[1:], spec.dtype)
                else:  # caption arrays (features, done, states, token rows): all from part 0
                    _copy_rows(ref._b, out, spec.name, [(0, spec.shape[0])], spec.shape[1:], spec.dtype)
            out.flush()
        finally:
            out.close()
        for st in opened:
            st.close()
        opened.clear()
        if tmp.is_file():
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        publish(tmp, d, overwrite)
    except BaseException:
        remove_path(tmp)
        raise
    finally:
        for st in opened:
            st.close()
    _fsync_dir(d.parent)
    return d
