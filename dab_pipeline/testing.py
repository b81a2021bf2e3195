"""What the benchmarks build without decoding anything: stores of random or given features.

* ``store_index``: the id / split / caption arrays ``create_store`` takes;
* ``empty_store``: a preallocated store (open for writing) over such an index
  (``benchmarks/store_read.py``, ``benchmarks/shortlist_read.py``);
* ``random_store``: clustered random features (each caption near its video's centre, so a
  model can learn the pairing), with an optional set of augmented training views
  (``benchmarks/ddp_check.py``, ``benchmarks/sweep_overhead.py``).

The tests use them too; their own factories (small models, hand-made run folders, damaged videos) are in
``tests/helpers``. Benchmarks import this module, so it imports nothing from pytest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dab_pipeline.store import create_store

DEFAULT_SPLITS = ("train",) * 20 + ("val",) * 5 + ("test",) * 5


def store_index(
    n_videos: int,
    captions_per_video: int = 1,
    splits: Sequence[str] | str = "train",
    video_id: str = "v{i}",
    caption_id: str = "{video}#{k}",
    caption_text: Optional[Callable[[int, int], str]] = None,
) -> dict[str, Any]:
    """The index arrays of ``create_store``: ``n_videos`` videos, ``captions_per_video`` captions each.

    ``splits``: one split for every video, or one per video (cut to ``n_videos``).
    ``video_id`` / ``caption_id``: format strings (``{i}`` the video, ``{video}`` its
    id, ``{k}`` the caption's number within it, ``{q}`` its row). ``caption_text(q, v)``
    (default ``"x"``).
    """
    split = np.array([splits] * n_videos if isinstance(splits, str) else list(splits)[:n_videos], dtype=object)
    if len(split) != n_videos:
        raise ValueError(f"{len(split)} splits for {n_videos} videos")
    vids = [video_id.format(i=i) for i in range(n_videos)]
    cvid = np.repeat(np.arange(n_videos), captions_per_video)  # (M,)
    ks = np.tile(np.arange(captions_per_video), n_videos)
    return {
        "video_ids": vids,
        "video_split": list(split),
        "caption_ids": [caption_id.format(video=vids[v], k=k, q=q, i=v) for q, (v, k) in enumerate(zip(cvid, ks))],
        "caption_video_index": cvid,
        "caption_text": [caption_text(q, v) if caption_text else "x" for q, v in enumerate(cvid)],
        "caption_split": list(split[cvid]),
    }


def empty_store(
    path: Path,
    n_videos: int = 10,
    *,
    captions_per_video: int = 1,
    splits: Sequence[str] | str = "train",
    video_id: str = "v{i}",
    caption_id: str = "{video}#{k}",
    caption_text: Optional[Callable[[int, int], str]] = None,
    manifest: Optional[dict] = None,
    num_frames: int = 3,
    dim: int = 4,
    dtype: str = "float32",
    **create_kw: Any,
):
    """A new store over :func:`store_index`, open for writing (``create_kw`` go to ``create_store``)."""
    idx = store_index(n_videos, captions_per_video, splits, video_id, caption_id, caption_text)
    return create_store(
        path,
        manifest=manifest if manifest is not None else {"m": 1},
        num_frames=num_frames,
        dim=dim,
        dtype=dtype,
        **idx,
        **create_kw,
    )


def random_store(
    path: Path,
    n_videos: int = 30,
    caps_per_video: int = 2,
    dim: int = 16,
    frames: int = 4,
    seed: int = 0,
    splits: Sequence[str] = DEFAULT_SPLITS,
    train_views: int = 0,
    manifest: dict | None = None,
) -> Path:
    """A float32 store of ``n_videos`` videos (splits[i] each) with ``caps_per_video`` captions each."""
    rng = np.random.default_rng(seed)
    manifest = manifest or {"model": "random", "frames": frames, "dataset": "random", "clip": {"embed_dim": dim}}
    st = empty_store(
        path,
        n_videos,
        captions_per_video=caps_per_video,
        splits=splits,
        caption_id="v{i}#{k}",
        manifest=manifest,
        num_frames=frames,
        dim=dim,
        train_views=train_views,
    )
    split = np.asarray(st.video_split)
    cap_video = np.asarray(st.caption_video_index)
    centres = rng.normal(size=(n_videos, dim)).astype(np.float32)  # (V, D)
    fr = centres[:, None] + 0.3 * rng.normal(size=(n_videos, frames, dim)).astype(np.float32)  # (V, F, D)
    if train_views:
        train = np.flatnonzero(split == "train")
        noise = 0.2 * rng.normal(size=(len(train), train_views, frames, dim)).astype(np.float32)
        st.write_views(train, fr[train, None] + noise)  # (T, N, F, D)
    st.write_videos(np.arange(n_videos), fr, np.ones((n_videos, frames), bool), np.full(n_videos, 20))
    st.write_captions(
        np.arange(len(cap_video)), centres[cap_video] + 0.3 * rng.normal(size=(len(cap_video), dim)).astype(np.float32)
    )
    st.close()
    return path
