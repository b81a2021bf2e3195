"""`dab extract --dry-run`: the annotations read and the videos folder listed, nothing decoded, no store written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..helpers.catalogues import touch, write_csv
from ..helpers.runner import invoke


def _rows(output: str) -> dict[str, list[int]]:
    """split -> [videos, queries, captions, missing, duplicate queries, empty queries] from the printed table (its
    borders in ASCII outside a terminal, box characters in one)."""
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.replace("│", "|").split("|")[1:-1]]
        if cells and cells[0] in ("train", "val", "test"):
            out[cells[0]] = [int(c) for c in cells[1:]]
    return out


def _dry_run(dataset: str, annotations: Path, videos: Path, out: Path, *extra: str):
    args = ["extract", "--dataset", dataset, "--annotations", annotations, "--videos", videos, "--out", out]
    return invoke([*args, "--dry-run", *extra])


@pytest.mark.parametrize(
    "dataset,expected",
    [
        ("didemo", {"train": [8362, 8362, 8362], "val": [1065, 1065, 4109], "test": [1004, 1004, 3932]}),
        ("activitynet", {"train": [9509, 9509, 35597], "val": [500, 500, 1824], "test": [4917, 4917, 17505]}),
        ("charades", {"train": [7469, 7469, 10844], "val": [500, 500, 708], "test": [1863, 1863, 4535]}),
    ],
)
def test_dry_run_prints_the_counts_of_the_real_files(shared_data: Path, tmp_path: Path, dataset: str, expected) -> None:
    videos = touch(tmp_path / "videos")  # empty: every video is missing
    res = _dry_run(dataset, shared_data / dataset, videos, tmp_path / "s.h5")
    assert res.exit_code == 1, res.output
    rows = _rows(res.output)
    assert {s: r[:3] for s, r in rows.items()} == expected
    assert all(r[3] == r[0] and r[5] == 0 for r in rows.values())  # all missing, none empty
    assert f"test: {expected['test'][0]} videos missing on disk (first: " in res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith("Error: dry run: ") and "listed videos are missing on disk" in last
    assert not (tmp_path / "s.h5").exists()


def test_dry_run_exits_0_when_everything_is_there(tmp_path: Path) -> None:
    ann = tmp_path / "ann"
    ann.mkdir()
    header = ["id", "descriptions"]
    write_csv(ann / "Charades_v1_train.csv", header, [[f"TR{i}", f"a person does {i}.;{{}}"] for i in range(4)])
    write_csv(ann / "Charades_v1_test.csv", header, [["TE0", "a person cooks."], ["TE1", "a person reads."]])
    videos = touch(tmp_path / "videos", *[f"TR{i}.mp4" for i in range(4)], "TE0.mp4", "TE1.webm")
    res = _dry_run("charades", ann, videos, tmp_path / "s.h5", "--option", "val_size=1")
    assert res.exit_code == 0, res.output
    assert _rows(res.output) == {"train": [3, 3, 3, 0, 0, 0], "val": [1, 1, 1, 0, 0, 0], "test": [2, 2, 2, 0, 0, 0]}
    assert "Error" not in res.output and not (tmp_path / "s.h5").exists()
    limited = _dry_run("charades", ann, videos, tmp_path / "s.h5", "--option", "val_size=0", "--limit", "2")
    assert _rows(limited.output) == {"train": [2, 2, 2, 0, 0, 0]} and "its first 2 videos" in limited.output


def test_dry_run_reports_duplicate_and_empty_queries_of_an_old_dataset(tmp_path: Path) -> None:
    ann = tmp_path / "ann"
    ann.mkdir()
    caps = {"a": ["a dog runs", "A  dog runs", "a cat"], "b": ["a cat", ""], "c": ["fine"]}
    (ann / "captions_msvd.json").write_text(json.dumps(caps))
    (ann / "train_list.txt").write_text("a\nb\n")
    (ann / "val_list.txt").write_text("c\n")
    (ann / "test_list.txt").write_text("c_missing\n")
    videos = touch(tmp_path / "videos", "a.avi", "b.avi", "c.avi")
    res = _dry_run("msvd", ann, videos, tmp_path / "s.h5")
    assert res.exit_code == 1, res.output
    assert _rows(res.output) == {"train": [2, 5, 5, 0, 2, 1], "val": [1, 1, 1, 0, 0, 0]}
    assert "train: 2 queries repeat an earlier one (first: 'A  dog runs'; 'a cat')" in res.output
    assert "train: 1 empty query (first: b#1)" in res.output
    assert "c_missing" in res.output  # listed without a caption: the loader's warning
    assert res.output.strip().splitlines()[-1] == "Error: dry run: 1 query is empty (listed above)"


def test_one_file_under_two_ids_in_train_and_test_is_refused_naming_both_rows(tmp_path: Path) -> None:
    """Issue 59, 8g: a folder CSV listing clip.mp4 as `a` in train and as `b` in test passed the dry run silently
    (the same video trained and tested on). Refused in one line naming both rows, in the dry run and the loader."""
    from dab_pipeline.core.errors import DatasetError
    from dab_pipeline.datasets import load_dataset
    from dab_pipeline.datasets.catalogue import hash_split

    videos = touch(tmp_path / "videos", "clip.mp4", "other.mp4")
    header = ["video", "video_id", "caption", "split"]
    rows = [["clip.mp4", "a", "a dog", "train"], ["other.mp4", "o", "a cat", "train"], ["clip.mp4", "b", "x", "test"]]
    res = _dry_run("folder", write_csv(tmp_path / "c.csv", header, rows), videos, tmp_path / "s.h5")
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and not (tmp_path / "s.h5").exists(), res.output
    assert lines[0].startswith(f"Error: {tmp_path / 'c.csv'}: line 2 (id 'a', split train) and line 4 (id 'b', ")
    assert "split test) list the same file, clip.mp4" in lines[0]
    # under two ids in one split the file is only listed twice: loaded as before
    rows[2][3] = "train"
    assert len(load_dataset("folder", videos, write_csv(tmp_path / "d.csv", header, rows)).videos) == 3
    # splits drawn by hash: the same (two ids the hash puts in two splits)
    other = next(f"b{i}" for i in range(100) if hash_split(f"b{i}") != hash_split("a"))
    rows = [["clip.mp4", "a", "a dog"], ["clip.mp4", other, "x"]]
    with pytest.raises(DatasetError, match=rf"line 3 \(id '{other}', split \w+ by hash\) list the same file"):
        load_dataset("folder", videos, write_csv(tmp_path / "e.csv", header[:3], rows))
    # and the same file reached through a symlink inside the folder
    (videos / "link.mp4").symlink_to(videos / "clip.mp4")
    rows = [["clip.mp4", "a", "a dog", "train"], ["link.mp4", "l", "x", "val"]]
    with pytest.raises(DatasetError, match=r"\(id 'l', split val\) list the same file, clip.mp4"):
        load_dataset("folder", videos, write_csv(tmp_path / "f.csv", header, rows))


def test_dry_run_of_a_wrong_layout_is_one_line(tmp_path: Path) -> None:
    ann = touch(tmp_path / "ann", "Charades_v1_test.csv")
    res = _dry_run("didemo", ann, tmp_path, tmp_path / "s.h5")
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "Error: dataset 'didemo': no test annotations (expected test_data.json"
    )
    assert "found in" in lines[0] and "Charades_v1_test.csv" in lines[0]


def test_a_memory_store_is_refused_by_the_cli_and_made_by_the_python_api(
    tiny_folder_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 59, 7: `dab extract --out memory://...` encoded every video, exited 0, and the store went with the
    process. The CLI refuses it when the options are parsed; the Python API, whose process reads it, makes it."""
    import uuid

    from dab_pipeline.stages import extract as stage
    from dab_pipeline.store import open_store

    from ..helpers.runner import extract_args

    url = f"memory://dab-{uuid.uuid4().hex[:8]}/s.zarr"
    with monkeypatch.context() as m:
        for name in ("run_extract", "dry_run_extract"):
            m.setattr(stage, name, lambda *a, **k: pytest.fail("work done for a store nobody can read"))
        for extra in ((), ("--dry-run",)):
            res = invoke(extract_args(tiny_folder_dataset, *extra, out=url))
            said = [line for line in res.output.splitlines() if line.startswith("Error")]
            assert res.exit_code == 2 and len(said) == 1 and "Traceback" not in res.output, res.output
            assert f"{url}: a memory:// store lives only as long as its process" in said[0]
            assert "before anyone can read it" in said[0] and "s3://" in said[0]
    videos = tiny_folder_dataset.parent / "videos"
    options = {"videos": videos, "annotations": tiny_folder_dataset, "model": "dab-tiny", "workers": 0, "frames": 2}
    res = stage.run_extract(stage.build_extract_config("folder", url, options={**options, "limit": 2}))
    assert res.videos_ok == 2
    with open_store(url) as st:
        assert st.is_complete and st.num_videos == 2


def test_frames_has_an_upper_bound_checked_before_anything_runs(tmp_path) -> None:
    """Issue 50, 6: `--frames 100000` ran the machine out of memory and left a store behind."""
    import click

    from dab_pipeline.cli import cli
    from dab_pipeline.core.errors import ConfigError
    from dab_pipeline.stages.extract.config import MAX_FRAMES, ExtractConfig

    from ..helpers.runner import invoke

    param = next(p for p in cli.commands["extract"].params if p.name == "frames")
    assert isinstance(param.type, click.IntRange) and param.type.max == MAX_FRAMES
    out = invoke(
        ["extract", "--dataset", "folder", "--videos", tmp_path, "--out", tmp_path / "s.h5", "--frames", "100000"]
    )
    assert out.exit_code == 2 and "'--frames': 100000 is not in the range 1<=x<=256" in out.output
    assert not (tmp_path / "s.h5").exists()
    with pytest.raises(ConfigError, match=r"frames must be in \[1, 256\]"):
        ExtractConfig(dataset="folder", videos=tmp_path, out=tmp_path / "s.h5", frames=MAX_FRAMES + 1)
