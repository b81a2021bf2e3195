"""Stores the tests build without decoding anything: one place for their layout.

``random_store`` writes clustered random features (each caption near its video's centre, so a
model can learn the pairing), with an optional set of augmented training views.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from dab_pipeline.store import create_store

DEFAULT_SPLITS = ("train",) * 20 + ("val",) * 5 + ("test",) * 5


def random_store(path: Path, n_videos: int = 30, caps_per_video: int = 2, dim: int = 16, frames: int = 4,
                 seed: int = 0, splits: Sequence[str] = DEFAULT_SPLITS, train_views: int = 0,
                 manifest: dict | None = None) -> Path:
    """A float32 store of ``n_videos`` videos (splits[i] each) with ``caps_per_video`` captions each."""
    rng = np.random.default_rng(seed)
    split = np.array(list(splits)[:n_videos])
    vids = np.array([f"v{i}" for i in range(n_videos)])
    cap_video = np.repeat(np.arange(n_videos), caps_per_video)
    cap_ids = np.array([f"v{v}#{k}" for v, k in zip(cap_video, np.tile(np.arange(caps_per_video), n_videos))])
    manifest = manifest or {"model": "random", "frames": frames, "dataset": "random", "clip": {"embed_dim": dim}}
    st = create_store(path, manifest=manifest, video_ids=vids, video_split=split, caption_ids=cap_ids,
                      caption_video_index=cap_video, caption_text=np.array(["x"] * len(cap_video)),
                      caption_split=split[cap_video], num_frames=frames, dim=dim, dtype="float32",
                      train_views=train_views)
    centres = rng.normal(size=(n_videos, dim)).astype(np.float32)  # (V, D)
    fr = centres[:, None] + 0.3 * rng.normal(size=(n_videos, frames, dim)).astype(np.float32)  # (V, F, D)
    if train_views:
        train = np.flatnonzero(split == "train")
        noise = 0.2 * rng.normal(size=(len(train), train_views, frames, dim)).astype(np.float32)
        st.write_views(train, fr[train, None] + noise)  # (T, N, F, D)
    st.write_videos(np.arange(n_videos), fr, np.ones((n_videos, frames), bool), np.full(n_videos, 20))
    st.write_captions(np.arange(len(cap_video)),
                      centres[cap_video] + 0.3 * rng.normal(size=(len(cap_video), dim)).astype(np.float32))
    st.close()
    return path
