"""Merging the part files of a multi-process HDF5 extraction into one store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..core.errors import StoreError
from ..core.fsutil import fsync_dir, publish, remove_path, temp_sibling
from .backend_h5 import Backend
from .backend_zarr import backend_class
from .create import open_store
from .feature_store import FeatureStore
from .layout import FORMAT_VERSION, STATUS_PENDING, array_specs, index_runs, store_backend

# Bytes copied per read/write while merging (bounds memory for token-state grids).
_MERGE_BLOCK_BYTES = 64 << 20


def _copy_rows(
    src: Backend, dst: Backend, name: str, runs: Sequence[tuple[int, int]], row_shape: tuple[int, ...], dtype: np.dtype
) -> None:
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
        _check_parts(opened, shares)
        _write_merged(tmp, kind, opened, shares)
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
    fsync_dir(d.parent)
    return d


def _check_parts(opened: Sequence[FeatureStore], shares: Sequence[np.ndarray]) -> None:
    """Same layout and index everywhere, every share done in its part, the shares a partition, captions done."""
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


def _write_merged(tmp: Path, kind: str, opened: Sequence[FeatureStore], shares: Sequence[np.ndarray]) -> None:
    """The merged store at ``tmp``: part 0's index and captions, every part's share of the video arrays."""
    ref = opened[0]
    init: dict[str, np.ndarray] = {
        "videos/ids": ref.video_ids,
        "videos/split": ref.video_split,
        "captions/ids": ref.caption_ids,
        "captions/split": ref.caption_split,
        "captions/text": ref.caption_text,
        "captions/video_index": ref.caption_video_index,
    }
    if ref.state_layout == "tokens":
        init["captions/token_offsets"] = ref.text_state_offsets
    attrs = {"dab_store_format": FORMAT_VERSION, "layout": ref.layout, "manifest": ref.manifest}
    cls = backend_class(kind)
    cls.create(tmp, ref.layout, attrs, init)
    out = cls(tmp, "a")
    try:
        for spec in array_specs(ref.layout):
            if spec.dtype is None or spec.name in init:
                continue
            if spec.name.startswith("videos/"):
                for st, share in zip(opened, shares):
                    _copy_rows(
                        st.raw_backend,
                        out,
                        spec.name,
                        index_runs(np.sort(np.asarray(share, np.int64))),
                        spec.shape[1:],
                        spec.dtype,
                    )
            else:  # caption arrays (features, done, states, token rows): all from part 0
                _copy_rows(ref.raw_backend, out, spec.name, [(0, spec.shape[0])], spec.shape[1:], spec.dtype)
        out.flush()
    finally:
        out.close()
