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
