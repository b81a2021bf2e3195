"""Charades: one query per video, its ``descriptions`` joined (the retrieval protocol of CLIP4Clip-derived code)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..core.errors import DatasetError
from .catalogue import (
    DATASETS,
    Catalogue,
    build_catalogue,
    clean_text,
    in_dir,
    read_csv,
    read_train_test,
    reject_unknown,
    require_file,
    resolve_dirs,
    split_named,
    wanted_splits,
)

CHARADES_FILES = {"train": "Charades_v1_train.csv", "test": "Charades_v1_test.csv"}


# What a Charades annotator left blank shows as "{}" among the ';'-separated descriptions.
_BLANK = {"", "{}"}


@DATASETS.register("charades")
def load_charades(
    videos: Path | None,
    annotations: Path | None,
    train_file: str | None = None,
    test_file: str | None = None,
    val_size: int = 500,
    seed: int = 0,
    splits: Iterable[str] | str | None = None,
    **unused: Any,
) -> Catalogue:
    """Charades: Charades_v1_train.csv / Charades_v1_test.csv (7985 / 1863 videos), one query per video.

    The query is the video's ``descriptions`` field: its ';'-separated descriptions, the blank ones
    (``{}``) left out, joined by spaces. A video left with no description is dropped (a warning counts
    them: 16 of the official training file). Charades has no validation split: ``val_size`` training
    videos (a permutation of the sorted ids seeded by ``seed``) are held out as ``val``, as for MSR-VTT.
    Videos are ``<id>.mp4``; LF and CRLF files read the same.
    """
    reject_unknown("charades", unused)
    wanted = wanted_splits(splits)
    video_dir, ann_dir, ann_file = resolve_dirs("charades", videos, annotations)
    paths = {
        "train": in_dir(ann_dir, train_file or CHARADES_FILES["train"]),
        "test": in_dir(ann_dir, test_file or CHARADES_FILES["test"]),
    }
    if ann_file is not None:
        paths["test" if split_named(ann_file) == "test" else "train"] = ann_file
    warnings: list[str] = []
    split_ids, queries, parts, options = read_train_test(paths, wanted, _charades_queries, val_size, seed, warnings)
    files = [paths[s] for s in ("test", "train") if s in options["files"]]
    return build_catalogue("charades", video_dir, split_ids, queries, ".mp4", files, options, parts)


def _charades_queries(path: Path, queries: dict[str, list[str]], parts: dict[str, list[int]]) -> list[str]:
    """The video ids of one Charades CSV, in file order; each one's query (if it has a description) into ``queries``."""
    what = "a Charades CSV with header id,subject,scene,quality,relevance,verified,script,objects,descriptions,..."
    rows = read_csv(require_file(path, what), ["id", "descriptions"])
    ids: list[str] = []
    seen: set[str] = set()
    for line, row in enumerate(rows, start=2):
        vid = row["id"]
        if not vid:
            raise DatasetError(f"{path}: line {line}: empty id")
        if vid in seen:
            raise DatasetError(f"{path}: line {line}: video {vid!r} has a second row")
        seen.add(vid)
        ids.append(vid)
        kept = [clean_text(d) for d in row["descriptions"].split(";") if clean_text(d) not in _BLANK]
        queries[vid] = [" ".join(kept)] if kept else []
        parts[vid] = [len(kept)] if kept else []
    return ids
