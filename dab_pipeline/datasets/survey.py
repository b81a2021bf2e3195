"""What a catalogue holds, split by split, before anything is decoded: the counts `dab extract --dry-run` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .catalogue import LISTED_SPLITS, Catalogue, clean_text


@dataclass
class SplitSurvey:
    """One split's videos and queries, and what is wrong with them."""

    split: str
    videos: int
    queries: int  # what is encoded and searched for: a caption, or a paragraph of several
    captions: int  # the annotation captions behind the queries (a paragraph counts its sentences)
    missing: int  # listed videos with no file on disk
    first_missing: list[tuple[str, Path]] = field(default_factory=list)  # (video id, the path looked for)
    duplicates: int = 0  # queries whose text (case and spacing aside) an earlier query of the split has
    first_duplicates: list[str] = field(default_factory=list)
    empty: int = 0  # queries with no text
    first_empty: list[str] = field(default_factory=list)  # their caption ids


@dataclass
class DatasetSurvey:
    """A dataset as `dab extract` would read it: the files, the splits, the loader's warnings."""

    name: str
    annotation_files: list[Path]
    options: dict
    splits: list[SplitSurvey]
    limit: int | None = None

    @property
    def warnings(self) -> list[str]:
        return list(self.options.get("warnings", []) or [])

    def total(self, what: str) -> int:
        return sum(getattr(s, what) for s in self.splits)

    def problems(self) -> list[str]:
        """What stops the extraction from having everything it needs: missing videos, empty queries."""
        out = []
        if self.total("missing"):
            out.append(f"{self.total('missing')} of {self.total('videos')} listed videos are missing on disk")
        if self.total("empty"):
            empty = self.total("empty")
            out.append(f"{empty} {'query is' if empty == 1 else 'queries are'} empty")
        return out


def survey_catalogue(catalogue: Catalogue, limit: int | None = None, first: int = 5) -> DatasetSurvey:
    """Count ``catalogue`` per split (its first ``limit`` videos only, as `dab extract --limit` takes them);
    ``first``: how many names of each problem to keep."""
    videos = catalogue.videos if limit is None else catalogue.videos[:limit]
    kept = {v.video_id for v in videos}
    missing = set(catalogue.missing) & kept
    splits = []
    for split in LISTED_SPLITS:
        vids = [v for v in videos if v.split == split]
        if not vids:
            continue
        caps = [c for c in catalogue.captions if c.split == split and c.video_id in kept]
        absent = [(v.video_id, v.path) for v in vids if v.video_id in missing]
        seen: set[str] = set()
        dups, empty = [], []
        for c in caps:
            key = clean_text(c.text).casefold()
            if not key:
                empty.append(c.caption_id)
            elif key in seen:
                dups.append(c.text)
            seen.add(key)
        splits.append(
            SplitSurvey(
                split=split,
                videos=len(vids),
                queries=len(caps),
                captions=sum(c.parts for c in caps),
                missing=len(absent),
                first_missing=absent[:first],
                duplicates=len(dups),
                first_duplicates=dups[:first],
                empty=len(empty),
                first_empty=empty[:first],
            )
        )
    return DatasetSurvey(catalogue.name, list(catalogue.annotation_files), dict(catalogue.options), splits, limit)
