"""A dataset's catalogue (its videos, captions and splits), the loader registry and the helpers every loader shares."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import inspect
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..core.errors import ConfigError, DatasetError
from ..core.registry import Registry

SPLITS = ("train", "val", "test")
# a folder's videos without a caption and without a split of their own: searchable (``--split all`` or this
# name), never trained or evaluated on
UNCAPTIONED = "uncaptioned"
LISTED_SPLITS = SPLITS + (UNCAPTIONED,)  # the splits a catalogue can hold, in the order they are listed


VIDEO_EXTENSIONS = (".mp4", ".webm", ".mkv", ".avi", ".mov", ".m4v")


@dataclass(frozen=True)
class VideoItem:
    video_id: str
    path: Path  # absolute path of the video file (may not exist)
    split: str  # "train" | "val" | "test"


# control characters (C0 and C1, DEL) other than the white space split() already handles
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class CaptionItem:
    caption_id: str  # unique within the dataset, "<video_id>#<k>"
    video_id: str
    text: str
    split: str
    parts: int = 1  # annotation captions joined into this query (a paragraph's sentences); 1: the caption itself


@dataclass
class Catalogue:
    """What a loader makes of a dataset: its videos and captions by split, and the files they came from."""

    name: str
    videos: list[VideoItem]  # unique ids, deterministic order
    captions: list[CaptionItem]  # every caption's video_id is in videos
    annotation_files: list[Path]  # hashed into the store manifest
    missing: list[str]  # video ids listed but not on disk
    options: dict  # loader options that shaped the catalogue

    def __post_init__(self) -> None:
        # a NUL or other control character in a caption (an HDF5 string cannot hold a NUL; none means anything in a
        # query) becomes a space, whichever loader read it, so that a dry run and the extraction see the same text
        dirty = [i for i, c in enumerate(self.captions) if _CONTROL.search(c.text)]
        for i in dirty:
            c = self.captions[i]
            self.captions[i] = dataclasses.replace(c, text=" ".join(_CONTROL.sub(" ", c.text).split()))
        if dirty:
            self.options.setdefault("warnings", []).append(
                f"{len(dirty)} captions held NUL or other control characters, replaced by spaces "
                f"(the first: {self.captions[dirty[0]].caption_id})"
            )

    def split_videos(self, split: str) -> list[VideoItem]:
        return [v for v in self.videos if v.split == split]

    def split_captions(self, split: str) -> list[CaptionItem]:
        return [c for c in self.captions if c.split == split]

    def splits(self) -> list[str]:
        """The splits that have at least one video, in train/val/test order."""
        present = {v.split for v in self.videos}
        return [s for s in SPLITS if s in present]


Loader = Callable[..., Catalogue]


Locate = Callable[[str], "tuple[Path, bool]"]  # video id -> (path of its file, whether it exists)


DATASETS: Registry[Loader] = Registry("dataset")


def load_dataset(name: str, videos: Path | None, annotations: Path | None, **options: Any) -> Catalogue:
    """The catalogue of dataset ``name`` (see :data:`DATASETS` for the names); a value of an int option that is
    not a whole number (``val_size=abc``) is a one-line ConfigError naming it."""
    loader = DATASETS.get(name)
    check_options(name, loader, options)
    cat = loader(
        Path(videos) if videos is not None else None, Path(annotations) if annotations is not None else None, **options
    )
    if not cat.videos:  # a 0-byte list, ActivityNet's `{}`: nothing to extract, and an empty store is no store
        read = ", ".join(str(p) for p in cat.annotation_files) or str(annotations or videos)
        raise DatasetError(f"dataset {name!r}: {read} lists no videos (an empty or cut annotation file?)")
    return cat


def check_options(name: str, loader: Callable[..., Any], options: dict[str, Any]) -> None:
    """A ``--option key=value`` for one of the loader's int parameters (``val_size``, ``seed``) must be a whole
    number: ``val_size=abc`` is one line, not a traceback from deep in the loader."""
    params = inspect.signature(loader).parameters
    for key, value in options.items():
        default = params[key].default if key in params else None
        whole = isinstance(value, int) and not isinstance(value, bool)
        if isinstance(default, int) and not isinstance(default, bool) and not whole:
            raise ConfigError(f"dataset {name!r}: option {key}={value!r}: expected a whole number (--option {key}=N)")


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
        raise DatasetError(f"missing annotation file {path} (expected {what}){found_in(path.parent)}")
    return path


def found_in(folder: Path, shown: int = 8) -> str:
    """``"; found in DIR: a.csv, b.json (+N more)"``: what a folder holds, for an error about a wrong layout."""
    try:
        names = sorted(e.name for e in os.scandir(folder) if not e.name.startswith("."))
    except OSError:
        return ""
    if not names:
        return f"; {folder} is empty"
    more = f" (+{len(names) - shown} more)" if len(names) > shown else ""
    return f"; found in {folder}: {', '.join(names[:shown])}{more}"


def clean_text(text: str) -> str:
    """A caption with its runs of white space made single spaces and its ends stripped."""
    return " ".join(text.split())


def split_named(path: Path) -> str | None:
    """The split a file's name names (``val_1.json`` -> val, ``didemo_test_label.csv`` -> test), or None."""
    words = path.stem.lower().replace("-", "_").replace(".", "_").split("_")
    for split, names in (("train", ("train", "training")), ("val", ("val", "validation")), ("test", ("test",))):
        if any(w in names for w in words):
            return split
    return None


