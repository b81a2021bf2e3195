"""The store's layout: format constants, status codes, the array specs of a layout, shares and suffixes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from ..core.errors import StoreError
from ..core.overrides import changed_keys

FORMAT_VERSION = 1


STATUS_PENDING = 0


STATUS_OK = 1
# the split name that reads every video and caption of a store, whatever its split (search a library whole)
ALL_SPLITS = "all"


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
# The root attribute of a store on object storage while it is being created (no rename publishes it there): the
# full attributes replace it last, so a store with it was interrupted, and --overwrite may replace it.
CREATING = "dab_store_creating"


_ALL_SUFFIXES = HDF5_SUFFIXES + ZARR_SUFFIXES


# zarr chunks along the row axis are sized to about this many bytes: big enough
# that a whole-split read is a few large reads, small enough that rewriting the
# chunk of a batch (zarr rewrites whole chunks) stays cheap.
ZARR_CHUNK_BYTES = 1 << 20


_STRING_ARRAYS = frozenset({"videos/ids", "videos/split", "captions/ids", "captions/split", "captions/text"})


# Writers lock the store folder itself (flock on a directory needs no file, so nothing
# foreign sits inside the zarr hierarchy: plain zarr readers would warn about it).
# Multi-writer mode (distributed extraction into one zarr store): every writer holds
# the folder's lock *shared* (so a single writer, which takes it exclusively, is kept
# out) and its own per-share lock file, next to the store, exclusively (one writer per share).
SHARE_LOCK = ".{store}.writer-{rank:05d}-of-{world:05d}.lock"


LEGACY_LOCK = ".dab-writer.lock"  # inside the store, written by dab before the folder lock


# Largest share unit default_share_rows picks: a status chunk of 4 KiB.
_MAX_SHARE_ROWS = 4096


# Arrays read before they are written (all-pending flags): HDF5 writes real zeros into them.
COMPRESSED = frozenset({"videos/thumbnail"})  # zarr: variable-length content in fixed rows


def zstd():
    from zarr.codecs import ZstdCodec

    return ZstdCodec(level=3)


ZERO_INIT = frozenset(
    {"videos/status", "videos/num_video_frames", "videos/frame_mask", "captions/done", "videos/thumbnail_size"}
)


def store_backend(path: str | os.PathLike) -> str:
    """``"hdf5"`` or ``"zarr"`` from the path suffix; anything else is a StoreError."""
    suffix = (path.suffix if hasattr(path, "url") else Path(path).suffix).lower()  # a StoreURL has a suffix too
    if suffix in HDF5_SUFFIXES:
        return "hdf5"
    if suffix in ZARR_SUFFIXES:
        return "zarr"
    raise StoreError(
        f"{path}: cannot tell the store format from the suffix {suffix or '(none)'!r}; "
        f"valid suffixes: {', '.join(_ALL_SUFFIXES)}"
    )


def manifest_compatible(existing: dict, new: dict, keys: Iterable[str]) -> list[str]:
    """Keys (dotted paths allowed, e.g. ``"dataset.options"``) whose values differ: the resume check of
    :func:`~dab_pipeline.core.overrides.changed_keys` on two manifests (a tuple written into a store and
    the list read back are equal; a key present on one side only counts as different)."""
    return changed_keys(existing, new, keys=list(keys))


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


def chunk_rows_in_unit(default_rows: int, share_rows: int) -> int:
    """Largest divisor of ``share_rows`` not above ``default_rows``: such chunks never straddle a unit."""
    for d in range(min(default_rows, share_rows), 0, -1):
        if share_rows % d == 0:
            return d
    return 1


@dataclass(frozen=True)
class ArraySpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype | None  # None for strings


def array_specs(layout: dict) -> list[ArraySpec]:
    """Every array of a store with this layout (the one place the layout is defined)."""
    n, m, f, d = layout["num_videos"], layout["num_captions"], layout["num_frames"], layout["dim"]
    dt = np.dtype(layout["dtype"])
    specs = [
        ArraySpec("videos/ids", (n,), None),
        ArraySpec("videos/split", (n,), None),
        ArraySpec("videos/status", (n,), np.dtype(np.int8)),
        ArraySpec("videos/num_video_frames", (n,), np.dtype(np.int32)),
        ArraySpec("videos/frame_mask", (n, f), np.dtype(bool)),
        ArraySpec("videos/frames", (n, f, d), dt),
        ArraySpec("videos/error", (n, ERROR_BYTES), np.dtype(np.uint8)),
        ArraySpec("captions/ids", (m,), None),
        ArraySpec("captions/split", (m,), None),
        ArraySpec("captions/text", (m,), None),
        ArraySpec("captions/video_index", (m,), np.dtype(np.int64)),
        ArraySpec("captions/done", (m,), np.dtype(bool)),
        ArraySpec("captions/features", (m, d), dt),
    ]
    state_layout = layout["state_layout"]
    views = int(layout.get("train_views") or 0)  # augmented training views (0 in stores made before them)
    thumb = int(layout.get("thumbnail_bytes") or 0)  # JPEG thumbnails (0 in stores made before them)
    if layout.get("row_checksums"):
        specs.append(ArraySpec("videos/checksum", (n,), np.dtype(np.uint32)))
        specs.append(ArraySpec("captions/checksum", (m,), np.dtype(np.uint32)))
    if thumb:
        specs.append(ArraySpec("videos/thumbnail", (n, thumb), np.dtype(np.uint8)))
        specs.append(ArraySpec("videos/thumbnail_size", (n,), np.dtype(np.int32)))
    if views:
        specs.append(ArraySpec("videos/views", (n, views, f, d), dt))
    if state_layout != "none":
        specs.append(ArraySpec("videos/states", (n, f, *layout["vision_state_shape"]), dt))
        if views:
            specs.append(ArraySpec("videos/view_states", (n, views, f, *layout["vision_state_shape"]), dt))
    if state_layout == "pooled":
        specs.append(ArraySpec("captions/states", (m, layout["text_state_width"]), dt))
    elif state_layout == "tokens":
        specs.append(ArraySpec("captions/token_states", (layout["num_text_tokens"], layout["text_state_width"]), dt))
        specs.append(ArraySpec("captions/token_offsets", (m + 1,), np.dtype(np.int64)))
    return specs


def index_runs(sorted_idx: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs ``[start, stop)`` of consecutive values in a sorted unique index array."""
    if len(sorted_idx) == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_idx) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(sorted_idx)]])
    return [(int(sorted_idx[a]), int(sorted_idx[b - 1]) + 1) for a, b in zip(starts, stops)]


