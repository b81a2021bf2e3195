from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from dab_pipeline.core.errors import ConfigError, DatasetError, UnknownNameError
from dab_pipeline.datasets import DATASETS, Catalogue, hash_split, load_dataset


def _check_invariants(index: Catalogue) -> None:
    ids = [v.video_id for v in index.videos]
    assert len(ids) == len(set(ids))
    split_of = {v.video_id: v.split for v in index.videos}
    assert all(c.video_id in split_of and c.split == split_of[c.video_id] for c in index.captions)
    assert len({c.caption_id for c in index.captions}) == len(index.captions)
    assert set(index.missing) <= set(ids)
    assert all(v.path.is_absolute() for v in index.videos)
    assert {v.split for v in index.videos} <= {"train", "val", "test"}
    json.dumps(index.options)  # recorded in the store manifest


def _counts(index: Catalogue) -> dict[str, tuple[int, int]]:
    return {s: (len(index.split_videos(s)), len(index.split_captions(s))) for s in ("train", "val", "test")}


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")


# ---------------------------------------------------------------------------- registry


def test_registry_names_and_unknown_dataset(tmp_path: Path) -> None:
    names = ["activitynet", "charades", "didemo", "folder", "lsmdc", "msrvtt", "msvd", "vatex"]
    assert DATASETS.names() == names
    with pytest.raises(UnknownNameError) as err:
        load_dataset("kinetics", tmp_path, tmp_path)
    for name in names:
        assert name in str(err.value)
    assert "kinetics" in str(err.value)


def test_unknown_option_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="val_sise"):
        load_dataset("msrvtt", tmp_path, tmp_path, val_sise=3)


# ---------------------------------------------------------------------------- MSR-VTT


def _small_msrvtt(root: Path) -> Path:
    ann = root / "ann"
    ann.mkdir(parents=True)
    _write_csv(
        ann / "MSRVTT_JSFUSION_test.csv",
        ["key", "vid_key", "video_id", "sentence"],
        [["ret0", "msr9", "video9", "a cat sleeps"], ["ret1", "msr8", "video8", "a dog runs"]],
    )
    train = [f"video{i}" for i in range(6)]
    _write_csv(ann / "MSRVTT_train.9k.csv", ["video_id"], [[v] for v in train])
    _write_csv(ann / "MSRVTT_train.7k.csv", ["video_id"], [[v] for v in train[:4]])
    sentences = [
        {"video_id": v, "caption": f"caption {k} of {v}", "sen_id": 100 * i + (2 - k)}
        for i, v in enumerate(train[:5])  # video5 has no caption
        for k in range(3)
    ]
    sentences.append({"video_id": "video9", "caption": "must not leak into test", "sen_id": 999})
    (ann / "MSRVTT_data.json").write_text(json.dumps({"sentences": sentences}))
    return ann


def test_msrvtt_small_files(tmp_path: Path) -> None:
    ann = _small_msrvtt(tmp_path)
    videos = tmp_path / "videos"
    _touch(videos, "video0.mp4", "video1.mp4", "video9.mp4", "notes.txt")
    index = load_dataset("msrvtt", videos, ann, val_size=1)
    _check_invariants(index)
    assert _counts(index) == {"train": (4, 12), "val": (1, 3), "test": (2, 2)}
    assert [v.video_id for v in index.split_videos("test")] == ["video9", "video8"]
    assert [c.text for c in index.split_captions("test")] == ["a cat sleeps", "a dog runs"]
    assert index.split_videos("test")[0].path == (videos / "video9.mp4").resolve()
    # captions of a training video are ordered by sen_id
    v0 = [c.text for c in index.captions if c.video_id == "video0"]
    assert v0 == ["caption 2 of video0", "caption 1 of video0", "caption 0 of video0"]
    assert index.captions[0].caption_id.endswith("#0")
    listed = {v.video_id for v in index.videos}
    assert listed == {"video0", "video1", "video2", "video3", "video4", "video8", "video9"}
    assert sorted(index.missing) == sorted(listed - {"video0", "video1", "video9"})
    assert any("video5" in w for w in index.options["warnings"])
    assert [p.name for p in index.annotation_files] == [
        "MSRVTT_JSFUSION_test.csv",
        "MSRVTT_train.9k.csv",
        "MSRVTT_data.json",
    ]

    seven = load_dataset("msrvtt", videos, ann, train_split="7k", val_size=0)
    assert _counts(seven) == {"train": (4, 12), "val": (0, 0), "test": (2, 2)}


