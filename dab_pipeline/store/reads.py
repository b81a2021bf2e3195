"""Reads of an open store: rows of any array, videos and states by index, thumbnails, and a whole split in RAM
(a mixin of :class:`FeatureStore`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.errors import ConfigError, StoreError
from .layout import STATUS_NAMES, STATUS_OK, SplitFeatures, index_runs, pad_ragged


class StoreReads:
    """The reading half of :class:`FeatureStore`: every method that reads features (a mixin)."""

    def _read_rows(self, name: str, idx_sorted: np.ndarray) -> np.ndarray:
        """Rows ``idx_sorted`` (sorted, unique) of an array, in the store dtype."""
        self.require_open()
        shape = self._b.shape(name)
        out = np.empty((len(idx_sorted), *shape[1:]), dtype=self._dtype_of(name))
        return self._b.read_rows(name, idx_sorted, out)

    def _dtype_of(self, name: str) -> np.dtype:
        return self._specs[name].dtype

    def _read_any(self, name: str, indices: Sequence[int] | np.ndarray, n: int, what: str) -> np.ndarray:
        idx = _in_range(indices, n, what, self.path)
        uniq, inverse = np.unique(idx, return_inverse=True)
        rows = self._read_rows(name, uniq)
        return rows if len(uniq) == len(idx) and (uniq == idx).all() else rows[inverse]

    def _require_ok(self, idx: np.ndarray) -> None:
        st = self.status()[idx]
        bad = st != STATUS_OK
        if bad.any():
            desc = ", ".join(
                f"{self.video_ids[i]} ({STATUS_NAMES.get(int(s), s)})" for i, s in zip(idx[bad][:5], st[bad][:5])
            )
            raise StoreError(f"{self.path}: videos without features requested: {desc}")

    def read_videos(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Random access for training batches: frames (B, F, D) float32, mask (B, F) bool.

        Every requested video must have status ok (StoreError otherwise).
        """
        idx = _in_range(indices, self.num_videos, "video", self.path)
        self._require_ok(idx)
        frames = self._read_any("videos/frames", idx, self.num_videos, "video").astype(np.float32)
        mask = self._read_any("videos/frame_mask", idx, self.num_videos, "video").astype(bool)
        return frames, mask

    def read_captions(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Caption features (B, D) float32 of these store rows (written ones: see ``caption_done``)."""
        return self._read_any("captions/features", indices, self.num_captions, "caption").astype(np.float32)

    def first_caption_rows(self) -> np.ndarray:
        """(N,) int64: each video's first caption row (in store order), -1 for a video without captions."""
        first = np.full(self.num_videos, -1, np.int64)
        backwards = np.arange(self.num_captions)[::-1]
        first[self.caption_video_index[backwards]] = backwards  # written last, the first caption wins
        return first

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

    def read_thumbnails(self, indices: Sequence[int] | np.ndarray) -> list[bytes | None]:
        """The JPEG thumbnails of these videos (None where there is none, or the store has none)."""
        idx = self._indices(indices, self.num_videos, "video")
        if not self.thumbnail_bytes or len(idx) == 0:
            return [None] * len(idx)
        sizes = self._read_any("videos/thumbnail_size", idx, self.num_videos, "video")
        status = self.status()[idx]
        rows = self._read_any("videos/thumbnail", idx, self.num_videos, "video")
        return [
            bytes(rows[j, : sizes[j]]) if status[j] == STATUS_OK and sizes[j] > 0 else None for j in range(len(idx))
        ]

    def load_split(self, split: str, with_states: bool = False, with_views: bool = False) -> SplitFeatures:
        """Every ok video of ``split`` and the written captions pointing at them, in RAM.

        ``with_views``: also the augmented views (only training videos have them written).
        """
        self.require_open()
        in_split = self.in_split(split)  # (N,) bool; "all": every video
        if with_states and not self.has_states:
            raise StoreError(f"{self.path} holds no states; re-extract with trainable_blocks set to load them")
        status = self.status()
        vidx = np.flatnonzero(in_split & (status == STATUS_OK))  # (V,) store rows
        remap = np.full(self.num_videos, -1, np.int64)
        remap[vidx] = np.arange(len(vidx))
        cap_in = np.flatnonzero(self.in_split(split, "caption"))
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
        raise StoreError(
            f"{self.path}: the {split!r} split holds non-finite features (NaN or inf) for {len(bad)} "
            f"{what}(s), the first {str(ids[bad[0]])!r} (store row {int(rows[bad[0]])}); re-extract the "
            "store (`dab extract ... --overwrite`)"
        )


def _in_range(indices, n: int, what: str, path) -> np.ndarray:
    """``indices`` as (B,) int64 store rows, or a one-line ConfigError (a ValueError) naming the bad ones."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if len(idx) and (idx.min() < 0 or idx.max() >= n):
        raise ConfigError(f"{path}: {what} rows must lie in [0, {n}); got {idx.min()}..{idx.max()}")
    return idx
