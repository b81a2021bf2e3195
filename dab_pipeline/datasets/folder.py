"""A user's own folder of videos, with a CSV or JSONL of captions or none (a library to search)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..core.errors import DatasetError
from .catalogue import (
    DATASETS,
    LISTED_SPLITS,
    SPLITS,
    UNCAPTIONED,
    VIDEO_EXTENSIONS,
    CaptionItem,
    Catalogue,
    VideoItem,
    hash_split,
    read_csv,
    reject_unknown,
)


@DATASETS.register("folder")
def load_folder(
    videos: Path | None,
    annotations: Path | None,
    seed: int = 0,
    **unused: Any,
) -> Catalogue:
    """A user's collection described by a CSV or JSONL file (one row per caption), or by none.

    Columns/keys: ``video`` (path relative to the videos folder), ``caption``
    (JSONL may give ``captions``, a list), optional ``split`` and ``video_id``
    (default: ``video`` without its suffix). Rows without a split are assigned
    train/val/test 80/10/10 by a hash of the video id (salted with ``seed``).
    A video whose rows give no caption (an empty ``caption``, a JSONL row without
    one), or every video file under ``videos`` when no annotations are given, is
    kept without captions: in its own split if a row names one, else in
    ``uncaptioned`` (:data:`UNCAPTIONED`), searchable and never trained on.
    """
    reject_unknown("folder", unused)
    warnings: list[str] = []
    if annotations is None and videos is not None:
        video_dir = _videos_folder(Path(videos).resolve())
        records, annotations = _listed_videos(video_dir, warnings), video_dir
    else:
        annotations = _annotation_file(annotations)
        video_dir = _videos_folder(Path(videos).resolve() if videos is not None else annotations.parent)
        records = _read_records(annotations)
    _refuse_outside(records, video_dir, annotations)
    order, rel_paths, splits, captions, rows = _group_by_video(records, annotations)
    hashed = [v for v in order if v not in splits and captions[v]]
    for vid in hashed:
        splits[vid] = hash_split(vid, seed)
    uncaptioned = [v for v in order if v not in splits]
    for vid in uncaptioned:
        splits[vid] = UNCAPTIONED
    _refuse_a_file_in_two_splits(order, rel_paths, splits, rows, set(hashed), video_dir, annotations)

    videos_out: list[VideoItem] = []
    caps: list[CaptionItem] = []
    missing: list[str] = []
    for split in LISTED_SPLITS:
        for vid in (v for v in order if splits[v] == split):
            path = (video_dir / rel_paths[vid]).resolve()
            videos_out.append(VideoItem(vid, path, split))
            if not path.is_file():
                missing.append(vid)
            caps.extend(CaptionItem(f"{vid}#{k}", vid, t, split) for k, t in enumerate(captions[vid]))
    options = {"seed": int(seed), "hashed_splits": len(hashed), "uncaptioned": len(uncaptioned), "warnings": warnings}
    files = [annotations] if annotations.is_file() else []
    return Catalogue("folder", videos_out, caps, files, missing, options)


def _videos_folder(video_dir: Path) -> Path:
    if not video_dir.is_dir():
        raise DatasetError(
            f"dataset 'folder': videos folder {video_dir} does not exist (expected a folder of video files)"
        )
    return video_dir


def _read_records(annotations: Path) -> list["_Record"]:
    suffix = annotations.suffix.lower()
    if suffix == ".csv":
        return _folder_csv(annotations)
    if suffix in (".jsonl", ".ndjson"):
        return _folder_jsonl(annotations)
    raise DatasetError(f"{annotations}: unsupported annotation format {suffix!r} (expected .csv or .jsonl)")


def _listed_videos(video_dir: Path, warnings: list[str]) -> list["_Record"]:
    """Every video file under ``video_dir`` (its subfolders too, symlinks not followed), without captions: a
    library to search with a run trained elsewhere. Hidden files and folders are skipped, and so is a link that
    leads out of the folder (one warning); a video's id is its path without the suffix, or with it where two
    files differ only in their suffix (``a.mp4``, ``a.mkv``)."""
    found: list[str] = []
    for root, dirs, files in os.walk(video_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and os.path.splitext(name)[1].lower() in VIDEO_EXTENSIONS:
                found.append(Path(root, name).relative_to(video_dir).as_posix())
    outside = [rel for rel in found if not (video_dir / rel).resolve().is_relative_to(video_dir)]
    if outside:
        warnings.append(f"{len(outside)} link(s) lead out of {video_dir} and are skipped, the first {outside[0]!r}")
    found = [rel for rel in found if rel not in outside]
    stems = [str(Path(rel).with_suffix("")) for rel in found]
    out: list[_Record] = [(rel, rel, rel if stems.count(stem) > 1 else "", "", []) for rel, stem in zip(found, stems)]
    if not out:
        raise DatasetError(
            f"dataset 'folder': no video files in {video_dir} (looked for {', '.join(VIDEO_EXTENSIONS)}); "
            "pass --annotations with a CSV or JSONL that lists them"
        )
    return out


def _annotation_file(annotations: Path | None) -> Path:
    """The annotations file given, or the one of the known names inside the folder given."""
    if annotations is None:
        raise DatasetError(
            "dataset 'folder': needs --videos (a folder of videos, every one searchable) or --annotations (a CSV or "
            "JSONL with video and caption)"
        )
    annotations = Path(annotations).resolve()
    if annotations.is_dir():
        candidates = [
            annotations / n for n in ("captions.csv", "captions.jsonl", "annotations.csv", "annotations.jsonl")
        ]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise DatasetError(
                f"missing annotation file in {annotations} (expected one of {', '.join(c.name for c in candidates)})"
            )
        return found[0]
    if not annotations.is_file():
        raise DatasetError(f"missing annotation file {annotations} (expected a CSV or JSONL with video and caption)")
    return annotations


def _group_by_video(
    records: list["_Record"], annotations: Path
) -> tuple[list[str], dict[str, str], dict[str, str], dict[str, list[str]], dict[str, str]]:
    """(video ids in first-seen order, their paths, the splits given, their captions, the row each was first
    listed on); conflicts named by row."""
    order: list[str] = []
    rel_paths: dict[str, str] = {}
    splits: dict[str, str] = {}
    captions: dict[str, list[str]] = {}
    rows: dict[str, str] = {}
    for where, rel, vid, split, texts in records:
        vid = vid or str(Path(rel).with_suffix("")).replace(os.sep, "/")
        if vid not in rel_paths:
            order.append(vid)
            rel_paths[vid] = rel
            captions[vid] = []
            rows[vid] = where
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
        raise DatasetError(f"{annotations}: no videos listed")
    return order, rel_paths, splits, captions, rows


def _refuse_a_file_in_two_splits(
    order: list[str],
    rel_paths: dict[str, str],
    splits: dict[str, str],
    rows: dict[str, str],
    hashed: set[str],
    video_dir: Path,
    annotations: Path,
) -> None:
    """One video file listed under two ids in two of train, val and test leaks between them (trained on and tested
    on: a test score that counts a training video): refused, naming both rows. Under two ids in one split it is
    only listed twice; an uncaptioned listing is searched, never trained or tested on."""
    first: dict[Path, str] = {}  # the file -> the first id that lists it in train, val or test
    for vid in order:
        if splits[vid] not in SPLITS:
            continue
        target = (video_dir / rel_paths[vid]).resolve()
        other = first.setdefault(target, vid)
        if splits[other] != splits[vid]:
            said = [f"{rows[v]} (id {v!r}, split {splits[v]}{' by hash' if v in hashed else ''})" for v in (other, vid)]
            raise DatasetError(
                f"{annotations}: {said[0]} and {said[1]} list the same file, {target.relative_to(video_dir)}: one "
                f"video in {splits[other]} and {splits[vid]} leaks between them; give it one id, or one split"
            )


_Record = tuple[str, str, str, str, list[str]]  # (where, video, video_id, split, captions)
_PLAIN_KEYS = {"video", "video_id", "split"}  # what a row of a video without captions holds


def _blank(caption: object) -> bool:
    return caption is None or (isinstance(caption, str) and not caption.strip())


def _refuse_outside(records: list[_Record], video_dir: Path, annotations: Path) -> None:
    """Every video path must resolve inside the videos folder: no ``..``, no absolute path, no symlink out of it."""
    for where, rel, *_ in records:
        target = (video_dir / rel).resolve()
        if Path(rel).is_absolute() or not target.is_relative_to(video_dir):
            raise DatasetError(
                f"{annotations}: {where}: video {rel!r} resolves to {target}, outside the videos "
                f"folder {video_dir}; video paths must stay inside it (relative, no '..', no symlink "
                "out of it)"
            )


def _folder_csv(path: Path) -> list[_Record]:
    rows = read_csv(path, ["video"])
    header = set(rows[0]) if rows else set()
    if rows and "caption" not in header and header - _PLAIN_KEYS:  # a caption column under another name?
        raise DatasetError(
            f"{path}: missing column(s) caption (found {', '.join(sorted(header))}; a list of videos without "
            f"captions has only {', '.join(sorted(_PLAIN_KEYS))})"
        )
    out: list[_Record] = []
    for line, row in enumerate(rows, start=2):
        where = f"line {line}"
        if not row.get("video"):
            raise DatasetError(f"{path}: {where}: empty 'video'")
        texts = [row["caption"]] if row.get("caption") else []  # none: a video to search, not to train on
        out.append((where, row["video"], row.get("video_id", ""), row.get("split", ""), texts))
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
            if not isinstance(texts, list) or not all(isinstance(t, str) and t.strip() for t in texts):
                raise DatasetError(f"{path}: {where}: 'captions' must be a list of non-empty strings")
        elif _blank(obj.get("caption")) and set(obj) - _PLAIN_KEYS - {"caption"}:
            raise DatasetError(
                f"{path}: {where}: missing 'caption' (a string) or 'captions' (a list); a video without captions "
                f"has only {', '.join(sorted(_PLAIN_KEYS))}, not {', '.join(sorted(set(obj) - _PLAIN_KEYS))}"
            )
        elif _blank(obj.get("caption")):
            texts = []  # a video to search, not to train on (as an empty CSV cell)
        elif isinstance(obj["caption"], str) and obj["caption"].strip():
            texts = [obj["caption"]]
        else:
            raise DatasetError(f"{path}: {where}: 'caption' must be a string (or 'captions' a list of strings)")
        out.append(
            (
                where,
                obj["video"],
                str(obj.get("video_id") or ""),
                str(obj.get("split") or ""),
                [t.strip() for t in texts],
            )
        )
    return out
