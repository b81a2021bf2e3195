"""FeatureStore: an open store's header, status, reads and split loading (writes come from the mixin)."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np

from ..core.errors import StoreError
from .backend_h5 import Backend
from .layout import (
    FORMAT_VERSION,
    STATUS_FAILED,
    STATUS_MISSING,
    STATUS_NAMES,
    STATUS_OK,
    STATUS_PENDING,
    SplitFeatures,
    array_specs,
    default_share_rows,
    index_runs,
    pad_ragged,
    video_share,
)
from .writes import StoreWrites


class FeatureStore(StoreWrites):
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
        if self.num_captions and (self.caption_video_index.min() < 0 or self.caption_video_index.max() >= self.num_videos):
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

    def written_chunks(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(chunk indices, rows written in each) of a strict array: the chunks the store's status arrays say
        were written (ok videos, done captions; training videos for the views)."""
        raw = self._b.raw_chunks(name)
        if raw is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if name.startswith("captions/"):
            rows = np.flatnonzero(self.caption_done())
        else:
            rows = np.flatnonzero(self.status() == STATUS_OK)
            if name.startswith("videos/view"):  # views are written for training videos only
                rows = rows[self.video_split[rows] == "train"]
        rpc = raw.rows_per_chunk
        if name == "captions/token_states":  # its rows are tokens: every chunk a written caption's tokens touch
            lo, hi = self._token_offsets[rows], self._token_offsets[rows + 1]
            rows = rows[hi > lo]
            first, last = lo[hi > lo] // rpc, (hi[hi > lo] - 1) // rpc
            n_chunks = -(-int(self._token_offsets[-1]) // rpc)
            mark = np.zeros(n_chunks + 1, np.int64)
            np.add.at(mark, first, 1)
            np.add.at(mark, last + 1, -1)
            touched = np.cumsum(mark)[:-1]  # captions touching each chunk
            chunks = np.flatnonzero(touched)
            return chunks, touched[chunks]
        return np.unique(rows // rpc, return_counts=True)

    def missing_chunks(self) -> list[tuple[str, str, int]]:
        """Chunk files that hold rows the store records as written but are not on disk (Zarr; HDF5 has none).

        -> [(array, chunk file, rows or captions it should hold)]. Zarr reads a missing chunk file
        as zeros, so a deleted chunk would otherwise pass for data. One stat per chunk: cheap.
        """
        if not hasattr(self._b, "chunk_files"):
            return []
        out = []
        for name in sorted(self._b.strict):
            chunks, counts = self.written_chunks(name)
            for path, n in zip(self._b.chunk_files(name, chunks) or [], counts):
                if not os.path.exists(path):
                    out.append((name, path, int(n)))
        return out

    def verify(self) -> list[str]:
        """Read every array the store records as written, end to end; -> one line per problem found (none: []).

        Zarr: every chunk file of written rows must exist and hold a whole chunk; HDF5: every
        array must read back without an I/O error (a truncated or damaged file fails here).
        """
        problems = [f"{name}: chunk file {path} is missing ({n} written rows)" for name, path, n in self.missing_chunks()]
        for name, spec in self._specs.items():
            raw = self._b.raw_chunks(name) if hasattr(self._b, "chunk_files") else None
            if raw is not None:
                chunks, _ = self.written_chunks(name)
                want = raw.rows_per_chunk * raw.row_bytes
                for path in self._b.chunk_files(name, chunks) or []:
                    if os.path.exists(path) and os.path.getsize(path) != want:
                        problems.append(f"{name}: chunk file {path} holds {os.path.getsize(path):,} bytes, "
                                        f"a chunk is {want:,}")
                continue
            try:  # HDF5, and Zarr arrays read through zarr (strings, compressed thumbnails)
                if spec.dtype is None:
                    self._b.read_strings(name)
                    continue
                n, row = spec.shape[0], int(np.prod(spec.shape[1:], dtype=np.int64)) * spec.dtype.itemsize
                step = max(1, (64 << 20) // max(1, row))  # 64 MiB at a time
                for a in range(0, n, step):
                    b = min(n, a + step)
                    self._b.read_range(name, a, b, np.empty((b - a, *spec.shape[1:]), spec.dtype))
            except (OSError, ValueError, RuntimeError, StoreError) as exc:
                problems.append(f"{name}: cannot be read back ({str(exc).splitlines()[0]})")
        return problems

    def require_complete(self, purpose: str) -> None:
        """Refuse an incomplete store (an extraction stopped, or still running) for ``purpose``, saying what is
        missing and the command that completes it."""
        if self.is_complete:
            return
        missing = self.missing_chunks()
        if missing:
            name, path, n = missing[0]
            raise StoreError(f"{self.path} is damaged: {len(missing)} chunk file(s) of rows it records as written "
                             f"are missing, the first {path} ({name!r}, {n} rows); {purpose} cannot use it. "
                             "`dab inspect --verify` lists them; `dab extract ... --overwrite` rebuilds the store")
        videos = int((self.status() == STATUS_PENDING).sum())
        captions = int((~self.caption_done()).sum())
        raise StoreError(
            f"{self.path} is incomplete: {videos} of {self.num_videos} videos and {captions} of {self.num_captions} "
            f"captions are not extracted yet (was `dab extract` stopped, or is it still running?); {purpose} needs a "
            f"complete store. Finish it with `{extract_command(self.manifest, self.path)}`: it resumes where it "
            "stopped")

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

    @property
    def thumbnail_bytes(self) -> int:
        """Bytes reserved per video for its JPEG thumbnail (0: the store has none)."""
        return int(self.layout.get("thumbnail_bytes") or 0)

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
        self._check_finite(split, sf.frames, sf.video_ids, vidx, "video")
        self._check_finite(split, sf.text, sf.caption_ids, cidx, "caption")
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
                runs = [(int(self._token_offsets[a]), int(self._token_offsets[b])) for a, b in index_runs(cidx)]
                self._b.read_runs("captions/token_states", runs, flat)
                sf.text_states, sf.text_lengths, sf.text_offsets = flat, lengths, offsets
        return sf

    def _check_finite(self, split: str, values: np.ndarray, ids: np.ndarray, rows: np.ndarray, what: str) -> None:
        """Non-finite features (a broken encoder run, a damaged file) are the store's fault: say so at load, with
        the first bad row, before training blames its learning rate or a metric counts NaN costs."""
        if values.size == 0:
            return
        ok = np.isfinite(values.reshape(len(values), -1)).all(axis=1)
        if ok.all():
            return
        bad = np.flatnonzero(~ok)
        raise StoreError(f"{self.path}: the {split!r} split holds non-finite features (NaN or inf) for {len(bad)} "
                         f"{what}(s), the first {str(ids[bad[0]])!r} (store row {int(rows[bad[0]])}); re-extract the "
                         "store (`dab extract ... --overwrite`)")

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
            "missing_chunks": len(self.missing_chunks()),
            "complete": bool((status != STATUS_PENDING).all() and cdone.all()) and not self.missing_chunks(),
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


# arrays read only at rows the store records as written: a missing Zarr chunk there is damage
WRITTEN_ROWS_ARRAYS = ("videos/frames", "videos/frame_mask", "videos/states", "videos/views", "videos/view_states",
                       "captions/features", "captions/states", "captions/token_states")


def extract_command(manifest: dict, path: Path) -> str:
    """The `dab extract` command line that made (and so resumes) a store, from its manifest."""
    cfg = manifest.get("config") or {}
    parts = ["dab extract", f"--dataset {cfg.get('dataset') or manifest.get('dataset', '?')}"]
    for key, flag in (("videos", "--videos"), ("annotations", "--annotations"), ("model", "--model"),
                      ("pretrained", "--pretrained"), ("trainable_blocks", "--trainable-blocks"),
                      ("train_views", "--train-views")):
        value = cfg.get(key)
        if value not in (None, "", 0):
            parts.append(f"{flag} {value}")
    parts.append(f"--out {path}")
    return " ".join(parts)
