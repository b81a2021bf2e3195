"""FeatureStore: an open store's header, status and summary; reads, writes and integrity come from mixins."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np

from ..core.errors import StoreError
from ..core.location import StoreURL
from .backend_h5 import Backend
from .integrity import WRITTEN_ROWS_ARRAYS, StoreIntegrity
from .layout import (
    ALL_SPLITS,
    CREATING,
    FORMAT_VERSION,
    STATUS_FAILED,
    STATUS_MISSING,
    STATUS_NAMES,
    STATUS_OK,
    STATUS_PENDING,
    array_specs,
    default_share_rows,
    video_share,
)
from .reads import StoreReads
from .writes import StoreWrites


class FeatureStore(StoreReads, StoreIntegrity, StoreWrites):
    """An open feature store; use :func:`create_store` / :func:`open_store` to get one."""

    def __init__(self, path: Path, backend: Backend, mode: str, writer: tuple[int, int] | None = None) -> None:
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
            backend.strict = frozenset(n for n in WRITTEN_ROWS_ARRAYS if n in self._specs)
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
        if fmt is None and attrs.get(CREATING):
            raise StoreError(
                f"{self.path} was interrupted while it was being created: run the same command with --overwrite "
                "to create it again"
            )
        if fmt is None or "layout" not in attrs or "manifest" not in attrs:
            raise StoreError(f"{self.path} is not a dab feature store (no dab_store_format/layout/manifest attributes)")
        if int(fmt) > FORMAT_VERSION:
            raise StoreError(
                f"{self.path} has store format {fmt}; this dab reads format {FORMAT_VERSION} or older (upgrade dab)"
            )
        self.layout: dict = attrs["layout"]
        self.manifest: dict = attrs["manifest"]
        try:
            specs = array_specs(self.layout)
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
        if self.num_captions and (
            self.caption_video_index.min() < 0 or self.caption_video_index.max() >= self.num_videos
        ):
            raise StoreError(f"{self.path}: captions/video_index points outside the {self.num_videos} videos")

    # -- shape of the store ----------------------------------------------------

    @property
    def raw_backend(self) -> Backend:
        """The HDF5 or Zarr backend object (``raw_backend.raw(name)`` is the native array, for tools and tests)."""
        return self._b

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
    def text_state_offsets(self) -> np.ndarray | None:
        """(M + 1,) int64 where each caption's token states start in ``captions/token_states`` (token layout), else
        None."""
        return self._token_offsets if self.state_layout == "tokens" else None

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

    def in_split(self, split: str, what: str = "video") -> np.ndarray:
        """(N,) bool: the store's videos (or captions) in ``split``; ``"all"`` (:data:`ALL_SPLITS`) is every one of
        them, whatever its split (a library searched whole). An unknown split is a StoreError naming the ones here."""
        labels = self.video_split if what == "video" else self.caption_split
        if split == ALL_SPLITS:
            return np.ones(len(labels), bool)
        if split not in self.splits():
            raise StoreError(
                f"{self.path}: no split {split!r}; splits in this store: {', '.join(self.splits()) or '(none)'} "
                f"(or {ALL_SPLITS!r}: every video)"
            )
        return labels == split

    # -- status ----------------------------------------------------------------

    def status(self) -> np.ndarray:
        """(N,) int8 per video: 0 pending, 1 ok, 2 failed, 3 missing on disk."""
        return np.asarray(self._b.read_all("videos/status"), np.int8)

    def done(self) -> np.ndarray:
        """(N,) bool: the video needs no more work (ok, failed or missing)."""
        return self.status() != STATUS_PENDING

    def pending_videos(self, include_failed: bool = False, include_missing: bool = False) -> np.ndarray:
        """Indices still to extract (status pending; plus failed and missing ones, to retry them)."""
        st = self.status()
        todo = st == STATUS_PENDING
        if include_failed:
            todo |= st == STATUS_FAILED
        if include_missing:
            todo |= st == STATUS_MISSING
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
        """Every video and caption extracted, and (Zarr) every chunk that holds them on disk."""
        return not (self.status() == STATUS_PENDING).any() and self.captions_done() and not self.missing_chunks()

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

    @property
    def train_views(self) -> int:
        """Augmented views stored per training video (0: none)."""
        return int(self.layout.get("train_views") or 0)

    @property
    def thumbnail_bytes(self) -> int:
        """Bytes reserved per video for its JPEG thumbnail (0: the store has none)."""
        return int(self.layout.get("thumbnail_bytes") or 0)

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
        for spec in array_specs(self.layout):
            logical = None if spec.dtype is None else int(np.prod(spec.shape, dtype=np.int64)) * spec.dtype.itemsize
            arrays[spec.name] = {
                "shape": list(spec.shape),
                "dtype": "str" if spec.dtype is None else str(spec.dtype),
                "nbytes": logical,
                "stored_bytes": self._b.stored_bytes(spec.name),
            }
        disk = self._b.total_bytes() if self._b.kind == "zarr" else self.path.stat().st_size
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
            "missing_chunks": len(self.missing_chunks()),
            "complete": bool((status != STATUS_PENDING).all() and cdone.all()) and not self.missing_chunks(),
            "splits": splits,
            "arrays": arrays,
            "file_bytes": int(disk),
        }

    @property
    def remote(self) -> bool:
        """Whether the store lives on object storage (an fsspec URL), not in a local file or folder."""
        return isinstance(self.path, StoreURL)

    def identity_files(self) -> list[Path]:
        """The files whose identity (inode, size, mtime) changes when the store is replaced, truncated or
        rewritten: the HDF5 file; a Zarr store's folder and its metadata files (its chunk files are too many
        to watch: reading a lost or cut one fails by name). None for a store on object storage: objects have no
        inode to watch (docs/stores.md)."""
        if self.remote:
            return []
        if self._b.kind == "hdf5":
            return [self.path]
        meta = [self.path / "zarr.json", *(self.path / spec.name / "zarr.json" for spec in array_specs(self.layout))]
        return [self.path, *(p for p in meta if p.is_file())]

    def chunk_files(self, names: Sequence[str]) -> list[Path]:
        """The chunk files of the arrays ``names`` (Zarr; none for HDF5, one file watched whole): what a reader
        that holds those arrays in memory watches to notice a chunk cut, zeroed or rewritten after it read them."""
        if self._b.kind == "hdf5" or self.remote:
            return []
        return [p for n in names for p in sorted((self.path / n).rglob("*")) if p.is_file() and p.name != "zarr.json"]

    def refuse_changes_after(self, ns: int) -> None:
        """Make reads of chunk files written after ``ns`` (time.time_ns()) fail by name (Zarr; an HDF5 file is one
        file, watched whole by :meth:`identity_files`): a reader that outlives writers (dab serve) never answers
        from a store rewritten in place under it."""
        if hasattr(self._b, "unchanged_since_ns"):
            self._b.unchanged_since_ns = ns

    # -- lifetime --------------------------------------------------------------

    closed = False  # set by close(): a read after it is a one-line StoreError, not h5py's or zarr's own

    def close(self) -> None:
        self._b.close()
        self.closed = True

    def require_open(self) -> None:
        if self.closed:
            raise StoreError(
                f"{self.path} is closed (read after close() or its `with open_store(...)` block): open it again"
            )

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
