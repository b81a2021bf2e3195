"""LSMDC (the 2016 challenge's files): one (clip, sentence) pair per row of 6 tab-separated fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..core.errors import DatasetError
from .catalogue import (
    DATASETS,
    SPLITS,
    Catalogue,
    available_splits,
    build_catalogue,
    check_disjoint,
    clean_text,
    drop_uncaptioned,
    find_video,
    in_dir,
    reject_unknown,
    require_file,
    resolve_dirs,
    scan_videos,
    split_named,
    wanted_splits,
)

LSMDC_FILES = {
    "train": "LSMDC16_annos_training.csv",
    "val": "LSMDC16_annos_val.csv",
    "test": "LSMDC16_challenge_1000_publictect.csv",  # sic: the file's name in the release
}


_ROW = "rows of 6 tab-separated fields: clip id, start/end aligned, start/end extracted, sentence"


@DATASETS.register("lsmdc")
def load_lsmdc(
    videos: Path | None,
    annotations: Path | None,
    train_file: str | None = None,
    val_file: str | None = None,
    test_file: str | None = None,
    skip: Iterable[str] | str | None = None,
    splits: Iterable[str] | str | None = None,
    **unused: Any,
) -> Catalogue:
    """LSMDC: LSMDC16_annos_training.csv / _val.csv and the 1000-clip public test, every row a (clip, sentence) pair.

    A clip named on several rows gets all their sentences (one caption each), in file order. ``skip`` lists
    clip ids to leave out (comma-separated), e.g. the clip X-Pool and T-MASS skip; none by default. The
    files have no header and are read as plain tab-separated lines (no CSV quoting: a sentence may hold a
    quote); a clip id in quotes loses them. Videos are ``<clip>.avi`` in the videos folder or in its
    ``<movie>/`` subfolder (``1012_Unbreakable_00.05.16.065-00.05.21.941`` -> ``1012_Unbreakable/``).
    Without the training or validation file that split is left out, with a warning.
    """
    reject_unknown("lsmdc", unused)
    wanted = wanted_splits(splits)
    video_dir, ann_dir, ann_file = resolve_dirs("lsmdc", videos, annotations)
    given = {"train": train_file, "val": val_file, "test": test_file}
    paths = {s: in_dir(ann_dir, given[s] or LSMDC_FILES[s]) for s in SPLITS}
    if ann_file is not None:
        paths[split_named(ann_file) or "test"] = ann_file
    skipped = _skip_list(skip)
    warnings: list[str] = []
    want = available_splits(wanted, paths, warnings)
    split_ids: dict[str, list[str]] = {}
    captions: dict[str, list[str]] = {}
    seen: set[str] = set()
    for split in want:
        split_ids[split] = _pairs(paths[split], captions, skipped, seen, warnings)
    check_disjoint(split_ids, ann_dir)
    drop_uncaptioned(split_ids, captions, ann_dir, warnings)
    absent = sorted(skipped - seen)
    if absent:
        warnings.append(f"skip: {len(absent)} clip(s) in none of the files read ({', '.join(absent[:5])})")
    options = {"splits": want, "skip": sorted(skipped), "files": {s: paths[s].name for s in want}, "warnings": warnings}
    found, movies = scan_videos(video_dir), {}  # type: ignore[var-annotated]
    locate = lambda clip: _clip_video(video_dir, clip, found, movies)  # noqa: E731
    files = [paths[s] for s in want]
    return build_catalogue("lsmdc", video_dir, split_ids, captions, ".avi", files, options, None, locate)


def _skip_list(skip: Iterable[str] | str | None) -> set[str]:
    if skip is None:
        return set()
    items = skip.split(",") if isinstance(skip, str) else list(skip)
    return {str(s).strip() for s in items if str(s).strip()}


def _clip_video(video_dir: Path, clip: str, found: dict, movies: dict) -> tuple[Path, bool]:
    """``<clip>.avi`` in the videos folder, else in its movie's subfolder (the layout of the LSMDC download)."""
    path, exists = find_video(video_dir, clip, found, ".avi")
    folder = video_dir / clip.rsplit("_", 1)[0]
    if exists or not folder.is_dir():
        return path, exists
    if folder.name not in movies:
        movies[folder.name] = scan_videos(folder)
    return find_video(folder, clip, movies[folder.name], ".avi")


def _pairs(
    path: Path, captions: dict[str, list[str]], skip: set[str], seen: set[str], warnings: list[str]
) -> list[str]:
    """The clip ids of one LSMDC file, in first-row order; their sentences appended to ``captions``."""
    require_file(path, f"an LSMDC annotation file, {_ROW}")
    try:
        lines = path.read_text(encoding="utf-8-sig").split("\n")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc})") from None
    ids: list[str] = []
    mine: set[str] = set()
    blank = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.rstrip("\r").split("\t")
        if len(fields) != 6:
            hint = " (a comma-separated file?)" if len(fields) == 1 and "," in line else ""
            raise DatasetError(f"{path}: line {number}: expected {_ROW}; found {len(fields)} field(s){hint}")
        clip, sentence = fields[0].strip().strip('"'), clean_text(fields[5])
        if not clip:
            raise DatasetError(f"{path}: line {number}: empty clip id")
        if clip in skip:
            seen.add(clip)
            continue
        if clip not in mine:
            mine.add(clip)
            ids.append(clip)
        if sentence:
            captions.setdefault(clip, []).append(sentence)
        else:
            blank += 1
    if blank:
        warnings.append(f"{path.name}: {blank} row(s) with an empty sentence left out")
    return ids
