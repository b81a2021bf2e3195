"""ActivityNet Captions as video-paragraph retrieval: train.json to train, val_1.json as the test set."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..core.errors import DatasetError
from .catalogue import (
    DATASETS,
    Catalogue,
    build_catalogue,
    clean_text,
    find_video,
    in_dir,
    read_json,
    read_train_test,
    reject_unknown,
    require_file,
    resolve_dirs,
    scan_videos,
    split_named,
    wanted_splits,
)

# The training captions: the release's train.json, else a file of its format under the name PDVC ships.
ANET_TRAIN = ("train.json", "train_modified.json")


ANET_TEST = "val_1.json"


_FORMAT = '{"v_<youtube id>": {"duration", "timestamps", "sentences": [...]}, ...}'


@DATASETS.register("activitynet")
def load_activitynet(
    videos: Path | None,
    annotations: Path | None,
    train_file: str | None = None,
    test_file: str | None = None,
    val_size: int = 500,
    seed: int = 0,
    splits: Iterable[str] | str | None = None,
    **unused: Any,
) -> Catalogue:
    """ActivityNet Captions: train.json (10009 videos) and val_1.json (4917) as the test set.

    Each video is one query, the paragraph of its sentences (stripped, joined by spaces, in file order);
    the timestamps are not used (the whole video is the target). ``train_file`` / ``test_file`` name other
    files of the same format (e.g. ``val_2.json``). Without a training file only the test split is loaded,
    with a warning. ``val_size`` training videos are held out as ``val`` (seeded by ``seed``), as for
    MSR-VTT: val_1 is the test set and must not choose checkpoints. Ids are ``v_<youtube id>``; the video
    is ``v_<id>.mp4`` or ``<id>.mp4`` (another video suffix is accepted too).
    """
    reject_unknown("activitynet", unused)
    wanted = wanted_splits(splits)
    video_dir, ann_dir, ann_file = resolve_dirs("activitynet", videos, annotations)
    paths = {"train": _train_path(ann_dir, train_file), "test": in_dir(ann_dir, test_file or ANET_TEST)}
    if ann_file is not None:
        paths["train" if split_named(ann_file) == "train" else "test"] = ann_file
    warnings: list[str] = []
    split_ids, paragraphs, parts, options = read_train_test(paths, wanted, _paragraphs, val_size, seed, warnings)
    found = scan_videos(video_dir)
    files = [paths[s] for s in ("test", "train") if s in options["files"]]
    locate = lambda vid: _anet_video(video_dir, vid, found)  # noqa: E731
    return build_catalogue("activitynet", video_dir, split_ids, paragraphs, ".mp4", files, options, parts, locate)


def _train_path(ann_dir: Path, train_file: str | None) -> Path:
    if train_file:
        return in_dir(ann_dir, train_file)
    return next((ann_dir / n for n in ANET_TRAIN if (ann_dir / n).is_file()), ann_dir / ANET_TRAIN[0])


def _anet_video(video_dir: Path, vid: str, found: dict[str, list[str]]) -> tuple[Path, bool]:
    """``v_<id>.mp4`` (the name in the ActivityNet release), else ``<id>.mp4`` (a YouTube download's)."""
    path, exists = find_video(video_dir, vid, found, ".mp4")
    if not exists and vid.startswith("v_") and vid[2:] in found:
        return find_video(video_dir, vid[2:], found, ".mp4")
    return path, exists


def _paragraphs(path: Path, paragraphs: dict[str, list[str]], parts: dict[str, list[int]]) -> list[str]:
    """The video ids of one captions file, in file order; each one's paragraph into ``paragraphs``."""
    data = read_json(require_file(path, f"ActivityNet Captions, {_FORMAT}"))
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: expected {_FORMAT}; found a JSON {type(data).__name__}")
    for vid, item in data.items():
        sentences = item.get("sentences") if isinstance(item, dict) else None
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            found = sorted(item) if isinstance(item, dict) else type(item).__name__
            raise DatasetError(f"{path}: {vid!r}: expected an object with a list of strings 'sentences'; found {found}")
        kept = [clean_text(s) for s in sentences if clean_text(s)]
        paragraphs[vid] = [" ".join(kept)] if kept else []
        parts[vid] = [len(kept)] if kept else []
    return list(data)
