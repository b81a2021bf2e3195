"""Opening and atomically creating stores."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.errors import ConfigError, StoreError
from ..core.fsutil import fsync_dir, publish, remove_path, temp_sibling
from ..core.location import StoreURL, location, storage_options
from ..core.write_errors import check_free_space, write_failure
from . import backend_h5
from .backend_h5 import h5_locking_kwargs
from .backend_remote import RemoteZarrBackend, close_async_session, missing_credentials, remote_advice, remote_reason
from .backend_zarr import ZarrBackend, backend_class
from .feature_store import FeatureStore
from .layout import CREATING, ERROR_BYTES, FORMAT_VERSION, ZERO_INIT, array_specs, store_backend


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
        raise ConfigError(
            f"mode must be 'r' (read) or 'a' (resume writing), got {mode!r}: open_store opens an existing store; "
            "dab extract (or create_store) makes one"
        )
    loc = location(path)
    kind = store_backend(loc)
    if isinstance(loc, StoreURL):
        return _open_remote(loc, kind, mode, writer)
    p = loc
    if not p.exists():
        raise StoreError(f"feature store {p} does not exist")
    if kind == "hdf5" and p.is_dir():
        raise StoreError(f"{p} is a folder, expected an HDF5 file")
    if kind == "zarr" and not p.is_dir():
        raise StoreError(f"{p} is a file, expected a zarr folder")
    if writer is not None:
        if mode != "a":
            raise ConfigError("writer=(rank, world_size) needs mode='a'")
        if kind != "zarr":
            raise StoreError(
                f"{p}: HDF5 allows one writer per file; concurrent writers need a .zarr store "
                "(distributed extraction into HDF5 writes one part file per process and merges them)"
            )
        return FeatureStore(p, ZarrBackend(p, mode, writer=tuple(writer)), mode, writer=tuple(writer))
    return FeatureStore(p, backend_class(kind)(p, mode), mode)


def _open_remote(url: StoreURL, kind: str, mode: str, writer: tuple[int, int] | None) -> FeatureStore:
    """A Zarr store on object storage (store/backend_remote.py); refused as one line when it cannot be read."""
    if kind != "zarr":
        raise StoreError(
            f"{url}: an HDF5 store is read from a local file only; object storage holds .zarr stores "
            "(extract to a .zarr URL, or copy the file to this machine)"
        )
    probe_remote(url, must_exist=True)
    if writer is not None and mode != "a":
        raise ConfigError("writer=(rank, world_size) needs mode='a'")
    backend = RemoteZarrBackend(url, mode, writer=None if writer is None else tuple(writer))
    return FeatureStore(url, backend, mode, writer=None if writer is None else tuple(writer))


def probe_remote(url: StoreURL, *, must_exist: bool) -> bool:
    """Whether a store is at ``url`` (its root zarr.json); a StoreError for an unreachable or unauthorised bucket,
    and, with ``must_exist``, for a missing store."""
    fs = url.filesystem()
    try:
        fs.info(f"{url.fs_path}/zarr.json")
        return True
    except FileNotFoundError:
        if must_exist:
            raise StoreError(f"feature store {url} does not exist (no {url}/zarr.json)") from None
        return False
    except PermissionError as exc:
        raise StoreError(
            f"{url}: access denied ({remote_reason(exc)}); check the credentials in the environment "
            "(AWS_ACCESS_KEY_ID, AWS_PROFILE, ...) or the filesystem's config files"
        ) from None
    except Exception as exc:
        if missing_credentials(exc):  # the client sent nothing: no endpoint or network is to blame
            raise StoreError(f"{url}: {remote_advice(exc)} ({remote_reason(exc)})") from None
        raise StoreError(f"{url} is unreachable ({remote_reason(exc)}); check the endpoint and the network") from None


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
    p = location(path)
    kind = store_backend(p)  # an unknown suffix is the first thing to say
    if isinstance(p, StoreURL) and kind != "zarr":
        raise StoreError(f"{p}: object storage holds .zarr stores only (an HDF5 file is written locally)")
    manifest_json = _check_request(p, overwrite, dtype, num_frames, dim, manifest)
    init = _index(video_ids, video_split, caption_ids, caption_video_index, caption_text, caption_split)
    n, m = len(init["videos/ids"]), len(init["captions/ids"])
    layout = _layout(n, m, num_frames, dim, dtype, train_views, thumbnail_bytes, share_rows)
    _add_states(layout, init, vision_state_shape, text_state_width, text_state_lengths)
    attrs = {"dab_store_format": FORMAT_VERSION, "layout": layout, "manifest": manifest_json}
    if isinstance(p, StoreURL):
        _create_remote(p, layout, attrs, init, overwrite)
    else:
        _create_atomically(p, layout, attrs, init, overwrite)
    return open_store(p, "a")


def _check_request(p: Path | StoreURL, overwrite: bool, dtype: str, num_frames: int, dim: int, manifest: dict) -> dict:
    """Refuse an existing path (without ``overwrite``) and bad sizes; the manifest as plain JSON."""
    if isinstance(p, StoreURL):
        exists = probe_remote(p, must_exist=False)
        if exists and not overwrite:
            raise StoreError(
                f"{p} already exists; pass overwrite=True (--overwrite) to replace it, or open it to resume"
            )
        if exists and not is_dab_store(p):
            raise StoreError(
                f"--overwrite replaces dab feature stores only, and {p} holds no dab store's attributes; it is left "
                "alone: choose another --out, or remove it yourself"
            )
    elif (p.exists() or p.is_symlink()) and not overwrite:
        raise StoreError(f"{p} already exists; pass overwrite=True (--overwrite) to replace it, or open it to resume")
    if p.exists() and overwrite and not is_dab_store(p):
        what = "folder" if p.is_dir() else "file"
        raise StoreError(
            f"--overwrite replaces dab feature stores only, and {p} is a {what} without dab's store "
            "attributes; it is left alone: choose another --out, or move it away yourself"
        )
    if np.dtype(dtype) not in (np.dtype(np.float16), np.dtype(np.float32)):
        raise ValueError(f"dtype must be 'float16' or 'float32', got {dtype!r}")
    if int(num_frames) < 1 or int(dim) < 1:
        raise ValueError(f"num_frames and dim must be positive, got {num_frames} and {dim}")
    try:
        return json.loads(json.dumps(manifest, sort_keys=True))
    except (TypeError, ValueError) as e:
        raise ValueError(f"manifest must be JSON-serialisable: {e}") from None


def _index(
    video_ids, video_split, caption_ids, caption_video_index, caption_text, caption_split
) -> dict[str, np.ndarray]:
    """The checked id / split / text arrays, under their names in the store."""
    vids = _str_array(video_ids, None, "video_ids")
    n = len(vids)
    cids = _str_array(caption_ids, None, "caption_ids")
    m = len(cids)
    cvid = np.asarray(caption_video_index, dtype=np.int64).reshape(-1)
    if len(cvid) != m:
        raise ValueError(f"caption_video_index has {len(cvid)} entries, expected {m}")
    if m and (cvid.min() < 0 or cvid.max() >= n):
        raise ValueError(f"caption_video_index must lie in [0, {n}); got {cvid.min()}..{cvid.max()}")
    _check_unique(vids, "video ids")
    _check_unique(cids, "caption ids")
    return {
        "videos/ids": vids,
        "videos/split": _str_array(video_split, n, "video_split"),
        "captions/ids": cids,
        "captions/split": _str_array(caption_split, m, "caption_split"),
        "captions/text": _str_array(caption_text, m, "caption_text"),
        "captions/video_index": cvid,
    }


def _layout(
    n: int,
    m: int,
    num_frames: int,
    dim: int,
    dtype: str,
    train_views: int,
    thumbnail_bytes: int,
    share_rows: int | None,
) -> dict[str, Any]:
    """The layout record of a store without CLIP states (see :func:`_add_states`)."""
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
        # a CRC-32 of each video's and caption's stored features, written with them: `dab inspect --verify` finds
        # bytes changed or zeroed since (stores made before have none)
        "row_checksums": "crc32",
    }
    # optional parts are recorded only when present, so older readers see the layout they know
    for key, value in (("train_views", train_views), ("thumbnail_bytes", thumbnail_bytes)):
        if int(value) < 0:
            raise ValueError(f"{key} must be >= 0, got {value}")
        if value:
            layout[key] = int(value)
    if share_rows is not None:
        if int(share_rows) < 1:
            raise ValueError(f"share_rows must be >= 1, got {share_rows}")
        layout["share_rows"] = int(share_rows)
    return layout


def _add_states(layout: dict, init: dict, vision_state_shape, text_state_width, text_state_lengths) -> None:
    """The CLIP states' part of the layout (and the token offsets of token states), checked."""
    m = layout["num_captions"]
    if vision_state_shape is None:
        if text_state_width is not None or text_state_lengths is not None:
            raise ValueError("text_state_width / text_state_lengths need vision_state_shape")
        return
    vss = tuple(int(x) for x in vision_state_shape)
    if len(vss) not in (1, 2) or min(vss) < 1:
        raise ValueError(f"vision_state_shape must be (W,) or (L, W), got {vision_state_shape!r}")
    if text_state_width is None or int(text_state_width) < 1:
        raise ValueError("text_state_width is required (positive) when vision_state_shape is given")
    layout["vision_state_shape"] = list(vss)
    layout["text_state_width"] = int(text_state_width)
    layout["state_layout"] = "pooled" if len(vss) == 1 else "tokens"
    if len(vss) == 1:
        if text_state_lengths is not None:
            raise ValueError("text_state_lengths only applies to token states (vision_state_shape (L, W))")
        return
    if text_state_lengths is None:
        raise ValueError("text_state_lengths (M,) is required for token states (vision_state_shape (L, W))")
    lengths = np.asarray(text_state_lengths, dtype=np.int64).reshape(-1)
    if len(lengths) != m or (m and lengths.min() < 1):
        raise ValueError(f"text_state_lengths must be {m} positive token counts, got {len(lengths)} entries")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (M+1,)
    layout["num_text_tokens"] = int(offsets[-1])
    init["captions/token_offsets"] = offsets


