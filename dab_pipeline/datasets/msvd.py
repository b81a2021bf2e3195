"""MSVD in its official split files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from .catalogue import (
    DATASETS,
    SPLITS,
    Catalogue,
    build_catalogue,
    caption_lists,
    check_disjoint,
    drop_uncaptioned,
    read_json,
    read_list,
    reject_unknown,
    require_file,
    resolve_dirs,
    wanted_splits,
)


@DATASETS.register("msvd")
def load_msvd(
    videos: Path | None,
    annotations: Path | None,
    splits: Iterable[str] | str | None = None,
    **unused: Any,
) -> Catalogue:
    """MSVD: captions_msvd.json + train/val/test_list.txt (1200/100/670); every caption kept."""
    reject_unknown("msvd", unused)
    wanted = wanted_splits(splits) or SPLITS
    video_dir, ann_dir, ann_file = resolve_dirs("msvd", videos, annotations)
    cap_path = (
        ann_file if ann_file is not None and ann_file.suffix.lower() == ".json" else ann_dir / "captions_msvd.json"
    )
    data = read_json(require_file(cap_path, "MSVD captions, {video_id: [caption, ...]}"))
    captions = caption_lists(data, cap_path)
    split_ids = {
        s: read_list(require_file(ann_dir / f"{s}_list.txt", f"the MSVD {s} ids, one per line")) for s in wanted
    }
    check_disjoint(split_ids, ann_dir)
    warnings: list[str] = []
    drop_uncaptioned(split_ids, captions, cap_path, warnings)
    files = [cap_path] + [ann_dir / f"{s}_list.txt" for s in wanted]
    return build_catalogue(
        "msvd", video_dir, split_ids, captions, ".avi", files, {"splits": list(wanted), "warnings": warnings}
    )
