"""Dataset loaders: benchmark annotation files (or a user's own CSV/JSONL) -> DatasetIndex.

Every loader has the signature ``loader(videos, annotations, **options)``:

* ``videos``: the folder holding the video files (``None``: the annotation folder);
* ``annotations``: a folder where the loader finds its standard files by name,
  or a single file (for the benchmarks, that file replaces the standard file of
  its kind and its folder supplies the others);
* ``options``: loader-specific settings; the index records the ones that shaped
  it (plus ``warnings``, a list of messages about dropped ids) in ``options``.

Videos listed by the annotations but absent on disk are not an error: their ids
are collected in ``DatasetIndex.missing`` for the extract stage to report.
See docs/datasets.md for the formats and split rules.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .errors import ConfigError, DatasetError
from .registry import Registry

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
class DatasetIndex:
    name: str
    videos: list[VideoItem]  # unique ids, deterministic order
    captions: list[CaptionItem]  # every caption's video_id is in videos
    annotation_files: list[Path]  # hashed into the store manifest
    missing: list[str]  # video ids listed but not on disk
    options: dict  # loader options that shaped the index

    def split_videos(self, split: str) -> list[VideoItem]:
        return [v for v in self.videos if v.split == split]

    def split_captions(self, split: str) -> list[CaptionItem]:
        return [c for c in self.captions if c.split == split]

    def splits(self) -> list[str]:
        """The splits that have at least one video, in train/val/test order."""
        present = {v.split for v in self.videos}
        return [s for s in SPLITS if s in present]


Loader = Callable[..., DatasetIndex]
DATASETS: Registry[Loader] = Registry("dataset")


def load_dataset(name: str, videos: Path | None, annotations: Path | None, **options: Any) -> DatasetIndex:
    """Build the index of dataset ``name`` (see :data:`DATASETS` for the names)."""
    loader = DATASETS.get(name)
    return loader(Path(videos) if videos is not None else None, Path(annotations) if annotations is not None else None, **options)


# ----------------------------------------------------------------------------
# Shared helpers


def _resolve_dirs(name: str, videos: Path | None, annotations: Path | None) -> tuple[Path, Path, Path | None]:
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
            raise DatasetError(f"dataset {name!r}: annotations path {annotations} does not exist (expected a folder or a file)")
    video_dir = Path(videos).resolve() if videos is not None else ann_dir
    if not video_dir.is_dir():
        raise DatasetError(f"dataset {name!r}: videos folder {video_dir} does not exist (expected a folder of video files)")
    return video_dir, ann_dir, ann_file


def _require(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DatasetError(f"missing annotation file {path} (expected {what})")
    return path


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc})") from None


def _read_list(path: Path) -> list[str]:
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


def _read_csv(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
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


def _wanted_splits(splits: Iterable[str] | str | None) -> tuple[str, ...] | None:
    if splits is None:
        return None
    if isinstance(splits, str):
        splits = [s for s in splits.replace(",", " ").split() if s]
    out = tuple(splits)
    bad = [s for s in out if s not in SPLITS]
    if bad:
        raise ConfigError(f"unknown split(s) {', '.join(map(repr, bad))}; valid: {', '.join(SPLITS)}")
    return out


def _build(
    name: str,
    video_dir: Path,
    split_ids: dict[str, list[str]],
    captions: dict[str, list[str]],
    preferred_ext: str,
    annotation_files: list[Path],
    options: dict,
) -> DatasetIndex:
    """Assemble the index from ordered ids per split and captions per id."""
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
    return DatasetIndex(name, videos, caps, annotation_files, missing, options)


def _drop_uncaptioned(split_ids: dict[str, list[str]], captions: dict[str, list[str]], source: Path, warnings: list[str]) -> None:
    for split, ids in split_ids.items():
        kept = [i for i in ids if captions.get(i)]
        if len(kept) != len(ids):
            lost = [i for i in ids if not captions.get(i)]
            warnings.append(
                f"{split}: dropped {len(lost)} of {len(ids)} listed videos that have no caption in {source.name} "
                f"(first: {', '.join(lost[:5])})"
            )
            split_ids[split] = kept


def _holdout(ids: Sequence[str], val_size: int, seed: int, source: Path) -> tuple[list[str], list[str]]:
    """(train, val): ``val_size`` ids chosen by a seeded permutation of the sorted ids."""
    if val_size == 0:
        return list(ids), []
    if val_size < 0 or val_size >= len(ids):
        raise ConfigError(
            f"val_size must be in [0, {len(ids) - 1}] for the {len(ids)} training videos of {source}, got {val_size}; "
            f"set it with --option val_size=N (0: no validation split)")
    ordered = sorted(ids)
    chosen = set(ordered[i] for i in np.random.default_rng(seed).permutation(len(ordered))[:val_size])
    return [i for i in ids if i not in chosen], [i for i in ordered if i in chosen]


# ----------------------------------------------------------------------------
# MSR-VTT (1K-A)

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
) -> DatasetIndex:
    """MSR-VTT 1K-A: test = the 1000 JSFusion pairs, train = 9k/7k ids with all their captions.

    1K-A has no validation split; ``val_size`` training videos (a permutation of
    the sorted ids seeded by ``seed``) are held out as "val" so that model
    selection never looks at test. Without MSRVTT_data.json only the test split
    is loaded (with a warning) unless train/val were asked for in ``splits``.
    """
    _reject_unknown("msrvtt", unused)
    if train_split not in MSRVTT_TRAIN:
        raise ConfigError(f"msrvtt train_split must be one of {', '.join(MSRVTT_TRAIN)}, got {train_split!r}")
    wanted = _wanted_splits(splits)
    video_dir, ann_dir, ann_file = _resolve_dirs("msrvtt", videos, annotations)
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
        rows = _read_csv(_require(test_path, "the 1K-A test pairs, columns key,vid_key,video_id,sentence"), ["video_id", "sentence"])
        ids: list[str] = []
        for row in rows:
            vid = row["video_id"]
            if not vid:
                raise DatasetError(f"{test_path}: a row has an empty video_id")
            if vid not in captions:
                ids.append(vid)
                captions[vid] = []
            captions[vid].append(row["sentence"])
        split_ids["test"] = ids
        files.append(test_path)

    if want & {"train", "val"}:
        train_rows = _read_csv(_require(train_path, f"the {train_split} training ids, header video_id"), ["video_id"])
        train_ids = [r["video_id"] for r in train_rows if r["video_id"]]
        if len(set(train_ids)) != len(train_ids):
            raise DatasetError(f"{train_path}: duplicate video ids")
        data = _read_json(_require(data_path, 'the MSR-VTT captions, {"sentences": [{"video_id", "caption", "sen_id"}, ...]}'))
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
        overlap = train_set & set(split_ids.get("test", []))
        if overlap:
            raise DatasetError(f"{train_path}: {len(overlap)} training ids are also test ids (first: {sorted(overlap)[0]})")
        train_only = {"train": train_ids}
        _drop_uncaptioned(train_only, captions, data_path, warnings)
        train_ids = train_only["train"]
        val_n = int(val_size) if "val" in want else 0
        train_ids, val_ids = _holdout(train_ids, val_n, seed, train_path)
        if "train" in want:
            split_ids["train"] = train_ids
        if val_ids:
            split_ids["val"] = val_ids
        files += [train_path, data_path]

    options = {"train_split": train_split, "val_size": int(val_size), "seed": int(seed), "splits": sorted(want, key=SPLITS.index), "warnings": warnings}
    return _build("msrvtt", video_dir, split_ids, captions, ".mp4", files, options)


# ----------------------------------------------------------------------------
# MSVD


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


def _caption_lists(data: Any, path: Path) -> dict[str, list[str]]:
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


def _check_disjoint(split_ids: dict[str, list[str]], where: Path) -> None:
    seen: dict[str, str] = {}
    for split, ids in split_ids.items():
        for vid in ids:
            if vid in seen:
                raise DatasetError(f"{where}: video {vid!r} is listed in both {seen[vid]} and {split}")
            seen[vid] = split


# ----------------------------------------------------------------------------
# VATEX

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
) -> DatasetIndex:
    """VATEX: English captions + split lists (25991/1500/1500 by default).

    Captions come from vatex_data.json ({id: {"enCap": [...]}}) when present,
    else from the official release files (JSON lists of {"videoID", "enCap"}).
    Listed ids without captions are dropped and counted in options["warnings"].
    A val id that is also in the chosen test list is dropped from val.
    """
    _reject_unknown("vatex", unused)
    wanted = _wanted_splits(splits) or SPLITS
    video_dir, ann_dir, ann_file = _resolve_dirs("vatex", videos, annotations)
    list_names = {"train": train_list or "train_list.txt", "val": val_list or "val_list.txt", "test": test_list or "test_list.txt"}

    if ann_file is not None and ann_file.suffix.lower() == ".json":
        cap_files = [ann_file]
    elif (ann_dir / VATEX_VARIANT).is_file():
        cap_files = [ann_dir / VATEX_VARIANT]
    else:
        cap_files = [ann_dir / f for f in VATEX_OFFICIAL if (ann_dir / f).is_file()]
        if not cap_files:
            raise DatasetError(
                f"missing VATEX captions in {ann_dir} (expected {VATEX_VARIANT} or {VATEX_OFFICIAL[0]} / {VATEX_OFFICIAL[1]})"
            )
    captions: dict[str, list[str]] = {}
    for path in cap_files:
        captions.update(_vatex_captions(_read_json(path), path))

    split_files = {s: _require(_in_dir(ann_dir, list_names[s]), f"the VATEX {s} ids, one per line") for s in wanted}
    split_ids = {s: _read_list(p) for s, p in split_files.items()}
    warnings: list[str] = []
    if "val" in split_ids and "test" in split_ids:
        test_set = set(split_ids["test"])
        shared = [i for i in split_ids["val"] if i in test_set]
        if shared:
            # Selecting on videos that are also tested on would leak test into model selection.
            warnings.append(f"val: dropped {len(shared)} ids that are also in the test list {split_files['test'].name}")
            split_ids["val"] = [i for i in split_ids["val"] if i not in test_set]
    _check_disjoint(split_ids, ann_dir)
    source = cap_files[0] if len(cap_files) == 1 else ann_dir
    _drop_uncaptioned(split_ids, captions, source, warnings)
    options = {"splits": list(wanted), "lists": {s: split_files[s].name for s in wanted}, "warnings": warnings}
    return _build("vatex", video_dir, split_ids, captions, ".mp4", cap_files + list(split_files.values()), options)


def _in_dir(folder: Path, name: str) -> Path:
    p = Path(name)
    return p if p.is_absolute() else folder / p


def _vatex_captions(data: Any, path: Path) -> dict[str, list[str]]:
    if isinstance(data, dict):
        return _caption_lists(data, path)
    if not isinstance(data, list):
        raise DatasetError(f'{path}: expected a list of {{"videoID", "enCap"}} objects or an {{id: {{"enCap": [...]}}}} map')
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


# ----------------------------------------------------------------------------
# A user's own folder


@DATASETS.register("folder")
def load_folder(
    videos: Path | None,
    annotations: Path | None,
    seed: int = 0,
    **unused: Any,
) -> DatasetIndex:
    """A user's collection described by a CSV or JSONL file (one row per caption).

    Columns/keys: ``video`` (path relative to the videos folder), ``caption``
    (JSONL may give ``captions``, a list), optional ``split`` and ``video_id``
    (default: ``video`` without its suffix). Rows without a split are assigned
    train/val/test 80/10/10 by a hash of the video id (salted with ``seed``).
    """
    _reject_unknown("folder", unused)
    if annotations is None:
        raise DatasetError("dataset 'folder': an annotations file is required (a CSV or JSONL with video and caption)")
    annotations = Path(annotations).resolve()
    if annotations.is_dir():
        candidates = [annotations / n for n in ("captions.csv", "captions.jsonl", "annotations.csv", "annotations.jsonl")]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise DatasetError(f"missing annotation file in {annotations} (expected one of {', '.join(c.name for c in candidates)})")
        annotations = found[0]
    elif not annotations.is_file():
        raise DatasetError(f"missing annotation file {annotations} (expected a CSV or JSONL with video and caption)")
    video_dir = Path(videos).resolve() if videos is not None else annotations.parent
    if not video_dir.is_dir():
        raise DatasetError(f"dataset 'folder': videos folder {video_dir} does not exist (expected a folder of video files)")

    suffix = annotations.suffix.lower()
    if suffix == ".csv":
        records = _folder_csv(annotations)
    elif suffix in (".jsonl", ".ndjson"):
        records = _folder_jsonl(annotations)
    else:
        raise DatasetError(f"{annotations}: unsupported annotation format {suffix!r} (expected .csv or .jsonl)")

    order: list[str] = []
    rel_paths: dict[str, str] = {}
    splits: dict[str, str] = {}
    captions: dict[str, list[str]] = {}
    for where, rel, vid, split, texts in records:
        vid = vid or str(Path(rel).with_suffix("")).replace(os.sep, "/")
        if vid not in rel_paths:
            order.append(vid)
            rel_paths[vid] = rel
            captions[vid] = []
        elif rel_paths[vid] != rel:
            raise DatasetError(f"{annotations}: {where}: video id {vid!r} points to {rel!r} and to {rel_paths[vid]!r}")
        if split:
            if split not in SPLITS:
                raise DatasetError(f"{annotations}: {where}: split {split!r} is not one of {', '.join(SPLITS)}")
            if splits.get(vid, split) != split:
                raise DatasetError(f"{annotations}: {where}: video {vid!r} is in split {splits[vid]!r} and {split!r}")
            splits[vid] = split
        captions[vid].extend(texts)
    if not order:
        raise DatasetError(f"{annotations}: no captions found")
    hashed = [v for v in order if v not in splits]
    for vid in hashed:
        splits[vid] = hash_split(vid, seed)

    videos_out: list[VideoItem] = []
    caps: list[CaptionItem] = []
    missing: list[str] = []
    for split in SPLITS:
        for vid in order:
            if splits[vid] != split:
                continue
            path = (video_dir / rel_paths[vid]).resolve()
            videos_out.append(VideoItem(vid, path, split))
            if not path.is_file():
                missing.append(vid)
            caps.extend(CaptionItem(f"{vid}#{k}", vid, t, split) for k, t in enumerate(captions[vid]))
    options = {"seed": int(seed), "hashed_splits": len(hashed), "warnings": []}
    return DatasetIndex("folder", videos_out, caps, [annotations], missing, options)


def hash_split(video_id: str, seed: int = 0) -> str:
    """Deterministic 80/10/10 train/val/test assignment from a hash of the id."""
    bucket = int.from_bytes(hashlib.sha1(f"{seed}:{video_id}".encode()).digest()[:8], "big") % 10
    return "train" if bucket < 8 else ("val" if bucket == 8 else "test")


_Record = tuple[str, str, str, str, list[str]]  # (where, video, video_id, split, captions)


def _folder_csv(path: Path) -> list[_Record]:
    rows = _read_csv(path, ["video", "caption"])
    out: list[_Record] = []
    for line, row in enumerate(rows, start=2):
        where = f"line {line}"
        if not row.get("video"):
            raise DatasetError(f"{path}: {where}: empty 'video'")
        if not row.get("caption"):
            raise DatasetError(f"{path}: {where}: empty 'caption'")
        out.append((where, row["video"], row.get("video_id", ""), row.get("split", ""), [row["caption"]]))
    return out


def _folder_jsonl(path: Path) -> list[_Record]:
    out: list[_Record] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}: {where}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("video"), str) or not obj["video"]:
            raise DatasetError(f"{path}: {where}: expected an object with a 'video' path")
        if "captions" in obj:
            texts = obj["captions"]
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
                raise DatasetError(f"{path}: {where}: 'captions' must be a non-empty list of strings")
        elif isinstance(obj.get("caption"), str) and obj["caption"].strip():
            texts = [obj["caption"]]
        else:
            raise DatasetError(f"{path}: {where}: missing 'caption' (a string) or 'captions' (a list)")
        out.append((where, obj["video"], str(obj.get("video_id") or ""), str(obj.get("split") or ""), [t.strip() for t in texts]))
    return out


def _reject_unknown(name: str, unused: dict) -> None:
    if unused:
        raise ConfigError(f"dataset {name!r} has no option(s) {', '.join(sorted(unused))}")