def _create_atomically(p: Path, layout: dict, attrs: dict, init: dict, overwrite: bool) -> None:
    """Write the whole store under a temporary sibling, then rename it into place (and fsync the folder)."""
    for folder in (p.parent, *p.parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise StoreError(f"cannot create {p}: {folder} is a file, not a folder")
            break
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        # asked first: an HDF5 file whose writes failed cannot be closed, and HDF5 crashes at exit
        check_free_space(p, _initial_bytes(layout, init) + backend_h5.H5_WRITE_SLACK)
        tmp = temp_sibling(p, "creating")
        try:
            backend_class(store_backend(p)).create(tmp, layout, attrs, init)
            publish(tmp, p, overwrite)
        except BaseException as exc:
            named = write_failure(exc, p) if isinstance(exc, (OSError, RuntimeError)) else None  # before tmp goes
            _remove_quietly(tmp)  # its own failure must not hide the one that matters
            if named is not None and "no space left" in str(named):
                raise named from exc  # read-only and permission keep the OS's words below
            raise
    except OSError as exc:
        raise StoreError(f"cannot create {p}: {os_reason(exc)}") from None
    fsync_dir(p.parent)


def _create_remote(url: StoreURL, layout: dict, attrs: dict, init: dict, overwrite: bool) -> None:
    """Write a new store at ``url`` in place (object storage has no rename): the old one is removed first, and the
    store is marked CREATING until its attributes are written last (ZarrBackend.create)."""
    from zarr.storage import FsspecStore

    fs = url.filesystem()
    target = None
    try:
        if overwrite and fs.exists(url.fs_path):
            fs.rm(url.fs_path, recursive=True)
        target = FsspecStore.from_url(str(url), storage_options=storage_options(url.protocol))
        ZarrBackend.create(target, layout, attrs, init)
    except StoreError:
        raise
    except Exception as exc:
        raise StoreError(f"cannot create {url}: {remote_reason(exc)}; {remote_advice(exc)}") from None
    finally:
        close_async_session(None if target is None else target.fs)


def _initial_bytes(layout: dict, init: dict) -> int:
    """Bytes a new store writes when it is created: the given arrays and the zero-filled flags and masks (the
    feature arrays stay sparse until written)."""
    given = sum(
        np.asarray(v).nbytes if np.asarray(v).dtype != object else sum(len(str(x)) + 16 for x in v)
        for v in init.values()
    )
    zeros = sum(
        int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
        for spec in array_specs(layout)
        if spec.name in ZERO_INIT and spec.name not in init
    )
    return int(given + zeros)


def is_dab_store(p: Path | StoreURL) -> bool:
    """Whether ``p`` carries a dab store's attributes (what --overwrite may replace).

    A Zarr folder is read from its ``zarr.json`` alone, so a damaged dab store can still be
    rebuilt; an HDF5 file must open (a truncated one says so when opened, and is not replaced).
    A store on object storage interrupted while it was created (layout.CREATING) counts too.
    """
    import json as _json

    if isinstance(p, StoreURL):
        try:
            meta = _json.loads(p.filesystem().cat_file(f"{p.fs_path}/zarr.json"))
        except Exception:
            return False
        attributes = (meta.get("attributes") or {}) if isinstance(meta, dict) else {}
        return "dab_store_format" in attributes or CREATING in attributes
    if p.is_dir():
        try:
            meta = _json.loads((p / "zarr.json").read_text())
        except (OSError, ValueError):
            return False
        return isinstance(meta, dict) and "dab_store_format" in (meta.get("attributes") or {})
    try:
        import h5py

        with h5py.File(p, "r", **_h5_kwargs()) as f:
            return "dab_store_format" in f.attrs
    except (OSError, ValueError):
        return False


def _h5_kwargs() -> dict:
    return h5_locking_kwargs()


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
