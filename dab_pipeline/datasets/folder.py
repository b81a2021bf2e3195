"""A user's own folder of videos with a CSV or JSONL of captions."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..core.errors import DatasetError
from .catalogue import DATASETS, SPLITS, CaptionItem, Catalogue, VideoItem, hash_split, read_csv, reject_unknown


@DATASETS.register("folder")
def load_folder(
    videos: Path | None,
    annotations: Path | None,
    seed: int = 0,
    **unused: Any,
) -> Catalogue:
    """A user's collection described by a CSV or JSONL file (one row per caption).

    Columns/keys: ``video`` (path relative to the videos folder), ``caption``
    (JSONL may give ``captions``, a list), optional ``split`` and ``video_id``
    (default: ``video`` without its suffix). Rows without a split are assigned
    train/val/test 80/10/10 by a hash of the video id (salted with ``seed``).
    """
    reject_unknown("folder", unused)
    annotations = _annotation_file(annotations)
    video_dir = Path(videos).resolve() if videos is not None else annotations.parent
    if not video_dir.is_dir():
        raise DatasetError(
            f"dataset 'folder': videos folder {video_dir} does not exist (expected a folder of video files)"
        )
    suffix = annotations.suffix.lower()
    if suffix == ".csv":
        records = _folder_csv(annotations)
    elif suffix in (".jsonl", ".ndjson"):
        records = _folder_jsonl(annotations)
    else:
        raise DatasetError(f"{annotations}: unsupported annotation format {suffix!r} (expected .csv or .jsonl)")
    _refuse_outside(records, video_dir, annotations)
    order, rel_paths, splits, captions = _group_by_video(records, annotations)
    hashed = [v for v in order if v not in splits]
    for vid in hashed:
        splits[vid] = hash_split(vid, seed)

    videos_out: list[VideoItem] = []
    caps: list[CaptionItem] = []
    missing: list[str] = []
    for split in SPLITS:
        for vid in (v for v in order if splits[v] == split):
            path = (video_dir / rel_paths[vid]).resolve()
            videos_out.append(VideoItem(vid, path, split))
            if not path.is_file():
                missing.append(vid)
            caps.extend(CaptionItem(f"{vid}#{k}", vid, t, split) for k, t in enumerate(captions[vid]))
    options = {"seed": int(seed), "hashed_splits": len(hashed), "warnings": []}
    return Catalogue("folder", videos_out, caps, [annotations], missing, options)


def _annotation_file(annotations: Path | None) -> Path:
    """The annotations file given, or the one of the known names inside the folder given."""
    if annotations is None:
        raise DatasetError("dataset 'folder': an annotations file is required (a CSV or JSONL with video and caption)")
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
) -> tuple[list[str], dict[str, str], dict[str, str], dict[str, list[str]]]:
    """(video ids in first-seen order, their paths, the splits given, their captions); conflicts named by row."""
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
    return order, rel_paths, splits, captions


_Record = tuple[str, str, str, str, list[str]]  # (where, video, video_id, split, captions)


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
    rows = read_csv(path, ["video", "caption"])
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
