"""Stage one end to end: `dab extract` on generated videos with the tiny CLIP."""

from __future__ import annotations

import csv
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline.store import open_store

from ..helpers.runner import extract_args, invoke


def _args(captions: Path, out: Path, *extra: str) -> list[str]:
    return extract_args(captions, "--store-dtype", "float32", "--quiet", *extra, out=out)


def _invoke(args: list[str]):
    return invoke(args, catch_exceptions=False)


@pytest.fixture()
def broken_dataset(tiny_folder_dataset: Path, tmp_path: Path) -> Path:
    """The tiny dataset plus one corrupt video and one listed but missing video."""
    from ..helpers.videos import write_corrupt_video

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
    res = _invoke(_args(tiny_folder_dataset, out, "--dtype", "float32"))  # auto may pick bf16 on this CPU
    assert res.exit_code == 0, res.output
    assert "6 videos encoded" in res.output
    bundle = load_clip("dab-tiny", None)
    with open_store(out) as st:
        assert st.manifest["model"] == "dab-tiny" and st.manifest["frames"] == 12
        assert st.manifest["weights_sha256"] == bundle.weights_sha256
        assert st.manifest["compute_dtype"] == "float32"
        vids = list(st.video_ids)
        frames, mask = st.read_videos(np.arange(len(vids)))
        split = st.load_split("train")
    root = tiny_folder_dataset.parent / "videos"
    for i, vid in enumerate(vids):
        # open_clip's own pipeline: its transform resizes the full-resolution frame (dab's default)
        dec = decode_video(root / f"{vid}.mp4", num_frames=12, short_side=None)
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
            # the same command in one process (same batches, same threads), only the backend differs: bit-equal
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


