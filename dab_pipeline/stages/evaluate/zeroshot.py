"""A zero-shot run: CLIP's own features of a store, scored with no training (`dab evaluate --zero-shot`).

The video is the mean of its L2-normalised frame features (the padding frames of a short video left out),
normalised again, and a caption scores it by cosine: CLIP4Clip's meanP at inference and Portillo-Quintero et al.'s
baseline (both normalise each frame before averaging). The cost file is an ordinary one (``costs_test.h5``, cost =
-cosine) marked ``variant: zero-shot``, so that `dab evaluate` puts a published zero-shot figure beside it
(:mod:`dab_pipeline.results.published`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...runs.costfile import CostMatrix, write_costs
from ...store import open_store

__all__ = ["ZERO_SHOT_POOLING", "write_zero_shot_costs"]

ZERO_SHOT_POOLING = (
    "cosine of the caption feature with the mean of the video's L2-normalised frame features (CLIP4Clip's meanP "
    "without training)"
)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def write_zero_shot_costs(store: Path, costs: Path, split: str = "test") -> Path:
    """The zero-shot cost file of ``split`` of ``store`` at ``costs``; returns its path."""
    with open_store(store) as st:
        st.require_complete("dab evaluate --zero-shot (reads the split's features)")
        data = st.load_split(split)
    mask = np.asarray(data.frame_mask, np.float32)[..., None]  # (V, F, 1)
    frames = _unit(np.asarray(data.frames, np.float32)) * mask  # (V, F, D)
    video = _unit(frames.sum(1) / np.maximum(mask.sum(1), 1.0))  # (V, D)
    text = _unit(np.asarray(data.text, np.float32))  # (Q, D)
    Path(costs).parent.mkdir(parents=True, exist_ok=True)
    return write_costs(
        costs,
        CostMatrix(
            cost=-(text @ video.T),  # (Q, V)
            query_ids=np.asarray(data.caption_ids),
            video_ids=np.asarray(data.video_ids),
            gt=np.asarray(data.caption_video, np.int64),
            kind="cost",
            attrs={"variant": "zero-shot", "store": str(store), "split": split, "pooling": ZERO_SHOT_POOLING},
        ),
    )
