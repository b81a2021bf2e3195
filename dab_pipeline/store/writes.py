"""Everything that changes a store: videos, captions, failures, thumbnails and views (a mixin of FeatureStore)."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from ..core.errors import StoreError
from .layout import STATUS_FAILED, STATUS_MISSING, STATUS_OK, index_runs, message_rows, row_checksums


class StoreWrites:
    """The writing half of :class:`FeatureStore`: every method that changes a store (a mixin)."""

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
            raise ValueError(
                f"captions are written by writer 0 only (this is writer {self.writer[0]} of {self.writer[1]})"
            )

    def _indices(self, indices: Iterable[int] | np.ndarray, n: int, what: str) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{what} indices must lie in [0, {n}); got {idx.min()}..{idx.max()}")
        if len(np.unique(idx)) != len(idx):
            raise ValueError(f"{what} indices repeat within one batch: {idx.tolist()}")
        return idx

    def _write_rows(self, name: str, idx_sorted: np.ndarray, values: np.ndarray) -> None:
        j = 0
        for a, b in index_runs(idx_sorted):
            self._b.write_range(name, a, values[j : j + (b - a)])
            j += b - a

    def set_status(self, idx: np.ndarray, value: int) -> None:
        """Low level: set the status of these video rows (the write paths call it last, for repairs and tests)."""
        idx = np.sort(idx)
        self._write_rows("videos/status", idx, np.full(len(idx), value, np.int8))
        self._b.flush()

    def reopen_damaged(self) -> tuple[int, int]:
        """Mark the videos and captions whose chunk files are missing (Zarr) as not extracted, so that resuming
        the extraction writes them again; -> (videos, captions) marked. Every written row of a missing chunk is
        marked, since rewriting part of a chunk would zero the rest of it."""
        self._require_writable()
        videos, captions = set(), set()
        for name, path, _ in self.missing_chunks():
            rpc = self._b.raw_chunks(name).rows_per_chunk
            chunks = np.asarray([c for c, p in zip(*self._chunk_index(name)) if p == path])
            if name == "captions/token_states":
                lo, hi = self._token_offsets[:-1], self._token_offsets[1:]
                for c in chunks:
                    captions.update(np.flatnonzero((lo < (c + 1) * rpc) & (hi > c * rpc)).tolist())
            else:
                rows = {int(r) for c in chunks for r in range(c * rpc, min((c + 1) * rpc, self._b.shape(name)[0]))}
                (captions if name.startswith("captions/") else videos).update(rows)
        v = np.asarray(sorted(r for r in videos if self.status()[r] == 1), np.int64)
        if len(v):
            self.set_status(v, 0)
        c = np.asarray(sorted(r for r in captions if self.caption_done()[r]), np.int64)
        if len(c):
            self._write_rows("captions/done", c, np.zeros(len(c), bool))
            self._b.flush()
        return len(v), len(c)

    def _chunk_index(self, name: str) -> tuple[np.ndarray, list[str]]:
        chunks, _ = self.written_chunks(name)
        return chunks, self._b.chunk_files(name, chunks) or []

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
                raise ValueError(
                    f"{self.path} stores vision states ({self.state_layout}); write_videos needs vision_states"
                )
            states = self._cast(vision_states, (b, f, *self.vision_state_shape), "vision_states", ids)
        elif vision_states is not None:
            raise ValueError(f"{self.path} was created without vision states; vision_states must be None")

        if warnings is not None and len(warnings) != b:
            raise ValueError(f"warnings has {len(warnings)} entries, expected {b}")
        notes = message_rows([w or "" for w in warnings] if warnings is not None else [""] * b)  # (B, E)

        order = np.argsort(idx, kind="stable")
        idx = idx[order]
        # Always written: a retried video that failed before must not keep its old message.
        self._write_rows("videos/error", idx, notes[order])
        self._write_rows("videos/frames", idx, feats[order])
        self._write_rows("videos/frame_mask", idx, mask[order].astype(bool))
        self._write_rows("videos/num_video_frames", idx, nvf[order].astype(np.int32))
        if "videos/checksum" in self._specs:
            self._write_rows("videos/checksum", idx, row_checksums(feats[order], mask[order].astype(bool)))
        if states is not None:
            self._write_rows("videos/states", idx, states[order])
        # Data reaches the file before the flag that vouches for it.
        self._b.flush()
        self.set_status(idx, STATUS_OK)

    def mark_failed(self, index: int, error: str) -> None:
        """Record that video ``index`` failed, with its error message (truncated to 1 KiB of UTF-8)."""
        self._require_writable()
        idx = self._indices([index], self.num_videos, "video")
        self._require_own_videos(idx)
        self._write_rows("videos/error", idx, message_rows([error]))
        self._b.flush()
        self.set_status(idx, STATUS_FAILED)

    def mark_missing(self, indices: Sequence[int] | np.ndarray) -> None:
        """Record that these videos are listed by the dataset but absent on disk."""
        self._require_writable()
        idx = self._indices(indices, self.num_videos, "video")
        self._require_own_videos(idx)
        self.set_status(idx, STATUS_MISSING)

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
        if "captions/checksum" in self._specs:
            self._write_rows("captions/checksum", sidx, row_checksums(feats[order]))
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
            for a, e in index_runs(sidx):
                rows = np.concatenate(parts[j : j + (e - a)], axis=0)  # (sum T, W)
                self._b.write_range("captions/token_states", int(self._token_offsets[a]), rows)
                j += e - a
        self._b.flush()
        self._write_rows("captions/done", sidx, np.ones(b, bool))
        self._b.flush()

    def _optional_rows(self, indices: Sequence[int] | np.ndarray, present: int, what: str) -> np.ndarray:
        """Checked video rows for writing an optional array (``present``: its layout size, 0 when absent)."""
        self._require_writable()
        if not present:
            raise ValueError(f"{self.path} was created without {what}")
        idx = self._indices(indices, self.num_videos, "video")
        self._require_own_videos(idx)
        return idx

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

    def write_views(
        self, indices: Sequence[int] | np.ndarray, views: np.ndarray, view_states: np.ndarray | None = None
    ) -> None:
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
