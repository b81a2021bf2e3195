"""Stage one end to end: `dab extract` on generated videos with the tiny CLIP."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dab_pipeline.cli import cli
from dab_pipeline.store import open_store

BASE = ["extract", "--dataset", "folder", "--model", "dab-tiny", "--workers", "0", "--batch-size", "2",
        "--store-dtype", "float32", "--quiet"]


def _args(captions: Path, out: Path, *extra: str) -> list[str]:
    return [*BASE, "--annotations", str(captions), "--videos", str(captions.parent / "videos"), "--out", str(out),
            *extra]


def _invoke(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.fixture()
def broken_dataset(tiny_folder_dataset: Path, tmp_path: Path) -> Path:
    """The tiny dataset plus one corrupt video and one listed but missing video."""
    from dab_pipeline.synthetic import write_corrupt_video

    root = tmp_path / "broken"
    shutil.copytree(tiny_folder_dataset.parent, root)
    write_corrupt_video(root / "videos" / "bad.mp4")
    with open(root / "captions.csv", "a", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["bad.mp4", "a corrupt clip", "test"])
        w.writerow(["gone.mp4", "a clip that is not on disk", "test"])
    return root / "captions.csv"


def test_extract_h5_matches_open_clip(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    from PIL import Image

    from dab_pipeline.clip_models import load_clip
    from dab_pipeline.video import decode_video

    out = tmp_path / "store.h5"
    res = _invoke(_args(tiny_folder_dataset, out))
    assert res.exit_code == 0, res.output
    assert "6 videos encoded" in res.output
    bundle = load_clip("dab-tiny", None)
    with open_store(out) as st:
        assert st.manifest["model"] == "dab-tiny" and st.manifest["frames"] == 12
        assert st.manifest["weights_sha256"] == bundle.weights_sha256
        assert st.manifest["compute_dtype"] == "float32"  # --dtype auto on CPU
        vids = list(st.video_ids)
        frames, mask = st.read_videos(np.arange(len(vids)))
        split = st.load_split("train")
    root = tiny_folder_dataset.parent / "videos"
    for i, vid in enumerate(vids):
        dec = decode_video(root / f"{vid}.mp4", num_frames=12, short_side=bundle.image_size)
        pixels = torch.stack([bundle.preprocess(Image.fromarray(f)) for f in dec.frames])  # (F, 3, S, S)
        with torch.no_grad():
            ref = bundle.model.encode_image(pixels).float().numpy()  # (F, D)
        np.testing.assert_allclose(frames[i], ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(mask[i], dec.mask)
    # clip0 has 5 frames: 5 real, 7 repeated
    assert mask[vids.index("clip0")].sum() == 5 and mask[vids.index("clip5")].all()
    # captions: raw projected features, equal to open_clip's encode_text
    with torch.no_grad():
        ref_text = bundle.model.encode_text(bundle.tokenizer(["clip number 0 with 5 frames"])).float().numpy()
    pos = list(split.caption_ids).index("clip0#0")
    np.testing.assert_allclose(split.text[pos], ref_text[0], rtol=1e-4, atol=1e-5)
    assert np.linalg.norm(split.text[pos]) != pytest.approx(1.0, abs=1e-3)  # not L2-normalised


def test_zarr_store_equals_h5(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "s.h5", tmp_path / "s.zarr"
    assert _invoke(_args(tiny_folder_dataset, a)).exit_code == 0
    assert _invoke(_args(tiny_folder_dataset, b)).exit_code == 0
    with open_store(a) as sa, open_store(b) as sb:
        for split in ("train", "val", "test"):
            x, y = sa.load_split(split), sb.load_split(split)
            np.testing.assert_array_equal(x.frames, y.frames)
            np.testing.assert_array_equal(x.text, y.text)
            np.testing.assert_array_equal(x.frame_mask, y.frame_mask)
            assert list(x.caption_ids) == list(y.caption_ids)


def test_corrupt_and_missing_videos_are_recorded(broken_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "store.h5"
    res = _invoke(_args(broken_dataset, out))
    assert res.exit_code == 0, res.output
    assert "1 failed" in res.output and "1 missing" in res.output
    with open_store(out) as st:
        fails = dict(st.failures())
        assert "bad" in fails and "bad.mp4" in fails["bad"]
        test = st.load_split("test")
        assert list(test.video_ids) == ["clip5"]  # failed/missing videos are not served


def test_resume_after_interruption_equals_one_run(tiny_folder_dataset: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import dab_pipeline.stages.extract as ex

    full = tmp_path / "full.h5"
    assert _invoke(_args(tiny_folder_dataset, full)).exit_code == 0

    out = tmp_path / "resumed.h5"
    real = ex._collate
    calls = {"n": 0}

    def dying_collate(batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # the user pressed Ctrl-C during the second batch
        return real(batch)

    monkeypatch.setattr(ex, "_collate", dying_collate)
    res = CliRunner().invoke(cli, _args(tiny_folder_dataset, out))
    assert res.exit_code != 0  # click reports "Aborted!" for Ctrl-C
    monkeypatch.setattr(ex, "_collate", real)
    with open_store(out) as st:
        assert (st.status() == 1).sum() == 2  # the first batch landed
    res = _invoke(_args(tiny_folder_dataset, out))
    assert res.exit_code == 0, res.output
    assert "4 videos encoded, 2 already done" in res.output
    with open_store(full) as a, open_store(out) as b:
        np.testing.assert_array_equal(a.load_split("train").frames, b.load_split("train").frames)
        np.testing.assert_array_equal(a.load_split("test").text, b.load_split("test").text)


def test_mismatched_config_is_refused(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "store.h5"
    assert _invoke(_args(tiny_folder_dataset, out)).exit_code == 0
    res = CliRunner().invoke(cli, _args(tiny_folder_dataset, out, "--frames", "8"))
    assert res.exit_code != 0
    assert "frames" in res.output and "--overwrite" in res.output
    assert "Traceback" not in res.output
    res = _invoke(_args(tiny_folder_dataset, out, "--frames", "8", "--overwrite"))
    assert res.exit_code == 0, res.output
    with open_store(out) as st:
        assert st.manifest["frames"] == 8


def test_every_video_failing_exits_nonzero(tmp_path: Path) -> None:
    from dab_pipeline.synthetic import write_corrupt_video

    (tmp_path / "videos").mkdir()
    write_corrupt_video(tmp_path / "videos" / "a.mp4")
    write_corrupt_video(tmp_path / "videos" / "b.mp4", kind="empty")
    (tmp_path / "captions.csv").write_text("video,caption,split\na.mp4,x,test\nb.mp4,y,test\n")
    res = CliRunner().invoke(cli, _args(tmp_path / "captions.csv", tmp_path / "s.h5"))
    assert res.exit_code != 0
    assert "every video failed" in res.output


def test_user_errors_are_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["extract", "--dataset", "nope", "--out", str(tmp_path / "s.h5")])
    assert res.exit_code != 0 and "msrvtt" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["extract", "--dataset", "msvd", "--annotations", str(tmp_path / "absent"),
                                   "--videos", str(tmp_path), "--out", str(tmp_path / "s.h5")])
    assert res.exit_code != 0 and "absent" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["extract", "--dataset", "folder", "--annotations", str(tmp_path / "c.csv"),
                                   "--out", str(tmp_path / "s.txt")])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_inspect_prints_manifest(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "store.h5"
    assert _invoke(_args(tiny_folder_dataset, out)).exit_code == 0
    res = _invoke(["inspect", str(out)])
    assert res.exit_code == 0 and "dab-tiny" in res.output
    res = _invoke(["inspect", "--json", str(out)])
    import json

    data = json.loads(res.output)
    assert data["manifest"]["frames"] == 12


def test_dtype_auto_resolution() -> None:
    from dab_pipeline.errors import ConfigError
    from dab_pipeline.stages.extract import resolve_compute_dtype

    assert resolve_compute_dtype("auto", "cpu") == "float32"
    assert resolve_compute_dtype("bfloat16", "cpu") == "bfloat16"
    if torch.cuda.is_available():
        assert resolve_compute_dtype("auto", "cuda") == "autocast-bf16"
    else:
        with pytest.raises(ConfigError, match="CUDA is not available"):
            resolve_compute_dtype("auto", "cuda")


def test_worker_processes_give_the_same_store(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "w0.h5", tmp_path / "w2.h5"
    assert _invoke(_args(tiny_folder_dataset, a)).exit_code == 0
    threads = torch.get_num_threads()
    args = [x if x != "0" else "2" for x in _args(tiny_folder_dataset, b)]  # --workers 2
    assert "--workers" in args and args[args.index("--workers") + 1] == "2"
    assert _invoke(args).exit_code == 0
    assert torch.get_num_threads() == threads  # the encoder's thread budget is restored
    with open_store(a) as sa, open_store(b) as sb:
        np.testing.assert_array_equal(sa.load_split("train").frames, sb.load_split("train").frames)
