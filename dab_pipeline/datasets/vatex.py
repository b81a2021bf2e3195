"""VATEX (official JSON, or the public test variant)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..core.errors import DatasetError
from .catalogue import (
    DATASETS,
    SPLITS,
    Catalogue,
    build_catalogue,
    caption_lists,
    check_disjoint,
    drop_uncaptioned,
    found_in,
    in_dir,
    read_json,
    read_list,
    reject_unknown,
    require_file,
    resolve_dirs,
    wanted_splits,
)

VATEX_OFFICIAL = ("vatex_training_v1.0.json", "vatex_validation_v1.0.json", "vatex_public_test_english_v1.1.json")


VATEX_VARIANT = "vatex_data.json"


@DATASETS.register("vatex")
def load_vatex(
    videos: Path | None,
    annotations: Path | None,
    test_list: str | None = None,
    train_list: str | None = None,
    val_list: str | None = None,
    splits: Iterable[str] | str | None = None,
    **unused: Any,
) -> Catalogue:
    """VATEX: English captions + split lists (25991/1500/1500 by default).

    Captions come from vatex_data.json ({id: {"enCap": [...]}}) when present,
    else from the official release files (JSON lists of {"videoID", "enCap"}).
    Listed ids without captions are dropped and counted in options["warnings"].
    A val id that is also in the chosen test list is dropped from val.
    """
    reject_unknown("vatex", unused)
    wanted = wanted_splits(splits) or SPLITS
    video_dir, ann_dir, ann_file = resolve_dirs("vatex", videos, annotations)
    list_names = {
        "train": train_list or "train_list.txt",
        "val": val_list or "val_list.txt",
        "test": test_list or "test_list.txt",
    }

    if ann_file is not None and ann_file.suffix.lower() == ".json":
        cap_files = [ann_file]
    elif (ann_dir / VATEX_VARIANT).is_file():
        cap_files = [ann_dir / VATEX_VARIANT]
    else:
        cap_files = [ann_dir / f for f in VATEX_OFFICIAL if (ann_dir / f).is_file()]
        if not cap_files:
            raise DatasetError(
                f"missing VATEX captions in {ann_dir} (expected {VATEX_VARIANT} or {VATEX_OFFICIAL[0]} / {VATEX_OFFICIAL[1]})"
                f"{found_in(ann_dir)}"
            )
    captions: dict[str, list[str]] = {}
    for path in cap_files:
        captions.update(_vatex_captions(read_json(path), path))

    split_files = {s: require_file(in_dir(ann_dir, list_names[s]), f"the VATEX {s} ids, one per line") for s in wanted}
    split_ids = {s: read_list(p) for s, p in split_files.items()}
    warnings: list[str] = []
    if "val" in split_ids and "test" in split_ids:
        test_set = set(split_ids["test"])
        shared = [i for i in split_ids["val"] if i in test_set]
        if shared:
            # Selecting on videos that are also tested on would leak test into model selection.
            warnings.append(f"val: dropped {len(shared)} ids that are also in the test list {split_files['test'].name}")
            split_ids["val"] = [i for i in split_ids["val"] if i not in test_set]
    check_disjoint(split_ids, ann_dir)
    source = cap_files[0] if len(cap_files) == 1 else ann_dir
    drop_uncaptioned(split_ids, captions, source, warnings)
    options = {"splits": list(wanted), "lists": {s: split_files[s].name for s in wanted}, "warnings": warnings}
    return build_catalogue(
        "vatex", video_dir, split_ids, captions, ".mp4", cap_files + list(split_files.values()), options
    )


def _vatex_captions(data: Any, path: Path) -> dict[str, list[str]]:
    if isinstance(data, dict):
        return caption_lists(data, path)
    if not isinstance(data, list):
        raise DatasetError(
            f'{path}: expected a list of {{"videoID", "enCap"}} objects or an {{id: {{"enCap": [...]}}}} map'
        )
    out: dict[str, list[str]] = {}
    for pos, item in enumerate(data):
        if not isinstance(item, dict) or "videoID" not in item:
            raise DatasetError(f'{path}: entry {pos} has no "videoID"')
        caps = item.get("enCap", [])  # the public test file may carry no English captions
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            raise DatasetError(f'{path}: "enCap" of {item["videoID"]!r} is not a list of strings')
        if caps:
            out[str(item["videoID"])] = [c.strip() for c in caps]
    return out
