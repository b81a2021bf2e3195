"""What an index, a calibration and a search record of the store they were built from: a split's encoded rows,
their fingerprint, and the average query (the mean caption feature the ``pooled`` index vector pools with)."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from ..core.errors import StoreError
from .feature_store import FeatureStore
from .layout import STATUS_OK

__all__ = ["FINGERPRINT_SAMPLE", "average_query", "split_rows", "store_fingerprint"]

FINGERPRINT_SAMPLE = 64


def split_rows(store: FeatureStore, split: str) -> np.ndarray:
    """The store rows of ``split``'s videos that have features, ascending (``"all"``: of every split)."""
    return np.flatnonzero(store.in_split(split) & (store.status() == STATUS_OK))


def store_fingerprint(store: FeatureStore, rows: np.ndarray) -> str:
    """A cheap identity of the indexed videos: the manifest, the layout, the ids and status of ``rows``, and the
    feature bytes of up to 64 of them spread evenly (a re-extraction changes those), hashed (sha256)."""
    h = hashlib.sha256()
    h.update(json.dumps(store.manifest, sort_keys=True, default=str).encode())
    h.update(json.dumps(store.layout, sort_keys=True, default=str).encode())
    h.update(np.asarray(rows, np.int64).tobytes())
    h.update("\x00".join(map(str, store.video_ids[rows])).encode())
    h.update(store.status()[rows].tobytes())
    if len(rows):
        sample = rows[np.unique(np.linspace(0, len(rows) - 1, min(FINGERPRINT_SAMPLE, len(rows))).astype(np.int64))]
        frames, mask = store.read_videos(sample)
        h.update(frames.astype(np.float32).tobytes())
        h.update(mask.tobytes())
    return h.hexdigest()


def average_query(store: FeatureStore, max_captions: int = 10_000) -> np.ndarray:
    """The mean of (up to ``max_captions`` evenly spaced) written caption features -> (D,) float32."""
    done = np.flatnonzero(store.caption_done())
    if len(done) == 0:
        raise StoreError(f"{store.path} holds no caption features: the pooled index vector needs an average query")
    pick = done[np.unique(np.linspace(0, len(done) - 1, min(max_captions, len(done))).astype(np.int64))]
    return store.read_captions(pick).mean(axis=0)
