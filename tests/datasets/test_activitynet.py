"""ActivityNet Captions: train.json (or a file of its format) and val_1.json as the test set, paragraphs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dab_pipeline.core.errors import ConfigError, DatasetError
from dab_pipeline.datasets import load_dataset

from ..helpers.catalogues import check_invariants, counts, touch


def _video(n: int, duration: float = 30.0) -> dict:
    """n sentences, all but the first with the leading space of the release, the last timestamp past the end."""
    sentences = [f"{'' if k == 0 else ' '}Sentence {k} of the video." for k in range(n)]
    stamps = [[k * 2.0, k * 2.0 + 5] for k in range(n - 1)] + [[duration - 3, duration + 4.5]]
    return {"duration": duration, "timestamps": stamps, "sentences": sentences}


def _anet(ann: Path, train_name: str = "train.json") -> Path:
    ann.mkdir(parents=True, exist_ok=True)
    train = {f"v_train{i:03d}": _video(2 + i % 3) for i in range(12)}
    train["v_nosentence"] = {"duration": 10.0, "timestamps": [], "sentences": []}
    (ann / train_name).write_text(json.dumps(train))
    (ann / "val_1.json").write_text(json.dumps({f"v_test{i}": _video(3) for i in range(4)}))
    (ann / "val_2.json").write_text(json.dumps({f"v_test{i}": _video(2) for i in range(1, 4)}))
    return ann


def test_activitynet_val_1_is_the_test_set_of_paragraphs(tmp_path: Path) -> None:
    ann = _anet(tmp_path / "ann")
    videos = touch(tmp_path / "videos", "v_test0.mp4", "test1.mkv", "v_train000.webm")
    cat = load_dataset("activitynet", videos, ann, val_size=2)
    check_invariants(cat)
    c = counts(cat)
    assert c["test"] == (4, 4, 12) and c["train"][2] + c["val"][2] == 36  # 2, 3, 4 sentences in turn
    assert [len(cat.split_videos(s)) for s in ("train", "val", "test")] == [10, 2, 4]
    assert [v.video_id for v in cat.split_videos("test")] == [f"v_test{i}" for i in range(4)]
    test0 = cat.split_captions("test")[0]
    assert test0.text == "Sentence 0 of the video. Sentence 1 of the video. Sentence 2 of the video."
    assert test0.parts == 3
    # the video is v_<id>.mp4 as released, or <id>.<suffix> as a YouTube download names it
    paths = {v.video_id: v.path.name for v in cat.videos}
    assert paths["v_test0"] == "v_test0.mp4" and paths["v_test1"] == "test1.mkv"
    assert paths["v_test2"] == "v_test2.mp4" and "v_test2" in cat.missing
    assert any("v_nosentence" in w and "dropped 1" in w for w in cat.options["warnings"])
    assert cat.options["files"] == {"test": "val_1.json", "train": "train.json"}
    assert not {v.video_id for v in cat.split_videos("val")} & {v.video_id for v in cat.split_videos("train")}


def test_activitynet_other_files_of_the_same_format(tmp_path: Path) -> None:
    ann = _anet(tmp_path / "ann", train_name="train_modified.json")  # PDVC's name
    cat = load_dataset("activitynet", tmp_path, ann, val_size=0)
    assert cat.options["files"]["train"] == "train_modified.json"
    assert [len(cat.split_videos(s)) for s in ("train", "val", "test")] == [12, 0, 4]
    val_2 = load_dataset("activitynet", tmp_path, ann, test_file="val_2.json", splits="test")
    assert counts(val_2) == {"test": (3, 3, 6)}
    single = load_dataset("activitynet", tmp_path, ann / "val_2.json", splits="test")
    assert counts(single) == {"test": (3, 3, 6)}
    (ann / "train_modified.json").unlink()
    test_only = load_dataset("activitynet", tmp_path, ann)
    assert test_only.splits() == ["test"]
    assert any("train.json not found" in w for w in test_only.options["warnings"])
    with pytest.raises(DatasetError, match="missing annotation file .*train.json"):
        load_dataset("activitynet", tmp_path, ann, splits="train,test")


def test_activitynet_wrong_files_say_what_was_expected_and_found(tmp_path: Path) -> None:
    ann = _anet(tmp_path / "ann")
    with pytest.raises(DatasetError, match=r"val_1\.json .*expected ActivityNet Captions.*found in .*Charades"):
        load_dataset("activitynet", tmp_path, touch(tmp_path / "c", "Charades_v1_test.csv"))
    (ann / "val_1.json").write_text(json.dumps([{"video": "v_a", "sentences": ["x"]}]))
    with pytest.raises(DatasetError, match=r"val_1.json: expected \{\"v_<youtube id>\".*found a JSON list"):
        load_dataset("activitynet", tmp_path, ann)
    (ann / "val_1.json").write_text(json.dumps({"v_a": {"duration": 3.0, "captions": ["x"]}}))
    with pytest.raises(DatasetError, match="'v_a': expected an object with a list of strings 'sentences'; found"):
        load_dataset("activitynet", tmp_path, ann)
    (ann / "val_1.json").write_text(json.dumps({"v_train001": _video(2)}))
    with pytest.raises(DatasetError, match="1 training videos are also test videos"):
        load_dataset("activitynet", tmp_path, ann)
    with pytest.raises(ConfigError, match="val_size must be in"):
        load_dataset("activitynet", tmp_path, _anet(tmp_path / "ok"), val_size=50)


def test_activitynet_real_files(shared_data: Path, tmp_path: Path) -> None:
    src = shared_data / "activitynet"
    cat = load_dataset("activitynet", tmp_path, src)  # train_modified.json stands in for train.json
    check_invariants(cat)
    assert counts(cat)["test"] == (4917, 4917, 17505)
    assert len(cat.split_videos("train")) + len(cat.split_videos("val")) == 10009
    assert len(cat.split_videos("val")) == 500 and len(cat.missing) == 10009 + 4917
    assert all(v.video_id.startswith("v_") for v in cat.videos)
    data = json.loads((src / "val_1.json").read_text())
    first = cat.split_captions("test")[0]
    assert first.video_id == next(iter(data))
    assert first.text == " ".join(s.strip() for s in data[first.video_id]["sentences"])
    assert not any(c.text.startswith(" ") for c in cat.captions)  # 2/3 of the sentences start with one
    full = load_dataset("activitynet", tmp_path, src, val_size=0)
    assert counts(full)["train"][:2] == (10009, 10009) and full.split_videos("val") == []
    val_2 = load_dataset("activitynet", tmp_path, src, test_file="val_2.json", splits="test")
    assert counts(val_2) == {"test": (4885, 4885, 17031)}


def test_option_values_nesting_and_a_byte_order_mark(tmp_path: Path) -> None:
    """Issue 50, 8: `--option val_size=abc` / `seed=abc` gave tracebacks; deeply nested JSON a RecursionError; a
    JSON file with a UTF-8 byte-order mark was refused (CSV and TSV files accept one)."""
    ann = _anet(tmp_path / "ann")
    for key, bad in (("val_size", "abc"), ("seed", "abc"), ("val_size", 2.5), ("seed", True)):
        with pytest.raises(ConfigError, match=rf"option {key}=.*: expected a whole number \(--option {key}=N\)"):
            load_dataset("activitynet", None, ann, **{key: bad})
    for name in ("train.json", "val_1.json"):
        text = (ann / name).read_text()
        (ann / name).write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    cat = load_dataset("activitynet", None, ann, val_size=2)
    assert counts(cat)["test"] == (4, 4, 12)
    (ann / "val_1.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DatasetError, match="nested too deeply"):
        load_dataset("activitynet", None, ann, val_size=2)


def test_cli_option_values_are_one_line(tmp_path: Path) -> None:
    from ..helpers.runner import invoke

    ann = _anet(tmp_path / "ann")
    out = invoke(["extract", "--dataset", "activitynet", "--annotations", ann, "--dry-run", "--option", "val_size=abc"])
    assert out.exit_code != 0 and "expected a whole number" in out.output and "Traceback" not in out.output
