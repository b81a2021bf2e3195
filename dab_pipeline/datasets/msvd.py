"""MSVD in its official split files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from .common import DATASETS, DatasetIndex, SPLITS, _build, _caption_lists, _check_disjoint, _drop_uncaptioned, _read_json, _read_list, _reject_unknown, _require, _resolve_dirs, _wanted_splits


@DATASETS.register("msvd")
def load_msvd(
    videos: Path | None,
    annotations: Path | None,
    splits: Iterable[str] | str | None = None,
    **unused: Any,
) -> DatasetIndex:
    """MSVD: captions_msvd.json + train/val/test_list.txt (1200/100/670); every caption kept."""
    _reject_unknown("msvd", unused)
    wanted = _wanted_splits(splits) or SPLITS
    video_dir, ann_dir, ann_file = _resolve_dirs("msvd", videos, annotations)
    cap_path = ann_file if ann_file is not None and ann_file.suffix.lower() == ".json" else ann_dir / "captions_msvd.json"
    data = _read_json(_require(cap_path, "MSVD captions, {video_id: [caption, ...]}"))
    captions = _caption_lists(data, cap_path)
    split_ids = {s: _read_list(_require(ann_dir / f"{s}_list.txt", f"the MSVD {s} ids, one per line")) for s in wanted}
    _check_disjoint(split_ids, ann_dir)
    warnings: list[str] = []
    _drop_uncaptioned(split_ids, captions, cap_path, warnings)
    files = [cap_path] + [ann_dir / f"{s}_list.txt" for s in wanted]
    return _build("msvd", video_dir, split_ids, captions, ".avi", files, {"splits": list(wanted), "warnings": warnings})
