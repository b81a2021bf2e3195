"""The format constants and helpers of store/layout.py: the manifest as stored and its compatibility check."""

from __future__ import annotations

from pathlib import Path

from dab_pipeline.store import (
    create_store,
    manifest_compatible,
    open_store,
)

from ..helpers.store_rows import D, F, index_arrays


def test_manifest_round_trip_and_compatibility(tmp_path: Path, suffix: str) -> None:
    manifest = {
        "model": "ViT-B-32",
        "pretrained": "openai",
        "frames": 12,
        "preprocessing": {"resize": 224, "crop": "center"},
        "dataset": {"name": "msrvtt", "options": {"split": "1k-A"}},
        "image_size": (224, 224),
    }
    idx = index_arrays(2)
    idx.pop("_m")
    with create_store(tmp_path / f"s{suffix}", manifest=manifest, num_frames=F, dim=D, **idx):
        pass
    with open_store(tmp_path / f"s{suffix}") as s:
        got = s.manifest
    assert got["dataset"] == {"name": "msrvtt", "options": {"split": "1k-A"}}
    assert got["image_size"] == [224, 224]  # JSON has no tuples
    keys = ["model", "pretrained", "frames", "preprocessing", "image_size", "dataset.options"]
    assert manifest_compatible(got, manifest, keys) == []  # the tuple/list difference does not count
    changed = {**manifest, "frames": 8, "dataset": {"name": "msrvtt", "options": {"split": "7k"}}}
    assert manifest_compatible(got, changed, keys) == ["frames", "dataset.options"]
    assert manifest_compatible(got, {k: v for k, v in manifest.items() if k != "pretrained"}, keys) == ["pretrained"]


def test_matches_in_a_gallery_is_each_captions_video_column_and_minus_one_where_missing() -> None:
    """SplitFeatures.matches_in against the plain reference: the gallery's index of each caption's video."""
    import numpy as np

    from dab_pipeline.store.layout import SplitFeatures

    def split(videos: list[str], caption_video: list[int]) -> SplitFeatures:
        v, q = len(videos), len(caption_video)
        return SplitFeatures(
            "s", np.array(videos), np.zeros((v, 2, 4), np.float32), np.ones((v, 2), bool),
            np.array([f"c{i}" for i in range(q)]), np.array(caption_video, np.int64), np.zeros((q, 4), np.float32),
            np.arange(v), np.arange(q),
        )  # fmt: skip

    queries = split(["b", "x", "d"], [0, 0, 2, 1, 2])
    gallery = split(["a", "b", "c", "d"], [0])
    want = [["a", "b", "c", "d"].index(v) if v in "abcd" else -1 for v in ["b", "b", "d", "x", "d"]]
    got = queries.matches_in(gallery)
    assert got.dtype == np.int64 and got.tolist() == want == [1, 1, 3, -1, 3]
    assert queries.matches_in(queries).tolist() == [0, 0, 2, 1, 2]  # a split in itself: its own caption_video
