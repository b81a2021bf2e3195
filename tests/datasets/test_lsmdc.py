"""LSMDC on generated files of the 2016 challenge's format (the real ones need MPII's permission)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dab_pipeline.core.errors import DatasetError
from dab_pipeline.datasets import LSMDC_FILES, load_dataset

from ..helpers.catalogues import check_invariants, counts, touch

SKIPPED = "1012_Unbreakable_00.05.16.065-00.05.21.941"  # the clip X-Pool and T-MASS leave out


def _clip(movie: str, k: int) -> str:
    return f"{movie}_00.{k // 60:02d}.{k % 60:02d}.100-00.{k // 60:02d}.{k % 60:02d}.900"


def _line(clip: str, sentence: str) -> str:
    return "\t".join([clip, "00.00.01.000", "00.00.02.000", "00.00.01.000", "00.00.02.000", sentence])


def _write(path: Path, lines: list[str], newline: str = "\n") -> None:
    path.write_bytes((newline.join(lines) + newline).encode())


def _lsmdc(ann: Path) -> Path:
    """Training clips named on several rows, a quoted id, quotes and CRLF in sentences; a 1000-clip test file."""
    ann.mkdir(parents=True, exist_ok=True)
    train = [_line(_clip("0001_American_Beauty", k % 5), f"SOMEONE does thing {k}.") for k in range(8)]
    train.append(_line('"' + _clip("0001_American_Beauty", 9), 'He says "hello" and leaves.'))
    _write(ann / LSMDC_FILES["train"], train, newline="\r\n")
    _write(ann / LSMDC_FILES["val"], [_line(_clip("0002_As_Good_As_It_Gets", k), f"val {k}") for k in range(3)])
    test = [_line(_clip("1012_Unbreakable", k), f"test sentence {k}") for k in range(999)]
    test.insert(316, _line(SKIPPED, "SOMEONE looks at the train."))
    _write(ann / LSMDC_FILES["test"], test)
    return ann


def test_lsmdc_one_pair_per_row_and_the_1000_clip_test(tmp_path: Path) -> None:
    cat = load_dataset("lsmdc", tmp_path, _lsmdc(tmp_path / "ann"))
    check_invariants(cat)
    assert counts(cat) == {"train": (6, 9, 9), "val": (3, 3, 3), "test": (1000, 1000, 1000)}
    first = [c.text for c in cat.captions if c.video_id == _clip("0001_American_Beauty", 0)]
    assert first == ["SOMEONE does thing 0.", "SOMEONE does thing 5."]  # a clip on two rows: both pairs, in order
    quoted = _clip("0001_American_Beauty", 9)
    assert [c.text for c in cat.captions if c.video_id == quoted] == ['He says "hello" and leaves.']
    assert SKIPPED in {v.video_id for v in cat.split_videos("test")}
    assert cat.options["skip"] == [] and cat.options["warnings"] == []


def test_lsmdc_skip_leaves_out_the_clip_xpool_skips(tmp_path: Path) -> None:
    ann = _lsmdc(tmp_path / "ann")
    cat = load_dataset("lsmdc", tmp_path, ann, skip=SKIPPED)
    assert counts(cat)["test"] == (999, 999, 999) and SKIPPED not in {v.video_id for v in cat.videos}
    assert cat.options["skip"] == [SKIPPED]
    typo = load_dataset("lsmdc", tmp_path, ann, skip=f"{SKIPPED},no_such_clip")
    assert any("no_such_clip" in w for w in typo.options["warnings"])


def test_lsmdc_videos_flat_or_in_their_movie_folder(tmp_path: Path) -> None:
    ann = _lsmdc(tmp_path / "ann")
    clip0, clip1 = _clip("1012_Unbreakable", 0), _clip("1012_Unbreakable", 1)
    videos = touch(
        tmp_path / "videos", f"{clip0}.avi", f"1012_Unbreakable/{clip1}.avi", f"1012_Unbreakable/{SKIPPED}.mp4"
    )
    cat = load_dataset("lsmdc", videos, ann, splits="test")
    paths = {v.video_id: v.path for v in cat.videos}
    assert paths[clip0] == videos / f"{clip0}.avi"
    assert paths[clip1] == videos / "1012_Unbreakable" / f"{clip1}.avi"
    assert paths[SKIPPED] == videos / "1012_Unbreakable" / f"{SKIPPED}.mp4"
    assert len(cat.missing) == 997


def test_lsmdc_files_and_errors(tmp_path: Path) -> None:
    ann = _lsmdc(tmp_path / "ann")
    (ann / LSMDC_FILES["val"]).unlink()
    cat = load_dataset("lsmdc", tmp_path, ann)
    assert cat.splits() == ["train", "test"] and any(
        "LSMDC16_annos_val.csv not found" in w for w in cat.options["warnings"]
    )
    assert load_dataset("lsmdc", tmp_path, ann / LSMDC_FILES["test"]).splits() == ["train", "test"]
    with pytest.raises(DatasetError, match="missing annotation file .*LSMDC16_annos_val.csv"):
        load_dataset("lsmdc", tmp_path, ann, splits="val,test")
    (ann / "other_test.csv").write_text(_line("c1", "a") + "\n\n" + _line("c2", "") + "\n")
    other = load_dataset("lsmdc", tmp_path, ann, test_file="other_test.csv", splits="test")
    assert counts(other) == {"test": (1, 1, 1)}
    assert any("1 row(s) with an empty sentence" in w for w in other.options["warnings"])
    assert any("dropped 1 of 2" in w and "c2" in w for w in other.options["warnings"])
    (ann / "commas.csv").write_text("clip,start,end,s2,e2,sentence\nc1,1,2,1,2,a man\n")
    with pytest.raises(
        DatasetError, match=r"commas.csv: line 1: expected rows of 6 tab-separated .*found 1 field\(s\) \(a comma"
    ):
        load_dataset("lsmdc", tmp_path, ann, test_file="commas.csv")
    (ann / "val.csv").write_text(_line(_clip("0001_American_Beauty", 0), "again") + "\n")
    with pytest.raises(DatasetError, match="listed in both train and val"):
        load_dataset("lsmdc", tmp_path, ann, val_file="val.csv")
    with pytest.raises(DatasetError, match="LSMDC16_challenge_1000_publictect.csv .*found in .*README"):
        load_dataset("lsmdc", tmp_path, touch(tmp_path / "empty", "README.md"))


def test_lsmdc_shared_folder_has_no_files(shared_data: Path, tmp_path: Path) -> None:
    """../shared/data/lsmdc holds only a README (the files need MPII's permission): one line says what is missing."""
    with pytest.raises(DatasetError) as err:
        load_dataset("lsmdc", tmp_path, shared_data / "lsmdc")
    assert "LSMDC16_challenge_1000_publictect.csv" in str(err.value) and "README-collaborative-experts.md" in str(
        err.value
    )


def test_annotation_files_that_list_no_videos_are_refused(tmp_path: Path) -> None:
    """Issue 50, 4: a 0-byte LSMDC file (or ActivityNet's `{}`) passed --dry-run, crashed an .h5 extract in h5py and
    made a .zarr store called complete with no videos."""
    import json

    from ..helpers.runner import invoke

    ann = tmp_path / "ann"
    ann.mkdir()
    for name in LSMDC_FILES.values():
        (ann / name).write_bytes(b"")
    with pytest.raises(DatasetError, match="lists no videos"):
        load_dataset("lsmdc", tmp_path, ann, splits="test")
    for out in ("s.h5", "s.zarr"):
        res = invoke(
            ["extract", "--dataset", "lsmdc", "--annotations", ann, "--option", "splits=test", "--out", tmp_path / out]
        )
        assert res.exit_code != 0 and "lists no videos" in res.output and "Traceback" not in res.output
        assert not (tmp_path / out).exists()
    res = invoke(["extract", "--dataset", "lsmdc", "--annotations", ann, "--option", "splits=test", "--dry-run"])
    assert res.exit_code != 0 and "lists no videos" in res.output
    anet = tmp_path / "anet"
    anet.mkdir()
    (anet / "train.json").write_text("{}")
    (anet / "val_1.json").write_text(json.dumps({}))
    with pytest.raises(DatasetError, match="lists no videos"):
        load_dataset("activitynet", None, anet, val_size=0)
