"""The rows the store tests write and check: deterministic per-row contents, the index, a store of any layout.

Shared by the tests of tests/store/ and by the writer and creator they run in killed subprocesses (which import
this module by name), so it stays free of pytest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dab_pipeline.store import create_store
from dab_pipeline.testing import store_index

SUFFIXES = [".h5", ".zarr"]
F, D = 4, 8  # frames, projected dim
L, WV, WT = 3, 6, 5  # vision tokens, vision width, text width
SPLITS = ("train", "val", "test")


def expected_video(i: int, with_tokens: bool = True) -> dict:
    rng = np.random.default_rng(1000 + i)
    out = {
        "frames": rng.standard_normal((F, D)).astype(np.float16),  # (F, D)
        "mask": np.arange(F) < 1 + i % F,  # (F,)
        "nvf": 10 + i,
    }
    if with_tokens:
        out["states"] = rng.standard_normal((F, L, WV)).astype(np.float16)  # (F, L, W)
    return out


def token_length(q: int) -> int:
    return 1 + q % 4


def expected_caption(q: int) -> dict:
    rng = np.random.default_rng(5000 + q)
    return {
        "text": rng.standard_normal(D).astype(np.float16),  # (D,)
        "tokens": rng.standard_normal((token_length(q), WT)).astype(np.float16),  # (T, W)
    }


def index_arrays(n: int, captions_per_video: int = 2) -> dict:
    idx = store_index(
        n,
        captions_per_video,
        splits=[SPLITS[i % 3] for i in range(n)],  # interleaved splits
        video_id="vid{i:04d}",
        caption_text=lambda q, v: f"caption {q} of vid{v} — ünïcode",
    )
    return {**idx, "_m": n * captions_per_video}


def make_store(path: Path, n: int = 12, states: str | None = None, dtype: str = "float16", **kw):
    idx = index_arrays(n)
    m = idx.pop("_m")
    extra: dict = {}
    if states == "pooled":
        extra = {"vision_state_shape": (WV,), "text_state_width": WT}
    elif states == "tokens":
        extra = {
            "vision_state_shape": (L, WV),
            "text_state_width": WT,
            "text_state_lengths": [token_length(q) for q in range(m)],
        }
    manifest = {
        "model": "dab-tiny",
        "pretrained": None,
        "frames": F,
        "preprocessing": (224, "center"),
        "trainable_blocks": 2 if states == "tokens" else 0 if states else None,
    }
    return create_store(path, manifest=manifest, num_frames=F, dim=D, dtype=dtype, **idx, **extra, **kw)


def write_all(store, videos=None, states: str | None = None) -> None:
    videos = range(store.num_videos) if videos is None else videos
    for i in videos:
        e = expected_video(i)
        vs = None
        if states == "tokens":
            vs = e["states"][None]
        elif states == "pooled":
            vs = e["states"][None, :, 0, :]  # (1, F, W)
        store.write_videos([i], e["frames"][None], e["mask"][None], [e["nvf"]], vs)
    qs = np.arange(store.num_captions)
    text = np.stack([expected_caption(q)["text"] for q in qs])
    ts = None
    if states == "tokens":
        ts = [expected_caption(q)["tokens"] for q in qs]
    elif states == "pooled":
        ts = np.stack([expected_caption(q)["tokens"][0] for q in qs])
    store.write_captions(qs, text, ts)
