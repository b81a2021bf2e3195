"""Charades: one query per video from its ``descriptions`` field; LF and CRLF files; blank descriptions."""

from __future__ import annotations

from pathlib import Path

import pytest

from dab_pipeline.core.errors import DatasetError
from dab_pipeline.datasets import load_dataset

from ..helpers.catalogues import check_invariants, counts, touch, write_csv

HEADER = ["id", "subject", "scene", "quality", "relevance", "verified", "script", "objects", "descriptions", "actions"]


def _row(vid: str, descriptions: str) -> list[str]:
    return [vid, "SUBJ", "Kitchen", "6", "7", "Yes", "A script.", "cup;dish", descriptions, "c001 0.0 3.0"]


TRAIN = [
    _row("TR001", "A person opens a door.  Then leaves.;Someone walks out."),
    _row("TR002", "{}"),  # no description at all: 16 such rows in the official file
    _row("TR003", "{};A person drinks coffee."),  # a blank among others
    _row("TR004", "A person sits down."),
]
TEST = [_row("TE001", "A person cooks.;A person stirs a pot.;{}"), _row("TE002", " A person reads a book. ")]


def _charades(ann: Path, newline: str = "\n") -> Path:
    ann.mkdir(parents=True, exist_ok=True)
    write_csv(ann / "Charades_v1_train.csv", HEADER, TRAIN, newline=newline)
    write_csv(ann / "Charades_v1_test.csv", HEADER, TEST, newline=newline)
    return ann


def test_charades_one_query_per_video_blank_descriptions_left_out(tmp_path: Path) -> None:
    videos = touch(tmp_path / "videos", "TE001.mp4", "TR001.mp4")
    cat = load_dataset("charades", videos, _charades(tmp_path / "ann"), val_size=1)
    check_invariants(cat)
    assert [len(cat.split_videos(s)) for s in ("train", "val", "test")] == [2, 1, 2]
    texts = {c.video_id: (c.text, c.parts) for c in cat.captions}
    assert texts["TE001"] == ("A person cooks. A person stirs a pot.", 2)
    assert texts["TE002"] == ("A person reads a book.", 1)
    assert texts["TR001"] == ("A person opens a door. Then leaves. Someone walks out.", 2)
    assert texts["TR003"] == ("A person drinks coffee.", 1)
    assert "TR002" not in texts and any("dropped 1 of 4" in w and "TR002" in w for w in cat.options["warnings"])
    assert sorted(cat.missing) == sorted(v.video_id for v in cat.videos if v.video_id not in ("TE001", "TR001"))
    assert next(v for v in cat.videos if v.video_id == "TE002").path == videos / "TE002.mp4"


def test_charades_crlf_reads_as_lf(tmp_path: Path) -> None:
    lf = load_dataset("charades", tmp_path, _charades(tmp_path / "lf"), val_size=1)
    crlf_dir = _charades(tmp_path / "crlf", newline="\r\n")
    assert b"\r\n" in (crlf_dir / "Charades_v1_train.csv").read_bytes()
    crlf = load_dataset("charades", tmp_path, crlf_dir, val_size=1)
    assert [(c.video_id, c.text, c.split) for c in crlf.captions] == [
        (c.video_id, c.text, c.split) for c in lf.captions
    ]
    assert counts(lf) == counts(crlf)


def test_charades_files_and_errors(tmp_path: Path) -> None:
    ann = _charades(tmp_path / "ann")
    (ann / "Charades_v1_train.csv").rename(ann / "my_train.csv")
    cat = load_dataset("charades", tmp_path, ann, train_file="my_train.csv", val_size=0)
    assert cat.options["files"] == {"test": "Charades_v1_test.csv", "train": "my_train.csv"}
    test_only = load_dataset("charades", tmp_path, ann)
    assert test_only.splits() == ["test"] and any(
        "Charades_v1_train.csv not found" in w for w in test_only.options["warnings"]
    )
    assert load_dataset("charades", tmp_path, ann / "Charades_v1_test.csv").splits() == ["test"]
    write_csv(ann / "Charades_v1_test.csv", ["id", "script"], [["A", "x"]])
    with pytest.raises(DatasetError, match=r"missing column\(s\) descriptions .*found id, script"):
        load_dataset("charades", tmp_path, ann)
    write_csv(ann / "Charades_v1_test.csv", HEADER, [TEST[0], TEST[0]])
    with pytest.raises(DatasetError, match="line 3: video 'TE001' has a second row"):
        load_dataset("charades", tmp_path, ann)
    with pytest.raises(DatasetError, match="Charades_v1_test.csv .*found in .*val_1.json"):
        load_dataset("charades", tmp_path, touch(tmp_path / "anet", "val_1.json"))


def test_charades_real_files(shared_data: Path, tmp_path: Path) -> None:
    src = shared_data / "charades"
    cat = load_dataset("charades", tmp_path, src, val_size=0)
    check_invariants(cat)
    # 4537 descriptions in the test file, 2 of them the blank '{}'
    assert counts(cat) == {"train": (7969, 7969, 11593 - 16 - 25), "test": (1863, 1863, 4535)}
    assert any("dropped 16 of 7985" in w for w in cat.options["warnings"])
    crlf = load_dataset("charades", tmp_path, src, train_file="Charades_v1_train.smpotdar_crlf.csv", val_size=0)
    assert [(c.video_id, c.text) for c in crlf.captions] == [(c.video_id, c.text) for c in cat.captions]
    held = load_dataset("charades", tmp_path, src)
    assert [len(held.split_videos(s)) for s in ("train", "val", "test")] == [7469, 500, 1863]