def test_msrvtt_missing_videos_are_reported_not_fatal(tmp_path: Path) -> None:
    ann = _small_msrvtt(tmp_path)
    videos = tmp_path / "videos"
    _touch(videos, "video0.mp4")
    index = load_dataset("msrvtt", videos, ann, val_size=0)
    assert set(index.missing) == {"video1", "video2", "video3", "video4", "video8", "video9"}


def test_msrvtt_without_captions_json(tmp_path: Path) -> None:
    ann = _small_msrvtt(tmp_path)
    (ann / "MSRVTT_data.json").unlink()
    index = load_dataset("msrvtt", tmp_path, ann)
    assert _counts(index) == {"train": (0, 0), "val": (0, 0), "test": (2, 2)}
    assert "MSRVTT_data.json" in index.options["warnings"][0]
    with pytest.raises(DatasetError, match="MSRVTT_data.json"):
        load_dataset("msrvtt", tmp_path, ann, splits="train,test")


def test_msrvtt_errors(tmp_path: Path) -> None:
    ann = _small_msrvtt(tmp_path)
    with pytest.raises(DatasetError, match="does not exist") as err:
        load_dataset("msrvtt", tmp_path / "no_videos", ann)
    assert "no_videos" in str(err.value)
    with pytest.raises(ConfigError, match="train_split"):
        load_dataset("msrvtt", tmp_path, ann, train_split="8k")
    with pytest.raises(ConfigError, match="val_size") as err:
        load_dataset("msrvtt", tmp_path, ann, val_size=50)
    assert "--option val_size=N" in str(err.value)
    _write_csv(ann / "MSRVTT_JSFUSION_test.csv", ["key", "video", "sentence"], [["a", "video1", "x"]])
    with pytest.raises(DatasetError) as err:
        load_dataset("msrvtt", tmp_path, ann)
    assert "MSRVTT_JSFUSION_test.csv" in str(err.value) and "video_id" in str(err.value)
    (ann / "MSRVTT_JSFUSION_test.csv").unlink()
    with pytest.raises(DatasetError, match="missing annotation file .*MSRVTT_JSFUSION_test.csv"):
        load_dataset("msrvtt", tmp_path, ann)


def test_msrvtt_real_lists(shared_data: Path, tmp_path: Path) -> None:
    src = shared_data / "msrvtt"
    ann = tmp_path / "ann"
    shutil.copytree(src, ann)
    index = load_dataset("msrvtt", tmp_path, ann)  # no MSRVTT_data.json: test split only
    assert _counts(index)["test"] == (1000, 1000)
    assert index.options["warnings"]
    assert len(index.missing) == 1000

    with open(src / "MSRVTT_train.9k.csv", newline="") as fh:
        nine = [r["video_id"] for r in csv.DictReader(fh)]
    sentences = [
        {"video_id": v, "caption": f"{v} caption {k}", "sen_id": 2 * i + k}
        for i, v in enumerate(nine)
        for k in range(2)
    ]
    (ann / "MSRVTT_data.json").write_text(json.dumps({"sentences": sentences}))

    full = load_dataset("msrvtt", tmp_path, ann)
    _check_invariants(full)
    assert _counts(full) == {"train": (8500, 17000), "val": (500, 1000), "test": (1000, 1000)}
    seven = load_dataset("msrvtt", tmp_path, ann, train_split="7k")
    assert _counts(seven) == {"train": (6510, 13020), "val": (500, 1000), "test": (1000, 1000)}
    assert {v.video_id for v in seven.videos if v.split != "test"} <= set(nine)

    # the held-out val set is a pure function of (ids, val_size, seed)
    again = load_dataset("msrvtt", tmp_path, ann)
    other = load_dataset("msrvtt", tmp_path, ann, seed=1)
    val = [v.video_id for v in full.split_videos("val")]
    assert val == [v.video_id for v in again.split_videos("val")]
    assert set(val) != {v.video_id for v in other.split_videos("val")}
    assert not set(val) & {v.video_id for v in full.split_videos("train")}
    assert full.options["val_size"] == 500 and full.options["train_split"] == "9k"


