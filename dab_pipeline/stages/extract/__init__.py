"""Stage one: decode videos, encode frames and captions with CLIP, cache them in a store.

Decoding (and CLIP's own PIL preprocessing) runs in DataLoader worker
processes, overlapped with batched encoding in the main process; results are
written to the store batch by batch, so a killed run resumes where it stopped."""

from __future__ import annotations

from .config import COMPATIBILITY_KEYS, ExtractConfig, ExtractResult, _short_side, _stored_dtype, build_manifest, parse_options, resolve_compute_dtype  # noqa: F401
from .workers import _DecodeDataset, _collate, _consume, _encode_captions, _encode_videos, _encoder_threads, _worker_init, _write_views  # noqa: F401
from .run import _check_parts, _check_resumable, _combine_results, _create, _load_index, _part, _raise_if_all_failed, _remove_parts, _run_extract_distributed, _store_errors, run_extract  # noqa: F401
