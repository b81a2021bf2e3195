"""A dataset's catalogue (its videos, captions and splits), the loader registry and the helpers every loader shares."""

from __future__ import annotations

import csv
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..core.errors import ConfigError, DatasetError
from ..core.registry import Registry

SPLITS = ("train", "val", "test")


VIDEO_EXTENSIONS = (".mp4", ".webm", ".mkv", ".avi", ".mov", ".m4v")


@dataclass(frozen=True)
class VideoItem:
    video_id: str
    path: Path  # absolute path of the video file (may not exist)
    split: str  # "train" | "val" | "test"


@dataclass(frozen=True)
class CaptionItem:
    caption_id: str  # unique within the dataset, "<video_id>#<k>"
    video_id: str
    text: str
    split: str


@dataclass
class Catalogue:
    """What a loader makes of a dataset: its videos and captions by split, and the files they came from."""

    name: str
    videos: list[VideoItem]  # unique ids, deterministic order
    captions: list[CaptionItem]  # every caption's video_id is in videos
    annotation_files: list[Path]  # hashed into the store manifest
    missing: list[str]  # video ids listed but not on disk
    options: dict  # loader options that shaped the catalogue

    def split_videos(self, split: str) -> list[VideoItem]:
        return [v for v in self.videos if v.split == split]

    def split_captions(self, split: str) -> list[CaptionItem]:
        return [c for c in self.captions if c.split == split]

    def splits(self) -> list[str]:
        """The splits that have at least one video, in train/val/test order."""
        present = {v.split for v in self.videos}
        return [s for s in SPLITS if s in present]


Loader = Callable[..., Catalogue]


DATASETS: Registry[Loader] = Registry("dataset")


def load_dataset(name: str, videos: Path | None, annotations: Path | None, **options: Any) -> Catalogue:
    """The catalogue of dataset ``name`` (see :data:`DATASETS` for the names)."""
    loader = DATASETS.get(name)
    return loader(
        Path(videos) if videos is not None else None, Path(annotations) if annotations is not None else None, **options
    )


def resolve_dirs(name: str, videos: Path | None, annotations: Path | None) -> tuple[Path, Path, Path | None]:
    """(videos folder, annotation folder, single annotation file or None)."""
    if videos is None and annotations is None:
        raise DatasetError(f"dataset {name!r}: give a videos folder or an annotations path (got neither)")
    ann_file: Path | None = None
    if annotations is None:
        ann_dir = Path(videos).resolve()  # type: ignore[arg-type]
    else:
        annotations = Path(annotations).resolve()
        if annotations.is_dir():
            ann_dir = annotations
        elif annotations.is_file():
            ann_file, ann_dir = annotations, annotations.parent
        else:
            raise DatasetError(
                f"dataset {name!r}: annotations path {annotations} does not exist (expected a folder or a file)"
            )
    video_dir = Path(videos).resolve() if videos is not None else ann_dir
    if not video_dir.is_dir():
        raise DatasetError(
            f"dataset {name!r}: videos folder {video_dir} does not exist (expected a folder of video files)"
        )
    return video_dir, ann_dir, ann_file


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DatasetError(f"missing annotation file {path} (expected {what})")
    return path


def read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc})") from None


def read_list(path: Path) -> list[str]:
    """Ids of a split list file, one per line; blank lines ignored, duplicates rejected."""
    try:
        ids = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc})") from None
    ids = [i for i in ids if i]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DatasetError(f"{path}: video id {dup!r} is listed more than once")
    return ids


def read_csv(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            absent = [c for c in required if c not in header]
            if absent:
                raise DatasetError(
                    f"{path}: missing column(s) {', '.join(absent)} (expected header with {', '.join(required)}; found {', '.join(header) or 'no header'})"
                )
            rows = [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in reader]
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc})") from None
    except csv.Error as exc:
        raise DatasetError(f"{path}: malformed CSV ({exc})") from None
    return rows


def _scan_videos(video_dir: Path) -> dict[str, list[str]]:
    """stem -> file names in ``video_dir`` with a video suffix (one directory listing)."""
    found: dict[str, list[str]] = {}
    with os.scandir(video_dir) as it:
        for entry in it:
            stem, ext = os.path.splitext(entry.name)
            if ext.lower() in VIDEO_EXTENSIONS and entry.is_file():
                found.setdefault(stem, []).append(entry.name)
    return found