# ---------------------------------------------------------------------------- MSVD


def _small_msvd(root: Path) -> Path:
    ann = root / "ann"
    ann.mkdir(parents=True)
    caps = {"a_1_2": ["one", "two"], "b_3_4": ["three"], "c_5_6": ["four", "five", "six"], "d_7_8": ["seven"]}
    (ann / "captions_msvd.json").write_text(json.dumps(caps))
    (ann / "train_list.txt").write_text("a_1_2\nb_3_4\n")
    (ann / "val_list.txt").write_text("c_5_6\n\n")
    (ann / "test_list.txt").write_text("d_7_8\nzz_no_caption\n")
    return ann


def test_msvd_small_files(tmp_path: Path) -> None:
    ann = _small_msvd(tmp_path)
    videos = tmp_path / "videos"
    _touch(videos, "a_1_2.avi", "c_5_6.mp4")  # another suffix is accepted too
    index = load_dataset("msvd", videos, ann)
    _check_invariants(index)
    assert _counts(index) == {"train": (2, 3), "val": (1, 3), "test": (1, 1)}
    assert index.missing == ["b_3_4", "d_7_8"]
    paths = {v.video_id: v.path.name for v in index.videos}
    assert paths == {"a_1_2": "a_1_2.avi", "b_3_4": "b_3_4.avi", "c_5_6": "c_5_6.mp4", "d_7_8": "d_7_8.avi"}
    assert any("zz_no_caption" in w for w in index.options["warnings"])
    # a single captions file: the lists come from its folder
    single = load_dataset("msvd", videos, ann / "captions_msvd.json")
    assert _counts(single) == _counts(index)


def test_msvd_errors(tmp_path: Path) -> None:
    ann = _small_msvd(tmp_path)
    (ann / "val_list.txt").unlink()
    with pytest.raises(DatasetError, match="val_list.txt"):
        load_dataset("msvd", tmp_path, ann)
    (ann / "val_list.txt").write_text("a_1_2\n")
    with pytest.raises(DatasetError, match="both train and val"):
        load_dataset("msvd", tmp_path, ann)
    (ann / "captions_msvd.json").write_text("{not json")
    with pytest.raises(DatasetError, match="captions_msvd.json.*JSON"):
        load_dataset("msvd", tmp_path, ann)
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset("msvd", tmp_path, tmp_path / "nowhere")


def test_msvd_real_files(shared_data: Path, tmp_path: Path) -> None:
    index = load_dataset("msvd", tmp_path, shared_data / "msvd")
    _check_invariants(index)
    assert _counts(index) == {"train": (1200, 48774), "val": (100, 4290), "test": (670, 27763)}
    assert len(index.missing) == 1970
    assert index.options["warnings"] == []
    assert all(v.path.suffix == ".avi" for v in index.videos)


# ---------------------------------------------------------------------------- VATEX


def test_vatex_official_format(tmp_path: Path) -> None:
    ann = tmp_path / "ann"
    ann.mkdir()
    train = [
        {"videoID": f"t{i}_000000_000010", "enCap": [f"en {i} {k}" for k in range(10)], "chCap": ["x"]}
        for i in range(3)
    ]
    val = [
        {"videoID": f"v{i}_000000_000010", "enCap": [f"ve {i} {k}" for k in range(10)], "chCap": ["x"]}
        for i in range(3)
    ]
    (ann / "vatex_training_v1.0.json").write_text(json.dumps(train))
    (ann / "vatex_validation_v1.0.json").write_text(json.dumps(val))
    (ann / "train_list.txt").write_text("t0_000000_000010\nt1_000000_000010\nt2_000000_000010\nlost_000000_000010\n")
    (ann / "val_list.txt").write_text("v0_000000_000010\n")
    (ann / "test_list.txt").write_text("v1_000000_000010\nv2_000000_000010\n")
    videos = tmp_path / "videos"
    _touch(videos, "t0_000000_000010.webm", "t1_000000_000010.mkv", "v1_000000_000010.mp4")
    index = load_dataset("vatex", videos, ann)
    _check_invariants(index)
    assert _counts(index) == {"train": (3, 30), "val": (1, 10), "test": (2, 20)}
    assert sorted(index.missing) == ["t2_000000_000010", "v0_000000_000010", "v2_000000_000010"]
    assert {v.path.suffix for v in index.videos if v.video_id.startswith("t")} == {".webm", ".mkv", ".mp4"}
    assert len(index.options["warnings"]) == 1 and "dropped 1 of 4" in index.options["warnings"][0]


