"""MSR-VTT (1K-A test; 9k or 7k training videos with a seeded validation hold-out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..core.errors import ConfigError, DatasetError
from .catalogue import (
    DATASETS,
    SPLITS,
    Catalogue,
    build_catalogue,
    drop_uncaptioned,
    holdout,
    read_csv,
    read_json,
    reject_unknown,
    require_file,
    resolve_dirs,
    wanted_splits,
)

MSRVTT_TEST = "MSRVTT_JSFUSION_test.csv"


MSRVTT_TRAIN = {"9k": "MSRVTT_train.9k.csv", "7k": "MSRVTT_train.7k.csv"}


MSRVTT_DATA = "MSRVTT_data.json"


@DATASETS.register("msrvtt")
def load_msrvtt(
    videos: Path | None,
    annotations: Path | None,
    train_split: str = "9k",
    val_size: int = 500,
    seed: int = 0,
    splits: Iterable[str] | str | None = None,
    **unused: Any,
) -> Catalogue:
    """MSR-VTT 1K-A: test = the 1000 JSFusion pairs, train = 9k/7k ids with all their captions.

    1K-A has no validation split; ``val_size`` training videos (a permutation of
    the sorted ids seeded by ``seed``) are held out as "val" so that model
    selection never looks at test. Without MSRVTT_data.json only the test split
    is loaded (with a warning) unless train/val were asked for in ``splits``.
    """
    reject_unknown("msrvtt", unused)
    if train_split not in MSRVTT_TRAIN:
        raise ConfigError(f"msrvtt train_split must be one of {', '.join(MSRVTT_TRAIN)}, got {train_split!r}")
    wanted = wanted_splits(splits)
    video_dir, ann_dir, ann_file = resolve_dirs("msrvtt", videos, annotations)
    test_path, train_path, data_path = ann_dir / MSRVTT_TEST, ann_dir / MSRVTT_TRAIN[train_split], ann_dir / MSRVTT_DATA
    if ann_file is not None:
        if ann_file.suffix.lower() == ".json":
            data_path = ann_file
        elif ann_file.name.startswith("MSRVTT_train"):
            train_path = ann_file
        else:
            test_path = ann_file

    warnings: list[str] = []
    want = set(wanted or SPLITS)
    if wanted is None and not data_path.is_file():
        warnings.append(f"{data_path} not found: training captions unavailable, loaded the test split only")
        want = {"test"}
    split_ids: dict[str, list[str]] = {}
    captions: dict[str, list[str]] = {}
    files: list[Path] = []

    if "test" in want:
        split_ids["test"] = _test_pairs(test_path, captions)
        files.append(test_path)
    if want & {"train", "val"}:
        train_ids = _training_ids(train_path, data_path, train_split, captions, split_ids.get("test", []), warnings)
        val_n = int(val_size) if "val" in want else 0
        train_ids, val_ids = holdout(train_ids, val_n, seed, train_path)
        if "train" in want:
            split_ids["train"] = train_ids
        if val_ids:
            split_ids["val"] = val_ids
        files += [train_path, data_path]

    options = {
        "train_split": train_split,
        "val_size": int(val_size),
        "seed": int(seed),
        "splits": sorted(want, key=SPLITS.index),
        "warnings": warnings,
    }
    return build_catalogue("msrvtt", video_dir, split_ids, captions, ".mp4", files, options)


def _test_pairs(test_path: Path, captions: dict[str, list[str]]) -> list[str]:
    """The 1K-A test video ids, in file order; their sentences go into ``captions``."""
    rows = read_csv(
        require_file(test_path, "the 1K-A test pairs, columns key,vid_key,video_id,sentence"), ["video_id", "sentence"]
    )
    ids: list[str] = []
    for row in rows:
        vid = row["video_id"]
        if not vid:
            raise DatasetError(f"{test_path}: a row has an empty video_id")
        if vid not in captions:
            ids.append(vid)
            captions[vid] = []
        captions[vid].append(row["sentence"])
    return ids


def _training_ids(
    train_path: Path,
    data_path: Path,
    train_split: str,
    captions: dict[str, list[str]],
    test_ids: list[str],
    warnings: list[str],
) -> list[str]:
    """The 9k / 7k training ids that have captions (theirs go into ``captions``, in sen_id order)."""
    train_rows = read_csv(require_file(train_path, f"the {train_split} training ids, header video_id"), ["video_id"])
    train_ids = [r["video_id"] for r in train_rows if r["video_id"]]
    if len(set(train_ids)) != len(train_ids):
        raise DatasetError(f"{train_path}: duplicate video ids")
    data = read_json(
        require_file(data_path, 'the MSR-VTT captions, {"sentences": [{"video_id", "caption", "sen_id"}, ...]}')
    )
    sentences = data.get("sentences") if isinstance(data, dict) else None
    if not isinstance(sentences, list):
        raise DatasetError(f'{data_path}: expected an object with a "sentences" list')
    train_set = set(train_ids)
    by_video: dict[str, list[tuple[int, int, str]]] = {}
    for pos, s in enumerate(sentences):
        if not isinstance(s, dict) or "video_id" not in s or "caption" not in s:
            raise DatasetError(f'{data_path}: sentence {pos} lacks "video_id" or "caption"')
        if s["video_id"] in train_set:
            # sen_id gives a stable caption order whatever the file order.
            by_video.setdefault(s["video_id"], []).append((int(s.get("sen_id", pos)), pos, str(s["caption"]).strip()))
    for vid, items in by_video.items():
        captions[vid] = [text for _, _, text in sorted(items)]
    overlap = train_set & set(test_ids)
    if overlap:
        raise DatasetError(f"{train_path}: {len(overlap)} training ids are also test ids (first: {sorted(overlap)[0]})")
    train_only = {"train": train_ids}
    drop_uncaptioned(train_only, captions, data_path, warnings)
    return train_only["train"]
