"""What the benchmarks and the tests build without decoding anything: stores, run folders and small models.

* ``store_index``: the id / split / caption arrays ``create_store`` takes;
* ``empty_store``: a preallocated store (open for writing) over such an index
  (``benchmarks/store_read.py``, ``benchmarks/shortlist_read.py``);
* ``random_store``: clustered random features (each caption near its video's centre, so a
  model can learn the pairing), with an optional set of augmented training views
  (``benchmarks/ddp_check.py``, ``benchmarks/sweep_overhead.py``);
* ``hand_made_run``: a run folder of a small perturbed model, as `dab train` leaves it;
* ``small_model``, ``perturb``, ``random_inputs``: the one model factory of the tests (a seeded
  small DABModel of any variant, moved off its identity / zero init, and CLIP-like inputs).

``hand_made_run`` and the small-model factory are used by tests only, tests/scoring among them; they stay here
until those tests import them from ``tests/helpers`` (where the other test-only factories now are). Benchmarks
import this module, so it imports nothing from pytest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.runs.run_folder import RunFolder
from dab_pipeline.stages.train import TrainConfig
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


def hand_made_run(path: Path, store: Path, variant: str = "dab", model_kw: Optional[dict] = None, **train: Any):
    """A run folder as `dab train` leaves it (config.json, checkpoints/best.pt), of a small model whose every
    parameter is moved off its init; returns (path, the model in eval mode). ``model_kw``: ModelConfig fields."""
    import torch

    model_kw = {"steps": 3, "drift_hidden": 24, "time_embed_dim": 8, **(model_kw or {})}
    cfg = TrainConfig(features=store, out=path, model=ModelConfig(embed_dim=32, variant=variant, **model_kw), **train)
    torch.manual_seed(0)
    model = DABModel(cfg.model)
    with torch.no_grad():  # a "trained" model: every parameter off its init
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    run = RunFolder(path)
    run.checkpoint_dir.mkdir(parents=True)
    run.save_config(cfg)
    run.save_checkpoint(RunFolder.BEST, {"model": model.state_dict(), "heads": None, "epoch": 1})
    return path, model.eval()


# --------------------------------------------------------------------------- small models

SMALL_MODEL = {"embed_dim": 16, "steps": 3, "drift_hidden": 24, "time_embed_dim": 8, "dropout": 0.3}


def perturb(model, seed: int = 0, scale: float = 0.1):
    """Move every parameter off its (identity / zero) init by seeded Gaussian noise of ``scale``, so a test sees a
    generic model (a zero-initialised drift would leave the bridge the identity)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return model


def small_model(variant: str = "dab", *, seed: int = 0, scale: float = 0.1, **cfg: Any):
    """A small DABModel of ``variant`` (:data:`SMALL_MODEL` unless ``cfg`` says), built under ``torch.manual_seed(seed)``
    and perturbed by ``scale`` with the stream ``seed + 1`` (0: left at its init)."""
    import torch

    torch.manual_seed(seed)
    model = DABModel(ModelConfig(variant=variant, **{**SMALL_MODEL, **cfg}))
    return perturb(model, seed + 1, scale) if scale else model


def random_inputs(q: int = 11, v: int = 7, frames: int = 5, dim: int = 16, seed: int = 0):
    """CLIP-like inputs: text (q, dim), frames (v, frames, dim), a mask with two short videos, and a random gt (q,)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    text = torch.randn(q, dim, generator=gen) * 2
    feats = torch.randn(v, frames, dim, generator=gen) * 2
    mask = torch.ones(v, frames, dtype=torch.bool)
    mask[2 % v, 3:] = False  # short videos: padded frames
    mask[5 % v, 1:] = False
    gt = torch.randint(0, v, (q,), generator=gen)
    return text, feats, mask, gt