def test_vatex_variant_format_and_test_list_option(tmp_path: Path) -> None:
    ann = tmp_path / "ann"
    ann.mkdir()
    caps = {f"id{i}": {"enCap": [f"c{i}a", f"c{i}b"]} for i in range(6)}
    (ann / "vatex_data.json").write_text(json.dumps(caps))
    (ann / "train_list.txt").write_text("id0\nid1\n")
    (ann / "val_list.txt").write_text("id2\nid3\n")
    (ann / "test_list.txt").write_text("id4\n")
    (ann / "other_test.txt").write_text("id3\nid5\n")
    index = load_dataset("vatex", tmp_path, ann, test_list="other_test.txt")
    assert [v.video_id for v in index.split_videos("test")] == ["id3", "id5"]
    # a val id that is also tested on is removed from val
    assert [v.video_id for v in index.split_videos("val")] == ["id2"]
    assert any("also in the test list" in w for w in index.options["warnings"])
    assert index.options["lists"]["test"] == "other_test.txt"
    with pytest.raises(DatasetError, match="nope.txt"):
        load_dataset("vatex", tmp_path, ann, test_list="nope.txt")


def test_vatex_missing_captions_file(tmp_path: Path) -> None:
    (tmp_path / "train_list.txt").write_text("a\n")
    with pytest.raises(DatasetError, match="vatex_training_v1.0.json"):
        load_dataset("vatex", tmp_path, tmp_path)


def test_vatex_real_lists(shared_data: Path, tmp_path: Path) -> None:
    ann = tmp_path / "ann"
    shutil.copytree(shared_data / "vatex", ann)
    ids = set()
    for name in ("train_list.txt", "val_list.txt", "test_list.txt", "test1k5_sec_list.txt"):
        ids |= set((ann / name).read_text().split())
    ids = sorted(ids)
    # captions for every id but the first 3 (which must be dropped and counted)
    entries = [{"videoID": v, "enCap": [f"a video {k}" for k in range(2)], "chCap": []} for v in ids[3:]]
    (ann / "vatex_training_v1.0.json").write_text(json.dumps(entries))
    index = load_dataset("vatex", tmp_path, ann)
    _check_invariants(index)
    lost = set(ids[:3])
    expected = {}
    for split in ("train", "val", "test"):
        listed = (ann / f"{split}_list.txt").read_text().split()
        n = len([v for v in listed if v not in lost])
        expected[split] = (n, 2 * n)
    assert _counts(index) == expected
    assert [len((ann / f"{s}_list.txt").read_text().split()) for s in ("train", "val", "test")] == [25991, 1500, 1500]
    dropped = sum(int(w.split("dropped ")[1].split(" ")[0]) for w in index.options["warnings"])
    assert dropped == sum(
        1 for s in ("train", "val", "test") for v in (ann / f"{s}_list.txt").read_text().split() if v in lost
    )

    alt = load_dataset("vatex", tmp_path, ann, test_list="test1k5_sec_list.txt")
    assert len(alt.split_videos("test")) == 1500 - len(lost & set((ann / "test1k5_sec_list.txt").read_text().split()))
    assert not {v.video_id for v in alt.split_videos("val")} & {v.video_id for v in alt.split_videos("test")}
    assert any("also in the test list" in w for w in alt.options["warnings"])


# ---------------------------------------------------------------------------- folder


def test_folder_csv_with_splits(tmp_path: Path) -> None:
    videos = tmp_path / "videos"
    _touch(videos / "sub", "a.mp4")
    _touch(videos, "b.mp4")
    ann = _write_csv(
        tmp_path / "captions.csv",
        ["video", "caption", "split"],
        [
            ["sub/a.mp4", "first", "train"],
            ["sub/a.mp4", "second", "train"],
            ["b.mp4", "third", "test"],
            ["c.mp4", "fourth", "val"],
        ],
    )
    index = load_dataset("folder", videos, ann)
    _check_invariants(index)
    assert [(v.video_id, v.split) for v in index.videos] == [("sub/a", "train"), ("c", "val"), ("b", "test")]
    assert [c.caption_id for c in index.captions] == ["sub/a#0", "sub/a#1", "c#0", "b#0"]
    assert index.missing == ["c"]
    assert index.videos[0].path == (videos / "sub" / "a.mp4").resolve()
    assert index.annotation_files == [ann.resolve()]


