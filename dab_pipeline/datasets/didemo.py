"""DiDeMo as video-paragraph retrieval: LocalizingMoments' *_data.json with the retrieval lists, or T-MASS's CSVs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from ..core.errors import ConfigError, DatasetError
from .catalogue import (
    DATASETS,
    SPLITS,
    Catalogue,
    Locate,
    build_catalogue,
    check_disjoint,
    clean_text,
    drop_uncaptioned,
    find_video,
    found_in,
    read_csv,
    read_json,
    read_list,
    reject_unknown,
    require_file,
    resolve_dirs,
    scan_videos,
    split_named,
    wanted_splits,
)

DIDEMO_LAYOUTS = ("auto", "json", "csv")


def didemo_files(split: str) -> dict[str, str]:
    """The file names of one split: LocalizingMoments' data, the retrieval list, T-MASS's CSV."""
    return {"json": f"{split}_data.json", "list": f"{split}_list.txt", "csv": f"didemo_{split}_label.csv"}


@DATASETS.register("didemo")
def load_didemo(
    videos: Path | None,
    annotations: Path | None,
    layout: str = "auto",
    splits: Iterable[str] | str | None = None,
    **unused: Any,
) -> Catalogue:
    """DiDeMo: one query per video, the paragraph of all its descriptions (8392 / 1065 / 1004 videos).

    ``layout=json``: LocalizingMoments' ``{split}_data.json`` (a list of ``{video, description, times, ...}``)
    restricted to the retrieval list ``{split}_list.txt``, the descriptions joined in file order;
    ``layout=csv``: T-MASS's ``didemo_{split}_label.csv`` (``video_path``, ``text``: the paragraph), restricted
    to ``{split}_list.txt`` when there is one; ``auto`` (default): per split, the JSON when it is there,
    else the CSV (the options record which). A split with neither is left out with a warning (the test
    split is required). Ids are the video file names (16 suffixes, 193 a bare '.'); see :func:`didemo_locator`.
    """
    reject_unknown("didemo", unused)
    if layout not in DIDEMO_LAYOUTS:
        raise ConfigError(f"didemo layout must be one of {', '.join(DIDEMO_LAYOUTS)}, got {layout!r}")
    wanted = wanted_splits(splits)
    video_dir, ann_dir, ann_file = resolve_dirs("didemo", videos, annotations)
    sources = _sources(ann_dir, ann_file, layout)
    warnings: list[str] = []
    want = _present(wanted, sources, ann_dir, layout, warnings)
    split_ids: dict[str, list[str]] = {}
    paragraphs: dict[str, list[str]] = {}
    parts: dict[str, list[int]] = {}
    files: list[Path] = []
    for split in want:
        split_ids[split], read = _read_split(split, sources[split], ann_dir, paragraphs, parts, warnings)
        files += read
    check_disjoint(split_ids, ann_dir)
    kinds = {"json" if sources[s].suffix.lower() == ".json" else "csv" for s in want}
    if len(kinds) > 1:
        warnings.append("mixed layouts: " + ", ".join(f"{s} from {sources[s].name}" for s in want))
    options = {"layout": layout, "splits": want, "files": {s: sources[s].name for s in want}, "warnings": warnings}
    locate = didemo_locator(video_dir)
    return build_catalogue("didemo", video_dir, split_ids, paragraphs, "", files, options, parts, locate)


def _read_split(
    split: str,
    src: Path,
    ann_dir: Path,
    paragraphs: dict[str, list[str]],
    parts: dict[str, list[int]],
    warnings: list[str],
) -> tuple[list[str], list[Path]]:
    """(the split's ids that have a paragraph, the files read) from its JSON and list, or its CSV."""
    listed = ann_dir / didemo_files(split)["list"]
    if src.suffix.lower() == ".json":
        ids = _from_json(src, require_file(listed, _LIST), paragraphs, parts, warnings)
    else:
        ids = _from_csv(src, listed if listed.is_file() else None, paragraphs, parts, warnings)
    one = {split: ids}
    drop_uncaptioned(one, paragraphs, src, warnings)
    return one[split], [src] + ([listed] if listed.is_file() else [])


_LIST = "the retrieval split's video file names, one per line (the data file covers more videos than it keeps)"


def _sources(ann_dir: Path, ann_file: Path | None, layout: str) -> dict[str, Path | None]:
    """Per split, the annotation file the layout reads (None: not there); a single file given replaces its own."""
    kinds = ("json", "csv") if layout == "auto" else (layout,)
    out: dict[str, Path | None] = {}
    for split in SPLITS:
        names = didemo_files(split)
        out[split] = next((ann_dir / names[k] for k in kinds if (ann_dir / names[k]).is_file()), None)
    if ann_file is not None:
        split = split_named(ann_file)
        if split is None or ann_file.suffix.lower() not in (".json", ".csv"):
            raise DatasetError(
                f"{ann_file}: not a DiDeMo annotation file (expected a name like test_data.json or "
                "didemo_test_label.csv, or the annotation folder)"
            )
        out[split] = ann_file
    return out


def _present(
    wanted: tuple[str, ...] | None, sources: dict[str, Path | None], ann_dir: Path, layout: str, warnings: list[str]
) -> list[str]:
    """The splits to read: those asked for, or every one with a file (the test split must have one)."""
    kinds = ("json", "csv") if layout == "auto" else (layout,)
    out = []
    for split in SPLITS:
        if wanted is not None and split not in wanted:
            continue
        if sources[split] is not None:
            out.append(split)
            continue
        expected = " or ".join(f"{didemo_files(split)[k]}{_KIND[k]}" for k in kinds)
        if wanted is not None or split == "test":
            raise DatasetError(f"dataset 'didemo': no {split} annotations (expected {expected}){found_in(ann_dir)}")
        warnings.append(f"{split}: no {expected} in {ann_dir}: no {split} split loaded")
    return out


_KIND = {"json": " with its list (LocalizingMoments)", "csv": " (T-MASS)"}


def _from_json(
    path: Path, listed: Path, paragraphs: dict[str, list[str]], parts: dict[str, list[int]], warnings: list[str]
) -> list[str]:
    """The listed ids of one split (list order); their descriptions, in the data file's order, joined."""
    data = read_json(path)
    if not isinstance(data, list):
        raise DatasetError(
            f"{path}: expected LocalizingMoments' list of {{video, description, times, ...}}; found a JSON "
            f"{type(data).__name__}"
        )
    described: dict[str, list[str]] = {}
    nulls = 0
    for pos, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("video"), str) or "description" not in item:
            found = sorted(item) if isinstance(item, dict) else type(item).__name__
            raise DatasetError(f"{path}: entry {pos}: expected keys video and description; found {found}")
        raw = item["description"]
        if raw is None:  # a moment without a description: nothing to join (str() would make it the word "None")
            nulls += 1
            raw = ""
        if not isinstance(raw, str):
            raise DatasetError(
                f"{path}: entry {pos} ({item['video']}): expected a text description; found a JSON "
                f"{type(raw).__name__} ({str(raw)[:40]})"
            )
        text = clean_text(raw)
        described.setdefault(item["video"], [])
        if text:
            described[item["video"]].append(text)
    if nulls:
        warnings.append(f"{path.name}: {nulls} moments have a null description: left out of their paragraphs")
    ids = read_list(listed)
    keep = set(ids)
    left = [v for v in described if v not in keep]
    if left:
        warnings.append(f"{path.name}: {len(left)} of its {len(described)} videos are not in {listed.name}: left out")
    for vid in ids:
        texts = described.get(vid, [])
        paragraphs[vid], parts[vid] = ([" ".join(texts)], [len(texts)]) if texts else ([], [])
    return ids