def test_resume_after_interruption_equals_one_run(
    tiny_folder_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dab_pipeline.stages.extract as ex

    full = tmp_path / "full.h5"
    assert _invoke(_args(tiny_folder_dataset, full)).exit_code == 0

    out = tmp_path / "resumed.h5"
    real = ex.collate_items
    calls = {"n": 0}

    def dying_collate(batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # the user pressed Ctrl-C during the second batch
        return real(batch)

    monkeypatch.setattr(ex.workers, "collate_items", dying_collate)
    res = invoke(_args(tiny_folder_dataset, out))
    assert res.exit_code != 0  # click reports "Aborted!" for Ctrl-C
    monkeypatch.setattr(ex.workers, "collate_items", real)
    with open_store(out) as st:
        assert (st.status() == 1).sum() == 2  # the first batch landed
    res = _invoke(_args(tiny_folder_dataset, out))
    assert res.exit_code == 0, res.output
    assert "4 videos encoded, 2 already done" in res.output
    with open_store(full) as a, open_store(out) as b:
        # a resume encodes the rest in the batches one run has (videos 2 + 2 + 2, captions 12): bit-equal on any CPU
        np.testing.assert_array_equal(a.load_split("train").frames, b.load_split("train").frames)
        np.testing.assert_array_equal(a.load_split("test").text, b.load_split("test").text)


def test_mismatched_config_is_refused(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "store.h5"
    assert _invoke(_args(tiny_folder_dataset, out)).exit_code == 0
    res = invoke(_args(tiny_folder_dataset, out, "--frames", "8"))
    assert res.exit_code != 0
    assert "frames" in res.output and "--overwrite" in res.output
    assert "Traceback" not in res.output
    res = _invoke(_args(tiny_folder_dataset, out, "--frames", "8", "--overwrite"))
    assert res.exit_code == 0, res.output
    with open_store(out) as st:
        assert st.manifest["frames"] == 8


def test_every_video_failing_exits_nonzero(tmp_path: Path) -> None:
    from ..helpers.videos import write_corrupt_video

    (tmp_path / "videos").mkdir()
    write_corrupt_video(tmp_path / "videos" / "a.mp4")
    write_corrupt_video(tmp_path / "videos" / "b.mp4", kind="empty")
    (tmp_path / "captions.csv").write_text("video,caption,split\na.mp4,x,test\nb.mp4,y,test\n")
    res = invoke(_args(tmp_path / "captions.csv", tmp_path / "s.h5"))
    assert res.exit_code != 0
    assert "every video failed" in res.output


def test_user_errors_are_one_line(tmp_path: Path) -> None:
    res = invoke(["extract", "--dataset", "nope", "--out", str(tmp_path / "s.h5")])
    assert res.exit_code != 0 and "msrvtt" in res.output and "Traceback" not in res.output
    res = invoke(
        [
            "extract",
            "--dataset",
            "msvd",
            "--annotations",
            str(tmp_path / "absent"),
            "--videos",
            str(tmp_path),
            "--out",
            str(tmp_path / "s.h5"),
        ]
    )
    assert res.exit_code != 0 and "absent" in res.output and "Traceback" not in res.output
    res = invoke(
        ["extract", "--dataset", "folder", "--annotations", str(tmp_path / "c.csv"), "--out", str(tmp_path / "s.txt")]
    )
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
    from dab_pipeline.core.errors import ConfigError
    from dab_pipeline.runtime.capabilities import capabilities
    from dab_pipeline.stages.extract import resolve_compute_dtype

    native = capabilities("cpu").bf16  # the both-ways cases are in test_capabilities.py
    assert resolve_compute_dtype("auto", "cpu") == ("bfloat16" if native else "float32")
    assert resolve_compute_dtype("float32", "cpu") == "float32"
    if torch.cuda.is_available():
        assert resolve_compute_dtype("auto", "cuda") in ("autocast-bf16", "float16")
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
        # the encoder ran on another number of threads (the workers take cores): its products may round otherwise
        np.testing.assert_allclose(sa.load_split("train").frames, sb.load_split("train").frames, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- real-world failures


def _one_video_dataset(root: Path, write) -> Path:
    (root / "videos").mkdir(parents=True)
    write(root / "videos")
    names = sorted(p.name for p in (root / "videos").iterdir())
    with open(root / "captions.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["video", "caption", "split"])
        for i, name in enumerate(names):
            w.writerow([name, f"caption of {name}", "train" if i % 2 == 0 else "test"])
    return root / "captions.csv"


@pytest.mark.parametrize("setting", ["decode_backend=pyav-seek", "decode_short_side=0", "decode_short_side=64"])
def test_resume_refuses_decode_settings_that_change_the_features(
    tiny_folder_dataset: Path, tmp_path: Path, setting: str
) -> None:
    out = tmp_path / "store.h5"
    assert _invoke(_args(tiny_folder_dataset, out, "--limit", "3")).exit_code == 0
    res = invoke(_args(tiny_folder_dataset, out, "--limit", "3", "--set", setting))
    assert res.exit_code != 0 and "decoder" in res.output and "--overwrite" in res.output, res.output
    assert "resuming" not in res.output


def test_store_of_an_older_decoder_is_not_resumed(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    """A store written before the decoder rules (decord by default) has no "decoder" entry: refused."""
    from dab_pipeline.stages.extract import COMPATIBILITY_KEYS
    from dab_pipeline.store import manifest_compatible

    new = {"decoder": {"backend": "pyav", "short_side": 32, "rules": 2}}
    old = {"decode_short_side": 32, "config": {"decode_backend": "decord"}}
    assert "decoder" in COMPATIBILITY_KEYS and manifest_compatible(old, new, ["decoder"]) == ["decoder"]


def test_unwritable_out_is_one_line(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for out in (blocker / "store.h5", blocker / "sub" / "store.zarr"):
        res = invoke(_args(tiny_folder_dataset, out))
        assert res.exit_code != 0 and "Traceback" not in res.output
        assert str(blocker) in res.output and "not a folder" in res.output
        assert len(res.output.strip().splitlines()) == 1, res.output


def test_read_only_file_system_is_named_even_when_cleanup_fails(
    tiny_folder_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EROFS at creation, and the cleanup's own unlink fails too: the user still sees the real cause."""
    import errno

    import dab_pipeline.store as store_mod

    def read_only(tmp, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp))

    def cannot_unlink(p):
        raise OSError(errno.EROFS, "Read-only file system", str(p))

    monkeypatch.setattr(store_mod.H5Backend, "create", staticmethod(read_only))
    monkeypatch.setattr(store_mod.create, "remove_path", cannot_unlink)  # the module that creates stores
    out = tmp_path / "store.h5"
    res = invoke(_args(tiny_folder_dataset, out))
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert f"cannot create {out}: Read-only file system" in res.output


def test_disk_full_during_extraction_is_one_line_and_resumable(
    tiny_folder_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from dab_pipeline.store import FeatureStore

    real = FeatureStore.write_videos
    calls = {"n": 0}

    def full_disk(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FeatureStore, "write_videos", full_disk)
    out = tmp_path / "store.h5"
    res = invoke(_args(tiny_folder_dataset, out))
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert f"cannot write {out}: no space left on device" in res.output and "rerun the same command" in res.output
    monkeypatch.setattr(FeatureStore, "write_videos", real)
    res = _invoke(_args(tiny_folder_dataset, out))
    assert res.exit_code == 0 and "2 already done" in res.output, res.output


def test_truncated_video_is_stored_with_a_warning(tmp_path: Path) -> None:
    from ..helpers.videos import truncate_file, write_index_video

    def write(folder: Path) -> None:
        full = write_index_video(tmp_path / "full.mp4", 300, (64, 48), noise=12, faststart=True)
        truncate_file(full, folder / "cut.mp4", keep=0.4)
        write_index_video(folder / "whole.mp4", 40, (64, 48))

    captions = _one_video_dataset(tmp_path / "data", write)
    out = tmp_path / "store.h5"
    res = _invoke(_args(captions, out))
    assert res.exit_code == 0, res.output
    assert "2 videos encoded" in res.output and "1 of this run's videos have decoder warnings" in res.output
    assert "cut: " in res.output and "truncated" in res.output
    with open_store(out) as st:
        notes = dict(st.warnings())
        assert list(notes) == ["cut"] and "header declares 300" in notes["cut"]
        assert st.summary()["videos_with_warnings"] == 1
        assert (st.status() == 1).all()
    res = _invoke(["inspect", str(out)])
    assert "decoder warnings (1)" in res.output and "truncated" in res.output


def test_rerun_of_an_all_failed_extraction_fails_the_same_way(tmp_path: Path) -> None:
    from ..helpers.videos import write_corrupt_video

    (tmp_path / "videos").mkdir()
    for name in ("a", "b", "c", "d"):
        write_corrupt_video(tmp_path / "videos" / f"{name}.mp4")
    (tmp_path / "captions.csv").write_text(
        "video,caption,split\n" + "".join(f"{n}.mp4,caption {n},test\n" for n in "abcd")
    )
    args = _args(tmp_path / "captions.csv", tmp_path / "s.h5")
    first = invoke(args)
    again = invoke(args)
    for res in (first, again):
        text = " ".join(res.output.split())
        assert res.exit_code == 1 and "every video failed (4 failed, 0 missing on disk)" in text, res.output
        assert "a.mp4" in res.output  # the first reason, also when it was recorded by an earlier run
        assert "retries failed and missing videos" in text


def test_a_rerun_retries_failed_and_missing_videos(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    """Replacing a broken or absent file and running the same command again is how a user repairs a store."""
    from ..helpers.videos import write_corrupt_video

    videos = tmp_path / "videos"
    shutil.copytree(tiny_folder_dataset.parent / "videos", videos)
    captions = tmp_path / "captions.csv"
    shutil.copy(tiny_folder_dataset, captions)
    names = sorted(p.name for p in videos.iterdir())
    good = {n: (videos / n).read_bytes() for n in names[:2]}
    write_corrupt_video(videos / names[0])
    (videos / names[1]).unlink()
    out = tmp_path / "s.h5"
    assert _invoke(_args(captions, out)).exit_code == 0
    with open_store(out) as st:
        assert (st.status() == 2).sum() == 1 and (st.status() == 3).sum() == 1
    for name, data in good.items():  # the user puts the right files back
        (videos / name).write_bytes(data)
    res = _invoke(_args(captions, out))
    assert res.exit_code == 0 and "2 videos encoded" in " ".join(res.output.split()), res.output
    with open_store(out) as st:
        assert (st.status() == 1).all()


def test_an_extraction_whose_videos_are_all_missing_says_so(tmp_path: Path) -> None:
    (tmp_path / "videos").mkdir()
    (tmp_path / "captions.csv").write_text("video,caption,split\na.mp4,x,test\nb.mp4,y,test\n")
    res = invoke(_args(tmp_path / "captions.csv", tmp_path / "s.h5"))
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and "(0 failed, 2 missing on disk)" in text and "no video file was found" in text
    assert "n/a" not in text and str(tmp_path / "videos" / "a.mp4") in text


def test_summary_reports_time_and_rate(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    import re

    res = _invoke(_args(tiny_folder_dataset, tmp_path / "s.h5"))
    m = re.search(r"6 videos in ([0-9.]+) s \(([0-9.]+) videos/s\); ([0-9.]+) s in all", res.output)
    assert m, res.output
    seconds, rate, total = map(float, m.groups())
    # within the printed rounding of both numbers (seconds to 0.005, the rate to 0.05)
    assert 6 / (seconds + 0.005) - 0.05 <= rate <= 6 / max(seconds - 0.005, 1e-3) + 0.05
    assert total >= seconds


def test_ctrl_c_says_how_to_resume(tiny_folder_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dab_pipeline.stages.extract as ex

    def interrupted(batch):
        raise KeyboardInterrupt

    monkeypatch.setattr(ex.workers, "collate_items", interrupted)
    res = invoke(_args(tiny_folder_dataset, tmp_path / "s.h5"))
    assert res.exit_code == 130
    assert "rerun the same command to resume" in res.output and "Aborted" not in res.output


def test_zarr_store_is_clean_for_plain_zarr_readers(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    import warnings

    import zarr

    out = tmp_path / "s.zarr"
    assert _invoke(_args(tiny_folder_dataset, out)).exit_code == 0
    with open_store(out, "a"):  # a writer holds its lock: still nothing foreign inside the hierarchy
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            members = dict(zarr.open_group(str(out), mode="r").members(max_depth=None))
    assert "videos/frames" in members
    assert not [p for p in out.rglob("*") if p.name.endswith(".lock")]


@pytest.mark.parametrize("decoder", ["pyav", "decord"])
def test_no_ffmpeg_console_noise_for_files_dab_handles(
    tmp_path: Path, capfd: pytest.CaptureFixture, decoder: str
) -> None:
    """FFmpeg and decord print to the process's stderr (fd 2) unless silenced; dab reports what matters."""
    from ..helpers.videos import damage_video, truncate_file, write_corrupt_video, write_index_video

    def write(folder: Path) -> None:
        clean = write_index_video(tmp_path / "clean.mp4", 150, (64, 48), fmt="x264-bframes")
        damage_video(clean, folder / "damaged.mp4", packets=range(60, 70), mode="garbage")
        full = write_index_video(tmp_path / "full.mp4", 300, (64, 48), noise=12, faststart=True)
        truncate_file(full, folder / "cut.mp4", keep=0.4)  # decord cannot open it; PyAV reads it
        write_corrupt_video(folder / "garbage.mp4")
        write_index_video(folder / "fine.mp4", 30, (64, 48))

    captions = _one_video_dataset(tmp_path / "data", write)
    capfd.readouterr()
    res = _invoke(_args(captions, tmp_path / "s.h5", "--decoder", decoder))
    assert res.exit_code == 0, res.output
    err = capfd.readouterr().err
    for noise in ("decode_slice_header", "ERROR opening", "error while decoding", "concealing", "Invalid data"):
        assert noise not in err, err[-2000:]


def test_store_resumes_with_another_weights_cache(
    tiny_folder_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dab-tiny's weights are generated per cache folder; the same seed must give the same bytes (sha256)."""
    out = tmp_path / "store.h5"
    monkeypatch.setenv("DAB_CACHE", str(tmp_path / "cache-a"))
    assert _invoke(_args(tiny_folder_dataset, out, "--limit", "3")).exit_code == 0
    with open_store(out, "a") as st:  # make it incomplete: one video pending again
        st.set_status(np.array([2]), 0)
    monkeypatch.setenv("DAB_CACHE", str(tmp_path / "cache-b"))
    res = _invoke(_args(tiny_folder_dataset, out, "--limit", "3"))
    assert res.exit_code == 0, res.output
    assert "1 videos encoded, 2 already done" in res.output


def test_single_process_over_part_files_of_a_torchrun_job_warns_and_leaves_them(
    tiny_folder_dataset: Path, tmp_path: Path
) -> None:
    from dab_pipeline.runtime.distributed import part_files, part_path

    out = tmp_path / "store.h5"
    part = part_path(out, 1, 2)
    part.write_bytes(b"an unfinished rank's part")
    res = _invoke(_args(tiny_folder_dataset, out, "--limit", "2"))
    assert res.exit_code == 0, res.output
    assert "2-process extraction" in res.output and "torchrun --nproc-per-node 2" in res.output
    assert [p for p, _, _ in part_files(out)] == [part] and part.read_bytes() == b"an unfinished rank's part"
    with open_store(out) as st:
        assert st.is_complete


def test_a_lost_zarr_chunk_is_found_and_the_same_command_extracts_it_again(
    tiny_folder_dataset: Path, tmp_path: Path
) -> None:
    out = tmp_path / "store.zarr"
    assert _invoke(_args(tiny_folder_dataset, out)).exit_code == 0
    with open_store(out) as st:
        frames_before = st.load_split("train").frames
        chunk = st.raw_backend.raw_chunks("videos/frames").chunk_file(0)
    os.remove(chunk)
    res = invoke(["inspect", str(out), "--verify"])
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and "damaged: 1 chunk file(s)" in text and "is missing" in text, res.output
    res = _invoke(_args(tiny_folder_dataset, out))
    assert res.exit_code == 0 and "had lost chunk files" in " ".join(res.output.split()), res.output
    res = invoke(["inspect", str(out), "--verify"])
    assert res.exit_code == 0 and "verify: every written array reads back" in " ".join(res.output.split())
    with open_store(out) as st:
        # the chunk held every video: all 6 encoded again in the same batches, the same computation: bit-equal
        np.testing.assert_array_equal(st.load_split("train").frames, frames_before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_decode_workers_die_with_their_parent(tmp_path: Path) -> None:
    """A SIGKILLed extraction must not leave workers that hold the store's lock for seconds."""
    import signal
    import subprocess
    import time

    code = (
        "import os, sys, time\n"
        "from dab_pipeline.stages.extract.workers import die_with_parent\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = die_with_parent()\n"
        "    print(os.getpid(), ok, flush=True)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child, ok = parent.stdout.readline().split()
    assert ok == "True"
    parent.send_signal(signal.SIGKILL)
    parent.wait()

    def gone() -> bool:
        try:
            return Path(f"/proc/{child}/stat").read_text().split(") ")[1][0] in "ZX"
        except (OSError, IndexError):
            return True

    deadline = time.time() + 5
    while not gone() and time.time() < deadline:
        time.sleep(0.02)
    assert gone(), "the worker outlived its parent"


def test_a_store_that_resized_at_decode_time_resumes_with_its_setting(
    tiny_folder_dataset: Path, tmp_path: Path
) -> None:
    """Before dab resized as open_clip does, it resized in swscale at decode time: such a store says how to resume."""
    out = tmp_path / "store.h5"
    assert _invoke(_args(tiny_folder_dataset, out, "--limit", "3", "--set", "decode_short_side=0")).exit_code == 0
    res = invoke(_args(tiny_folder_dataset, out, "--limit", "3"))
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "resume it with --set decode_short_side=0" in text, res.output
    res = _invoke(_args(tiny_folder_dataset, out, "--limit", "3", "--set", "decode_short_side=0"))
    assert res.exit_code == 0 and "0 videos encoded" in " ".join(res.output.split())


def test_build_extract_config_decides_what_the_cli_used_to(tmp_path: Path) -> None:
    """The stage's builder, not the CLI, picks a model's default weights and what trainable_blocks=all means."""
    from dab_pipeline.clip_models import full_depth
    from dab_pipeline.core.errors import ConfigError
    from dab_pipeline.stages.extract import build_extract_config

    out = tmp_path / "s.h5"
    assert build_extract_config("folder", out, options={"model": "ViT-B-32"}).pretrained == "openai"
    assert build_extract_config("folder", out, options={"model": "dab-tiny", "pretrained": None}).pretrained is None
    assert build_extract_config("folder", out, options={"pretrained": "none"}).pretrained is None
    cfg = build_extract_config(
        "folder",
        out,
        options={"model": "dab-tiny", "trainable_blocks": "all", "frames": None},
        overrides=["batch_size=3"],
    )
    assert cfg.trainable_blocks == full_depth("dab-tiny") and cfg.frames == 12 and cfg.batch_size == 3
    with pytest.raises(ConfigError, match="expected a number of blocks or 'all'"):
        build_extract_config("folder", out, options={"trainable_blocks": "some"})


def test_a_rerun_with_only_the_required_options_resumes_a_store_made_with_other_values(
    tiny_folder_dataset: Path, tmp_path: Path
) -> None:
    """Rerunning is extract's resume: an option left out keeps the store's value; only a typed one can differ."""
    out = tmp_path / "store.h5"
    # _args also types --store-dtype float32, --batch-size 2 and --workers 0: none of them the default
    assert _invoke(_args(tiny_folder_dataset, out, "--frames", "8")).exit_code == 0
    bare = [
        "extract",
        "--dataset",
        "folder",
        "--annotations",
        tiny_folder_dataset,
        "--videos",
        tiny_folder_dataset.parent / "videos",
        "--out",
        out,
        "--quiet",
    ]
    res = invoke(bare)  # no --model, --frames or --store-dtype: the store's dab-tiny, 8 and float32
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and "0 videos encoded, 6 already done" in text, res.output
    assert f"options not given, taken from {out}: frames=8, model=dab-tiny, store_dtype=float32" in text  # said
    res = invoke([*bare, "--frames", "4"])
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "(frames differ)" in text and "--overwrite" in text, res.output
    with open_store(out) as st:
        assert st.manifest["frames"] == 8 and st.manifest["store_dtype"] == "float32"


def test_a_nul_in_a_caption_is_a_space_in_the_dry_run_and_the_store(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    """Issue 50, 3: a caption with a NUL byte crashed HDF5 extraction ("VLEN strings do not support embedded
    NULLs") while --dry-run passed it."""
    root = tmp_path / "nul"
    shutil.copytree(tiny_folder_dataset.parent, root)
    text = (root / "captions.csv").read_text().replace("clip number 0 with", "clip\x00number 0\x07with", 1)
    (root / "captions.csv").write_text(text)
    dry = invoke(extract_args(root / "captions.csv", "--dry-run", out=tmp_path / "dry.h5"))
    assert dry.exit_code == 0 and "1 captions held NUL or other control characters" in dry.output
    out = invoke(_args(root / "captions.csv", tmp_path / "s.h5"))
    assert out.exit_code == 0, out.output
    with open_store(tmp_path / "s.h5") as st:
        texts = [str(t) for t in st.caption_text]
    assert "clip number 0 with 5 frames" in texts and not any("\x00" in t or "\x07" in t for t in texts)
