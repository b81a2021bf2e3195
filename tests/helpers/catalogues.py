"""What the dataset tests check of every catalogue, and the small files they write."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from dab_pipeline.datasets import Catalogue


def check_invariants(cat: Catalogue) -> None:
    """Unique ids, captions on listed videos of their own split, absolute paths, JSON-able options."""
    ids = [v.video_id for v in cat.videos]
    assert len(ids) == len(set(ids))
    split_of = {v.video_id: v.split for v in cat.videos}
    assert all(c.video_id in split_of and c.split == split_of[c.video_id] for c in cat.captions)
    assert len({c.caption_id for c in cat.captions}) == len(cat.captions)
    assert all(c.text and c.text == " ".join(c.text.split()) and c.parts >= 1 for c in cat.captions)
    assert set(cat.missing) <= set(ids)
    assert all(v.path.is_absolute() for v in cat.videos)
    json.dumps(cat.options)  # recorded in the store manifest


def counts(cat: Catalogue) -> dict[str, tuple[int, int, int]]:
    """split -> (videos, queries, captions behind the queries), for the splits present."""
    return {
        s: (len(cat.split_videos(s)), len(cat.split_captions(s)), sum(c.parts for c in cat.split_captions(s)))
        for s in cat.splits()
    }


def write_csv(path: Path, header: list[str], rows: list[list[str]], newline: str = "\n") -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator=newline)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def touch(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")
    return folder