def _from_csv(
    path: Path,
    listed: Path | None,
    paragraphs: dict[str, list[str]],
    parts: dict[str, list[int]],
    warnings: list[str],
) -> list[str]:
    """The ids of one T-MASS CSV (the list's, in its order, when there is one); the paragraph of each."""
    rows = read_csv(path, ["video_path", "text"])
    order: list[str] = []
    seen: set[str] = set()
    for line, row in enumerate(rows, start=2):
        vid = row["video_path"].replace("\\", "/").rsplit("/", 1)[-1]
        if not vid:
            raise DatasetError(f"{path}: line {line}: empty video_path")
        if vid in seen:
            raise DatasetError(f"{path}: line {line}: video {vid!r} has a second row")
        seen.add(vid)
        text = clean_text(row["text"])
        paragraphs[vid], parts[vid] = ([text], [1]) if text else ([], [])
        order.append(vid)
    if listed is None:
        return order
    ids = read_list(listed)
    keep = set(ids)
    left = [v for v in order if v not in keep]
    if left:
        warnings.append(f"{path.name}: {len(left)} of its {len(order)} videos are not in {listed.name}: left out")
    return ids


def didemo_locator(video_dir: Path) -> Locate:
    """Find a DiDeMo video as it is on disk; its id is the Flickr file name (``X.mov``, ``X.3gp``, ``X.``...).

    Tried in turn: the name itself; without a trailing '.' (``X.`` saved as ``X``); the name in another case;
    the name with a video suffix added (``X.mov.mp4``); the name's suffix replaced by a video suffix
    (``X.mp4``, ``X.webm``...: a re-encoded copy). A video found nowhere is ``<videos>/<id>``, missing.
    """
    names = {e.name for e in os.scandir(video_dir) if e.is_file()}
    lower = {n.lower(): n for n in names}
    found = scan_videos(video_dir)

    def locate(vid: str) -> tuple[Path, bool]:
        for name in (vid, vid.rstrip("."), lower.get(vid.lower())):
            if name and name in names:
                return video_dir / name, True
        for stem in (vid, os.path.splitext(vid)[0]):
            if stem in found:
                return find_video(video_dir, stem, found, ".mp4")
        return video_dir / vid, False

    return locate
