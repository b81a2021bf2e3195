"""DiDeMo: LocalizingMoments' *_data.json with the retrieval lists, T-MASS's CSVs, paragraphs, file names as ids."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from dab_pipeline.core.errors import ConfigError, DatasetError
from dab_pipeline.datasets import load_dataset

from ..helpers.catalogues import check_invariants, counts, touch, write_csv
from ..helpers.runner import invoke
from ..helpers.videos import write_index_video

# Flickr file names: odd suffixes, and one that ends in a bare '.'.
IDS = {
    "train": ["1@N01_a.mov", "2@N02_b.", "3@N03_c.3gp"],
    "val": ["4@N04_d.avi"],
    "test": ["5@N05_e.mp4", "6@N06_f.", "7@N07_g.wmv", "8@N08_h.MTS"],
}


def _descriptions(vid: str) -> list[str]:
    return [f"  {vid} first moment.", f"{vid}   second moment ", f"{vid} third"]


def _lm_entries(ids: list[str], extra: str | None = None) -> list[dict]:
    """LocalizingMoments' format, the videos' descriptions interleaved as in the real files."""
    vids = ids + ([extra] if extra else [])
    rows = [(vid, d) for k in range(3) for vid in vids for d in _descriptions(vid)[k : k + 1]]
    return [
        {
            "num_segments": 6,
            "description": d,
            "dl_link": "x",
            "times": [[1, 1], [0, 1], [1, 2]],
            "video": v,
            "annotation_id": i,
        }
        for i, (v, d) in enumerate(rows)
    ]


def _paragraph(vid: str) -> str:
    return f"{vid} first moment. {vid} second moment {vid} third"


def _json_layout(ann: Path, with_train: bool = True) -> Path:
    ann.mkdir(parents=True, exist_ok=True)
    for split, ids in IDS.items():
        (ann / f"{split}_list.txt").write_text("\n".join(ids) + "\n")
        if split != "train" or with_train:
            (ann / f"{split}_data.json").write_text(json.dumps(_lm_entries(ids, extra=f"9@N09_{split}.avi")))
    return ann


def _csv_layout(ann: Path, splits=("train", "val", "test")) -> Path:
    ann.mkdir(parents=True, exist_ok=True)
    header = ["success", "video_path", "starts", "ends", "text", "formatted_data"]
    for split in splits:
        rows = [
            [
                "True",
                f"/home/u/didemo/all_videos/{v}",
                "tensor([[0]])",
                "tensor([[31]])",
                " ".join(_descriptions(v)),
                "x.pth",
            ]
            for v in IDS[split]
        ]
        write_csv(ann / f"didemo_{split}_label.csv", header, rows)
    return ann


def test_didemo_json_layout_joins_each_videos_descriptions_into_one_paragraph(tmp_path: Path) -> None:
    ann = _json_layout(tmp_path / "ann")
    cat = load_dataset("didemo", tmp_path / "ann", ann)
    check_invariants(cat)
    assert counts(cat) == {"train": (3, 3, 9), "val": (1, 1, 3), "test": (4, 4, 12)}
    assert [v.video_id for v in cat.split_videos("test")] == IDS["test"]  # the list's order, the names as given
    assert {c.video_id: c.text for c in cat.captions} == {v: _paragraph(v) for ids in IDS.values() for v in ids}
    assert cat.options["files"] == {"train": "train_data.json", "val": "val_data.json", "test": "test_data.json"}
    # the data files' videos outside the retrieval lists are left out, and said so
    assert sum("not in" in w and "left out" in w for w in cat.options["warnings"]) == 3
    assert not any(v.video_id.startswith("9@") for v in cat.videos)


def test_a_null_description_is_no_text_and_a_number_is_refused(tmp_path: Path) -> None:
    """Issue 50, 9: ``"description": null`` became the word "None" in the query; numbers and lists were
    stringified."""
    ann = _json_layout(tmp_path / "ann")
    test = json.loads((ann / "test_data.json").read_text())
    vid = IDS["test"][0]
    first = next(e for e in test if e["video"] == vid)
    first["description"] = None
    (ann / "test_data.json").write_text(json.dumps(test))
    cat = load_dataset("didemo", tmp_path / "ann", ann)
    text = next(c.text for c in cat.captions if c.video_id == vid)
    assert "None" not in text and text == f"{vid} second moment {vid} third"
    assert any("1 moments have a null description" in w for w in cat.options["warnings"])
    for bad, said in ((7, "found a JSON int (7)"), (["a", "b"], "found a JSON list")):
        first["description"] = bad
        (ann / "test_data.json").write_text(json.dumps(test))
        want = rf"entry \d+ \({re.escape(vid)}\): expected a text description; {re.escape(said)}"
        with pytest.raises(DatasetError, match=want):
            load_dataset("didemo", tmp_path / "ann", ann)


def test_didemo_finds_the_files_as_they_are_on_disk(tmp_path: Path) -> None:
    ann = _json_layout(tmp_path / "ann")
    videos = touch(
        tmp_path / "videos",
        "1@N01_a.mov",  # the name itself
        "2@N02_b.",  # a bare '.' kept
        "3@N03_c.mp4",  # re-encoded: the suffix replaced
        "4@N04_d.avi.mp4",  # re-encoded: a suffix added
        "6@N06_f",  # the bare '.' lost on copying
        "7@N07_G.WMV",  # another case
        "notes.txt",
    )
    cat = load_dataset("didemo", videos, ann)
    names = {v.video_id: v.path.name for v in cat.videos}
    assert names["1@N01_a.mov"] == "1@N01_a.mov" and names["2@N02_b."] == "2@N02_b."
    assert names["3@N03_c.3gp"] == "3@N03_c.mp4" and names["4@N04_d.avi"] == "4@N04_d.avi.mp4"
    assert names["6@N06_f."] == "6@N06_f" and names["7@N07_g.wmv"] == "7@N07_G.WMV"
    assert sorted(cat.missing) == ["5@N05_e.mp4", "8@N08_h.MTS"]
    assert {v.path for v in cat.videos if v.video_id in cat.missing} == {videos / "5@N05_e.mp4", videos / "8@N08_h.MTS"}


def test_didemo_tmass_csvs_give_the_same_paragraphs(tmp_path: Path) -> None:
    from_json = load_dataset("didemo", tmp_path, _json_layout(tmp_path / "lm"))
    csv_dir = _csv_layout(tmp_path / "tmass")
    from_csv = load_dataset("didemo", tmp_path, csv_dir)
    check_invariants(from_csv)
    assert [(c.video_id, c.text) for c in from_csv.captions] == [(c.video_id, c.text) for c in from_json.captions]
    assert counts(from_csv) == {"train": (3, 3, 3), "val": (1, 1, 1), "test": (4, 4, 4)}  # already joined: 1 part
    # with the retrieval lists next to the CSVs, the lists decide the split (order and membership)
    (csv_dir / "test_list.txt").write_text("\n".join(reversed(IDS["test"][1:])) + "\n")
    listed = load_dataset("didemo", tmp_path, csv_dir)
    assert [v.video_id for v in listed.split_videos("test")] == list(reversed(IDS["test"][1:]))
    assert any("1 of its 4 videos are not in test_list.txt" in w for w in listed.options["warnings"])
    single = load_dataset("didemo", tmp_path, csv_dir / "didemo_test_label.csv")
    assert counts(single)["test"] == (3, 3, 3)


def test_didemo_auto_takes_each_split_from_the_file_that_is_there(tmp_path: Path) -> None:
    ann = _json_layout(tmp_path / "ann", with_train=False)
    _csv_layout(ann, splits=("train",))
    cat = load_dataset("didemo", tmp_path, ann)
    assert cat.options["files"] == {"train": "didemo_train_label.csv", "val": "val_data.json", "test": "test_data.json"}
    assert counts(cat) == {"train": (3, 3, 3), "val": (1, 1, 3), "test": (4, 4, 12)}
    assert any(w.startswith("mixed layouts") for w in cat.options["warnings"])
    only_json = load_dataset("didemo", tmp_path, ann, layout="json")
    assert only_json.splits() == ["val", "test"]
    assert any("train_data.json" in w and "no train split" in w for w in only_json.options["warnings"])
    with pytest.raises(DatasetError, match="no train annotations .*train_data.json.*found in"):
        load_dataset("didemo", tmp_path, ann, layout="json", splits="train,test")


def test_didemo_wrong_layouts_say_what_was_expected_and_found(tmp_path: Path) -> None:
    other = touch(tmp_path / "charades", "Charades_v1_train.csv", "Charades_v1_test.csv")
    with pytest.raises(DatasetError) as err:
        load_dataset("didemo", tmp_path, other)
    msg = str(err.value)
    assert "test_data.json" in msg and "didemo_test_label.csv" in msg and "Charades_v1_test.csv" in msg
    assert len(msg.splitlines()) == 1
    ann = _json_layout(tmp_path / "ann")
    (ann / "test_list.txt").unlink()
    with pytest.raises(DatasetError, match="test_list.txt .*retrieval split"):
        load_dataset("didemo", tmp_path, ann)
    (ann / "test_list.txt").write_text("5@N05_e.mp4\n")
    (ann / "test_data.json").write_text(json.dumps({"5@N05_e.mp4": ["a"]}))
    with pytest.raises(DatasetError, match="test_data.json: expected LocalizingMoments' list .*found a JSON dict"):
        load_dataset("didemo", tmp_path, ann)
    (ann / "test_data.json").write_text(json.dumps([{"video": "5@N05_e.mp4", "sentence": "a"}]))
    with pytest.raises(DatasetError, match="entry 0: expected keys video and description; found"):
        load_dataset("didemo", tmp_path, ann)
    write_csv(ann / "didemo_test_label.csv", ["video", "caption"], [["a.mov", "x"]])
    with pytest.raises(DatasetError, match=r"missing column\(s\) video_path, text"):
        load_dataset("didemo", tmp_path, ann, layout="csv", splits="test")
    with pytest.raises(ConfigError, match="layout must be one of auto, json, csv"):
        load_dataset("didemo", tmp_path, ann, layout="tmass")


def test_didemo_real_files(shared_data: Path, tmp_path: Path) -> None:
    src = shared_data / "didemo"
    cat = load_dataset("didemo", tmp_path, src)  # no train_data.json: train from T-MASS's CSV
    check_invariants(cat)
    assert counts(cat) == {"train": (8362, 8362, 8362), "val": (1065, 1065, 4109), "test": (1004, 1004, 3932)}
    assert len(cat.missing) == 8362 + 1065 + 1004
    tmass = load_dataset("didemo", tmp_path, src, layout="csv")
    assert counts(tmass) == {"train": (8362, 8362, 8362), "val": (1062, 1062, 1062), "test": (1004, 1004, 1004)}
    # T-MASS's test paragraphs are LocalizingMoments' descriptions joined: the two layouts agree on all 1004
    assert [(c.video_id, c.text) for c in tmass.split_captions("test")] == [
        (c.video_id, c.text) for c in cat.split_captions("test")
    ]
    with pytest.raises(DatasetError, match="no train annotations .*train_data.json"):
        load_dataset("didemo", tmp_path, src, layout="json", splits="train")


def test_didemo_real_lists_with_a_train_data_json_of_their_format(shared_data: Path, tmp_path: Path) -> None:
    ann = tmp_path / "ann"
    shutil.copytree(shared_data / "didemo", ann)
    train = (ann / "train_list.txt").read_text().split()
    (ann / "train_data.json").write_text(json.dumps(_lm_entries(train)[: 2 * len(train)]))  # 2 descriptions each
    videos = tmp_path / "videos"
    test = (ann / "test_list.txt").read_text().split()
    dotted = [v for v in test if v.endswith(".")]
    converted = next(v for v in test if v.endswith(".3gp"))
    touch(videos, dotted[0], dotted[1].rstrip("."), converted[: -len(".3gp")] + ".mp4")
    cat = load_dataset("didemo", videos, ann)
    check_invariants(cat)
    assert counts(cat) == {"train": (8392, 8392, 16784), "val": (1065, 1065, 4109), "test": (1004, 1004, 3932)}
    ids = [v.video_id for v in cat.videos]
    assert sum(v.endswith(".") for v in ids) == 193
    assert len({os.path.splitext(v)[1] for v in ids} - {"."}) == 16
    assert len(cat.missing) == len(ids) - 3 and not {dotted[0], dotted[1], converted} & set(cat.missing)


def test_didemo_videos_under_their_flickr_names_are_extracted(tmp_path: Path) -> None:
    """A bare '.', '.3gp', '.MTS': PyAV reads the container, not the name; the store holds every video."""
    ann = _json_layout(tmp_path / "ann")
    videos = tmp_path / "videos"
    videos.mkdir()
    for vid in [v for ids in IDS.values() for v in ids]:
        write_index_video(tmp_path / "clip.mp4", 6, (32, 24)).rename(videos / vid)
    args = ["extract", "--dataset", "didemo", "--annotations", ann, "--videos", videos, "--model", "dab-tiny"]
    assert invoke([*args, "--dry-run"]).exit_code == 0
    res = invoke([*args, "--workers", "0", "--quiet", "--out", tmp_path / "s.h5"])
    assert res.exit_code == 0, res.output
    assert "8 videos encoded, 0 already done, 0 failed, 0 missing; 8 captions" in res.output
