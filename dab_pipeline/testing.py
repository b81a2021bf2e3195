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


# --------------------------------------------------------------------------- calibration worlds (issue 58)


def clustered_gallery(videos: int, seed: int = 0, max_captions: int = 8) -> dict[str, np.ndarray]:
    """A gallery of ``videos`` videos, each with 1 to ``max_captions`` captions as queries whose costs over the
    gallery share their video's luck (clustered queries, the video as the unit), and whose difficulty the text
    variance tracks, so that marginal coverage is uneven across bands of it.

    Returns cost (Q, V) float64, gt (Q,) (the query's video: its column), text_var (Q,) and lengths (Q,) (a word
    count that tracks the caption's specificity)."""
    rng = np.random.default_rng(seed)
    m = rng.integers(1, max_captions + 1, videos)  # (V,) captions a video
    gt = np.repeat(np.arange(videos), m)  # (Q,)
    q = len(gt)
    hard = rng.uniform(0, 1, videos)[gt]  # (Q,) the video's own difficulty, shared by its captions
    ambiguity = np.clip(0.5 * hard + 0.5 * rng.uniform(0, 1, q), 0, 1)  # (Q,)
    cost = rng.normal(10.0, 1.0, (q, videos))  # (Q, V)
    luck = rng.normal(0.0, 0.8, videos)[gt]  # (Q,) shared within a video
    cost[np.arange(q), gt] -= 4.0 * (1.0 - ambiguity) + luck + rng.normal(0, 0.5, q)
    text_var = np.exp(2.0 * ambiguity + 0.3 * rng.normal(size=q))
    lengths = np.maximum(1, np.round(12 - 8 * ambiguity + rng.normal(0, 2, q))).astype(np.int64)
    return {"cost": cost, "gt": gt, "text_var": text_var, "lengths": lengths}


def clustered_outcomes(videos: int, seed: int = 0, max_captions: int = 12) -> dict[str, np.ndarray]:
    """Calibrated-looking confidences and outcomes of clustered queries: a video's captions share a random effect
    on their confidence and another on their correctness (errors come together), so captions are not independent.

    Returns confidence (Q,), correct (Q,) bool, video (Q,), and p_correct (Q,): each caption's true probability of
    being right, from which the population risk at any threshold is computed (:func:`clustered_risk`)."""
    rng = np.random.default_rng(seed)
    m = rng.integers(1, max_captions + 1, videos)
    video = np.repeat(np.arange(videos), m)
    q = len(video)
    logit = 0.5 + 1.2 * rng.normal(size=videos)[video] + rng.normal(size=q)  # (Q,)
    confidence = 1.0 / (1.0 + np.exp(-logit))
    p_correct = 1.0 / (1.0 + np.exp(-(logit + 0.3 + 1.5 * rng.normal(size=videos)[video])))
    return {
        "confidence": confidence,
        "correct": rng.uniform(size=q) < p_correct,
        "video": video,
        "p_correct": p_correct,
    }


def clustered_risk(population: dict[str, np.ndarray], thresholds: np.ndarray) -> np.ndarray:
    """The error rate among answered queries at each threshold (T,), a random caption of a random video (each
    caption weighted by one over its video's captions), from the captions' true probabilities of being right."""
    video, conf, p = population["video"], population["confidence"], population["p_correct"]
    w = 1.0 / np.bincount(video)[video]  # (Q,)
    order = np.argsort(-conf)
    cw, cerr = np.cumsum(w[order]), np.cumsum((w * (1 - p))[order])  # answered weight and errors, t descending
    at = np.searchsorted(-conf[order], -np.asarray(thresholds, np.float64), side="right")  # answered per threshold
    out = np.zeros(len(at))
    ok = at > 0
    out[ok] = cerr[at[ok] - 1] / cw[at[ok] - 1]
    return out