def read_json(path: Path) -> Any:
    """A JSON annotation file (a UTF-8 byte-order mark allowed, as in CSV and TSV files)."""
    try:
        with open(path, encoding="utf-8-sig") as fh:
            return json.load(fh)
    except RecursionError:
        raise DatasetError(f"{path}: JSON nested too deeply to be an annotation file") from None
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


def scan_videos(video_dir: Path) -> dict[str, list[str]]:
    """stem -> file names in ``video_dir`` with a video suffix (one directory listing)."""
    found: dict[str, list[str]] = {}
    with os.scandir(video_dir) as it:
        for entry in it:
            stem, ext = os.path.splitext(entry.name)
            if ext.lower() in VIDEO_EXTENSIONS and entry.is_file():
                found.setdefault(stem, []).append(entry.name)
    return found


def find_video(video_dir: Path, video_id: str, found: dict[str, list[str]], preferred: str) -> tuple[Path, bool]:
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
    parts: dict[str, list[int]] | None = None,
    locate: Locate | None = None,
) -> Catalogue:
    """Assemble the catalogue from ordered ids per split and captions per id.

    ``parts``: per id, how many annotation captions each of its captions joins (a paragraph's sentences;
    default 1 each); ``locate``: the dataset's own way to find a video's file (default: ``<id><suffix>`` in
    ``video_dir``, ``preferred_ext`` first, then the other video suffixes)."""
    if locate is None:
        found = scan_videos(video_dir)
        locate = lambda vid: find_video(video_dir, vid, found, preferred_ext)  # noqa: E731
    videos: list[VideoItem] = []
    caps: list[CaptionItem] = []
    missing: list[str] = []
    for split in SPLITS:
        for vid in split_ids.get(split, []):
            path, exists = locate(vid)
            videos.append(VideoItem(vid, path, split))
            if not exists:
                missing.append(vid)
            counts = (parts or {}).get(vid) or [1] * len(captions[vid])
            for k, (text, n) in enumerate(zip(captions[vid], counts)):
                caps.append(CaptionItem(f"{vid}#{k}", vid, text, split, n))
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


def available_splits(wanted: tuple[str, ...] | None, paths: dict[str, Path], warnings: list[str]) -> list[str]:
    """The splits to load, in train/val/test order: those asked for in ``splits``, or else every split whose file
    is there. A split not asked for whose file is absent is left out with a warning (the test split never is:
    its absence is an error when the file is read)."""
    if wanted is not None:
        return [s for s in SPLITS if s in wanted]
    out = []
    for split in SPLITS:
        if split == "test" or paths[split].is_file():
            out.append(split)
        else:
            warnings.append(f"{paths[split].name} not found in {paths[split].parent}: no {split} split loaded")
    return out


def train_and_val(
    train_ids: list[str],
    want: Sequence[str],
    val_size: int,
    seed: int,
    source: Path,
    captions: dict[str, list[str]],
    test_ids: Sequence[str],
    warnings: list[str],
) -> dict[str, list[str]]:
    """The train (and held-out val) ids of a dataset whose only official splits are train and test.

    Ids without a caption are dropped (counted in ``warnings``); ``val_size`` of the rest become ``val``
    (:func:`holdout`) when ``want`` holds val; a training id that is also a test id is an error."""
    shared = set(train_ids) & set(test_ids)
    if shared:
        raise DatasetError(f"{source}: {len(shared)} training videos are also test videos (first: {sorted(shared)[0]})")
    only = {"train": list(train_ids)}
    drop_uncaptioned(only, captions, source, warnings)
    train, val = holdout(only["train"], int(val_size) if "val" in want else 0, int(seed), source)
    return {**({"train": train} if "train" in want else {}), **({"val": val} if val else {})}


def read_train_test(
    paths: dict[str, Path],
    wanted: tuple[str, ...] | None,
    reader: Callable[[Path, dict[str, list[str]], dict[str, list[int]]], list[str]],
    val_size: int,
    seed: int,
    warnings: list[str],
) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[int]], dict[str, Any]]:
    """A train file and a test file, ``val_size`` train videos held out as val (ActivityNet, Charades).

    ``reader(path, texts, parts)`` returns one file's video ids in file order and fills their queries and the
    number of captions joined into each.  Returns (split ids, queries, parts, the catalogue's options).
    """
    want = available_splits(wanted, {**paths, "val": paths["train"]}, warnings)
    split_ids: dict[str, list[str]] = {}
    texts: dict[str, list[str]] = {}
    parts: dict[str, list[int]] = {}
    read = [s for s in ("test", "train") if s in want or (s == "train" and "val" in want)]
    if "test" in want:
        split_ids["test"] = reader(paths["test"], texts, parts)
        drop_uncaptioned(split_ids, texts, paths["test"], warnings)
    if "train" in read:
        train_ids = reader(paths["train"], texts, parts)
        test_ids = split_ids.get("test", [])
        split_ids.update(train_and_val(train_ids, want, val_size, seed, paths["train"], texts, test_ids, warnings))
    options = {
        "val_size": int(val_size),
        "seed": int(seed),
        "splits": want,
        "files": {s: paths[s].name for s in read},
        "warnings": warnings,
    }
    return split_ids, texts, parts, options