def test_folder_hash_splits_and_video_id_column(tmp_path: Path) -> None:
    rows = [[f"clip{i}.mp4", f"caption {i}", f"id{i}"] for i in range(200)]
    ann = _write_csv(tmp_path / "c.csv", ["video", "caption", "video_id"], rows)
    index = load_dataset("folder", None, ann)  # videos default to the CSV's folder
    assert len(index.missing) == 200
    split_of = {v.video_id: v.split for v in index.videos}
    assert all(split_of[f"id{i}"] == hash_split(f"id{i}") for i in range(200))
    counts = {s: sum(1 for v in split_of.values() if v == s) for s in ("train", "val", "test")}
    assert 140 <= counts["train"] <= 180 and counts["val"] >= 8 and counts["test"] >= 8
    assert index.options["hashed_splits"] == 200
    assert load_dataset("folder", None, ann).videos == index.videos


def test_folder_videos_without_captions_are_listed_apart(tmp_path: Path) -> None:
    """An empty caption, a JSONL row without one, or no annotations at all: the video is kept, without captions, in
    its own split if a row names one and else in 'uncaptioned' (searchable, never trained on)."""
    ann = _write_csv(
        tmp_path / "c.csv",
        ["video", "caption", "split"],
        [["a.mp4", "a caption", "train"], ["b.mp4", "", ""], ["c.mp4", "", "test"], ["a.mp4", "", "train"]],
    )
    index = load_dataset("folder", tmp_path, ann)
    assert [(v.video_id, v.split) for v in index.videos] == [("a", "train"), ("c", "test"), ("b", "uncaptioned")]
    assert [(c.video_id, c.text) for c in index.captions] == [("a", "a caption")]
    assert index.options["uncaptioned"] == 1 and index.options["hashed_splits"] == 0
    listing = _write_csv(tmp_path / "l.csv", ["video"], [["b.mp4"], ["a.mp4"]])  # a list of videos, no captions
    assert [(v.video_id, v.split) for v in load_dataset("folder", tmp_path, listing).videos] == [
        ("b", "uncaptioned"),
        ("a", "uncaptioned"),
    ]
    (tmp_path / "j.jsonl").write_text(
        '{"video": "x.mp4", "split": "val"}\n{"video": "y.mp4", "captions": []}\n{"video": "z.mp4", "caption": " "}\n'
    )
    index = load_dataset("folder", tmp_path, tmp_path / "j.jsonl")
    assert [(v.video_id, v.split) for v in index.videos] == [("x", "val"), ("y", "uncaptioned"), ("z", "uncaptioned")]
    assert not index.captions

    lib = tmp_path / "library"
    (lib / "trips" / ".hidden").mkdir(parents=True)
    for name in ("b.mp4", "trips/a.MKV", "trips/.hidden/c.mp4", "notes.txt", ".d.mp4"):
        (lib / name).write_bytes(b"")
    index = load_dataset("folder", lib, None)  # no annotations: every video file under the folder
    assert [(v.video_id, v.split) for v in index.videos] == [("b", "uncaptioned"), ("trips/a", "uncaptioned")]
    assert index.videos[1].path == (lib / "trips" / "a.MKV").resolve() and not index.captions
    assert index.annotation_files == []
    (lib / "b.mkv").write_bytes(b"")  # two files of one stem: each its own id, with its suffix
    (lib / "away.mp4").symlink_to(tmp_path / "j.jsonl")  # a link out of the folder: skipped, said once
    index = load_dataset("folder", lib, None)
    assert [v.video_id for v in index.videos] == ["b.mkv", "b.mp4", "trips/a"]
    assert index.options["warnings"] == [f"1 link(s) lead out of {lib.resolve()} and are skipped, the first 'away.mp4'"]


