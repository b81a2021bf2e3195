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
  are flipped (and flushed), so a flag never points at half-written data."""

from __future__ import annotations

from .backend_h5 import Backend, H5Backend  # noqa: F401
from .backend_zarr import RawChunks, ZarrBackend, backend_class  # noqa: F401
from .create import create_store, open_store, os_reason  # noqa: F401
from .feature_store import FeatureStore  # noqa: F401
from .fingerprint import average_query, split_rows, store_fingerprint  # noqa: F401
from .layout import (  # noqa: F401
    ALL_SPLITS,
    ERROR_BYTES,
    FORMAT_VERSION,
    HDF5_SUFFIXES,
    STATUS_FAILED,
    STATUS_MISSING,
    STATUS_NAMES,
    STATUS_OK,
    STATUS_PENDING,
    ZARR_SUFFIXES,
    ArraySpec,
    SplitFeatures,
    array_specs,
    default_share_rows,
    manifest_compatible,
    pad_ragged,
    store_backend,
    video_share,
)
from .merge import merge_parts  # noqa: F401

__all__ = [
    "ALL_SPLITS",
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
    "split_rows",
    "store_fingerprint",
    "average_query",
]