def message_rows(messages: Sequence[str]) -> np.ndarray:
    """(B, ERROR_BYTES) uint8: each message as UTF-8, cut at a character boundary, zero padded."""
    rows = np.zeros((len(messages), ERROR_BYTES), np.uint8)
    for i, m in enumerate(messages):
        raw = str(m).encode("utf-8")[:ERROR_BYTES].decode("utf-8", "ignore").encode("utf-8")
        rows[i, : len(raw)] = np.frombuffer(raw, np.uint8)
    return rows


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

    def matches_in(self, gallery: "SplitFeatures") -> np.ndarray:
        """(Q,) int64: each caption's video as a column of ``gallery`` (another split's videos, or every video), -1
        where the gallery does not hold it (a gallery must hold the queries' videos to be searched for them)."""
        column = {str(v): i for i, v in enumerate(gallery.video_ids)}
        return np.array([column.get(str(v), -1) for v in self.video_ids[self.caption_video]], np.int64)

    def text_state_batch(self, rows: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token states of captions ``rows`` padded to the longest: ((B, T, W) float32, lengths (B,))."""
        if self.text_states is None or self.text_offsets is None or self.text_lengths is None:
            raise ValueError(
                "this split holds no token-level text states (load_split(..., with_states=True) on a K>0 store)"
            )
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self.text_lengths[rows]
        states, offsets = self.text_states, self.text_offsets

        def fill(j: int, dest: np.ndarray) -> None:
            dest[:] = states[offsets[rows[j]] : offsets[rows[j] + 1]]

        return pad_ragged(lengths, states.shape[1], fill), lengths


def pad_ragged(lengths: np.ndarray, width: int, fill: Callable[[int, np.ndarray], None]) -> np.ndarray:
    """Ragged token states -> zero-padded (B, T_max, W) float32; ``fill(j, dest)`` writes row j's (T_j, W)."""
    out = np.zeros((len(lengths), int(np.max(lengths, initial=0)), width), np.float32)
    for j, n in enumerate(lengths):
        fill(j, out[j, : int(n)])
    return out


def row_checksums(*arrays: np.ndarray) -> np.ndarray:
    """(B,) uint32: the CRC-32 of each row's bytes over ``arrays`` (each (B, ...), in their stored dtype, in order)."""
    import zlib

    b = len(arrays[0])
    out = np.empty(b, np.uint32)
    for i in range(b):
        crc = 0
        for a in arrays:
            crc = zlib.crc32(np.ascontiguousarray(a[i]).tobytes(), crc)
        out[i] = crc
    return out