def _video_path(video_dir: Path, video_id: str, found: dict[str, list[str]], preferred: str) -> tuple[Path, bool]:
    """(path, exists): the file for ``video_id``, preferring the dataset's usual suffix."""
    names = found.get(video_id)
    if not names:
        return video_dir / f"{video_id}{preferred}", False
    for ext in (preferred,) + VIDEO_EXTENSIONS:
        for name in names:
            if name.lower().endswith(ext):
                return video_dir / name, True
    return video_dir / sorted(names)[0], True


def wanted_splits(splits: Iterable[str] | str | None) -> tuple[str, ...] | None:
    if splits is None:
        return None
    if isinstance(splits, str):
        splits = [s for s in splits.replace(",", " ").split() if s]
    out = tuple(splits)
    bad = [s for s in out if s not in SPLITS]
    if bad:
        raise ConfigError(f"unknown split(s) {', '.join(map(repr, bad))}; valid: {', '.join(SPLITS)}")
    return out


def build_catalogue(
    name: str,
    video_dir: Path,
    split_ids: dict[str, list[str]],
    captions: dict[str, list[str]],
    preferred_ext: str,
    annotation_files: list[Path],
    options: dict,
) -> Catalogue:
    """Assemble the catalogue from ordered ids per split and captions per id."""
    found = _scan_videos(video_dir)
    videos: list[VideoItem] = []
    caps: list[CaptionItem] = []
    missing: list[str] = []
    for split in SPLITS:
        for vid in split_ids.get(split, []):
            path, exists = _video_path(video_dir, vid, found, preferred_ext)
            videos.append(VideoItem(vid, path, split))
            if not exists:
                missing.append(vid)
            for k, text in enumerate(captions[vid]):
                caps.append(CaptionItem(f"{vid}#{k}", vid, text, split))
    return Catalogue(name, videos, caps, annotation_files, missing, options)


def drop_uncaptioned(
    split_ids: dict[str, list[str]], captions: dict[str, list[str]], source: Path, warnings: list[str]
) -> None:
    for split, ids in split_ids.items():
        kept = [i for i in ids if captions.get(i)]
        if len(kept) != len(ids):
            lost = [i for i in ids if not captions.get(i)]
            warnings.append(
                f"{split}: dropped {len(lost)} of {len(ids)} listed videos that have no caption in {source.name} "
                f"(first: {', '.join(lost[:5])})"
            )
            split_ids[split] = kept


def holdout(ids: Sequence[str], val_size: int, seed: int, source: Path) -> tuple[list[str], list[str]]:
    """(train, val): ``val_size`` ids chosen by a seeded permutation of the sorted ids."""
    if val_size == 0:
        return list(ids), []
    if val_size < 0 or val_size >= len(ids):
        raise ConfigError(
            f"val_size must be in [0, {len(ids) - 1}] for the {len(ids)} training videos of {source}, got {val_size}; "
            f"set it with --option val_size=N (0: no validation split)"
        )
    ordered = sorted(ids)
    chosen = set(ordered[i] for i in np.random.default_rng(seed).permutation(len(ordered))[:val_size])
    return [i for i in ids if i not in chosen], [i for i in ordered if i in chosen]


def caption_lists(data: Any, path: Path) -> dict[str, list[str]]:
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: expected an object mapping video id -> list of captions")
    out: dict[str, list[str]] = {}
    for vid, caps in data.items():
        if isinstance(caps, dict) and "enCap" in caps:
            caps = caps["enCap"]
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            raise DatasetError(f"{path}: captions of {vid!r} are not a list of strings")
        out[str(vid)] = [c.strip() for c in caps]
    return out


def check_disjoint(split_ids: dict[str, list[str]], where: Path) -> None:
    seen: dict[str, str] = {}
    for split, ids in split_ids.items():
        for vid in ids:
            if vid in seen:
                raise DatasetError(f"{where}: video {vid!r} is listed in both {seen[vid]} and {split}")
            seen[vid] = split


def in_dir(folder: Path, name: str) -> Path:
    p = Path(name)
    return p if p.is_absolute() else folder / p


def hash_split(video_id: str, seed: int = 0) -> str:
    """Deterministic 80/10/10 train/val/test assignment from a hash of the id."""
    bucket = int.from_bytes(hashlib.sha1(f"{seed}:{video_id}".encode()).digest()[:8], "big") % 10
    return "train" if bucket < 8 else ("val" if bucket == 8 else "test")


def reject_unknown(name: str, unused: dict) -> None:
    if unused:
        raise ConfigError(f"dataset {name!r} has no option(s) {', '.join(sorted(unused))}")