def test_folder_jsonl(tmp_path: Path) -> None:
    lines = [
        {"video": "x.mp4", "captions": ["a", "b"], "split": "train"},
        {"video": "y.mp4", "caption": "c", "video_id": "why", "split": "test"},
        {"video": "x.mp4", "caption": "d", "split": "train"},
    ]
    ann = tmp_path / "ann.jsonl"
    ann.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    index = load_dataset("folder", tmp_path, ann)
    assert [c.text for c in index.captions if c.video_id == "x"] == ["a", "b", "d"]
    assert [v.video_id for v in index.split_videos("test")] == ["why"]


@pytest.mark.parametrize(
    "header,rows,pattern",
    [
        (["path", "caption"], [["a.mp4", "x"]], r"missing column\(s\) video"),
        (["video", "text"], [["a.mp4", "x"]], r"missing column\(s\) caption"),
        (["video", "caption", "split"], [["a.mp4", "x", "training"]], "split 'training'"),
        (["video", "caption", "split"], [["a.mp4", "x", "train"], ["a.mp4", "y", "test"]], "'train' and 'test'"),
        (["video", "split"], [["a.mp4", "training"]], "split 'training'"),  # a video without captions too
    ],
)
def test_folder_csv_errors(tmp_path: Path, header, rows, pattern: str) -> None:
    ann = _write_csv(tmp_path / "bad.csv", header, rows)
    with pytest.raises(DatasetError, match=pattern) as err:
        load_dataset("folder", tmp_path, ann)
    assert "bad.csv" in str(err.value)


def test_folder_path_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="missing annotation file .*nope.csv"):
        load_dataset("folder", tmp_path, tmp_path / "nope.csv")
    ann = _write_csv(tmp_path / "c.csv", ["video", "caption"], [["a.mp4", "x"]])
    with pytest.raises(DatasetError, match="videos folder .*absent"):
        load_dataset("folder", tmp_path / "absent", ann)
    (tmp_path / "c.txt").write_text("video,caption\n")
    with pytest.raises(DatasetError, match="unsupported"):
        load_dataset("folder", tmp_path, tmp_path / "c.txt")
    (tmp_path / "j.jsonl").write_text('{"video": "a.mp4", "text": "a caption under another key"}\n')
    with pytest.raises(DatasetError, match="j.jsonl: line 1: missing 'caption'.* not text"):
        load_dataset("folder", tmp_path, tmp_path / "j.jsonl")
    with pytest.raises(DatasetError, match="needs --videos .* or --annotations"):
        load_dataset("folder", None, None)
    with pytest.raises(DatasetError, match="no video files in"):  # a folder without videos, no annotations
        load_dataset("folder", tmp_path, None)


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_folder_refuses_videos_outside_the_videos_folder(tmp_path: Path, kind: str) -> None:
    videos, outside = tmp_path / "videos", tmp_path / "private"
    _touch(videos, "ok.mp4")
    _touch(outside, "secret.mp4")
    rel = {"dotdot": "../private/secret.mp4", "absolute": str(outside / "secret.mp4"), "symlink": "link.mp4"}[kind]
    if kind == "symlink":
        (videos / "link.mp4").symlink_to(outside / "secret.mp4")
    ann = _write_csv(tmp_path / "c.csv", ["video", "caption"], [["ok.mp4", "fine"], [rel, "sneaky"]])
    with pytest.raises(DatasetError, match=r"c.csv: line 3: video .* outside the videos folder") as err:
        load_dataset("folder", videos, ann)
    assert len(str(err.value).splitlines()) == 1
    # a symlink that stays inside the folder is fine
    (videos / "inner.mp4").symlink_to(videos / "ok.mp4")
    ann = _write_csv(tmp_path / "d.csv", ["video", "caption"], [["inner.mp4", "fine"]])
    assert load_dataset("folder", videos, ann).videos[0].path == (videos / "ok.mp4").resolve()


def test_the_catalogues_pre_release_names_are_gone() -> None:
    """datasets/index.py and DatasetIndex were private names (docs/api.md), removed in issue 48: "index" is the
    search's FAISS index only."""
    import importlib

    import dab_pipeline.datasets as datasets

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dab_pipeline.datasets.index")
    with pytest.raises(AttributeError):
        datasets.DatasetIndex  # noqa: B018
