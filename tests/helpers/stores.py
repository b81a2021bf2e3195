"""Stores for the search and serve tests: captions that dab-tiny re-encodes to their stored features."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from dab_pipeline.clip_models import encode_texts, load_clip
from dab_pipeline.testing import empty_store

SEARCH_CAPTIONS = [
    "a red ball rolls",
    "a dog runs on grass",
    "two people talk",
    "a car at night",
    "waves on a beach",
    "a cat sleeps",
    "someone cooks pasta",
    "a train passes",
]

# validation captions of distinct videos for calibration tests (40 of them), and the splits of a store holding
# SEARCH_CAPTIONS (6 test, 2 train videos) then these
CALIBRATION_CAPTIONS = [
    f"a {c} {t}"
    for c in ("red", "blue", "green", "white", "black")
    for t in ("ball", "dog", "car", "cat", "train", "boat", "bird", "tree")
][:40]
CALIBRATION_SPLITS = ["test"] * 6 + ["train"] * 2 + ["val"] * len(CALIBRATION_CAPTIONS)


def text_store(
    path: Path,
    captions: Sequence[str] = SEARCH_CAPTIONS,
    test_videos: int = 6,
    frames: int = 4,
    pretrained: Optional[str] = None,
    splits: Optional[Sequence[str]] = None,
) -> Path:
    """One caption per video, encoded by dab-tiny (so a query string re-encodes to its stored feature).

    Videos ``0 .. test_videos - 1`` are "test", the rest "train" (or each its own of ``splits``); video 1 is short
    (2 frames).
    """
    bundle = load_clip("dab-tiny", None)
    d, n = bundle.embed_dim, len(captions)
    manifest = {
        "model": "dab-tiny",
        "pretrained": pretrained,
        "weights_sha256": bundle.weights_sha256,
        "clip": {"embed_dim": d},
        "frames": frames,
    }
    store = empty_store(
        path,
        n,
        splits=list(splits) if splits is not None else ["test"] * test_videos + ["train"] * (n - test_videos),
        video_id="vid{i}",
        caption_text=lambda q, v: captions[q],
        manifest=manifest,
        num_frames=frames,
        dim=d,
    )
    gen = np.random.default_rng(0)
    fr = gen.standard_normal((n, frames, d)).astype(np.float32)
    mask = np.ones((n, frames), bool)
    mask[1, 2:] = False  # a short video
    with store:
        store.write_videos(np.arange(n), fr, mask, mask.sum(1))
        store.write_captions(np.arange(n), encode_texts(bundle, list(captions)).features.numpy())
    return path
