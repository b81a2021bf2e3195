"""A full disk in every writer: one line naming the path, nothing that a later command calls complete, and the same
command resumes or starts clean. Injected failures everywhere, and the real thing on a small tmpfs (as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dab_pipeline.core.write_errors as we
from dab_pipeline.testing import random_store

from ..helpers.runner import extract_args, invoke

SMALL = ["model.drift_hidden=16", "model.time_embed_dim=8", "model.steps=2", "batch_size=8", "lr=3e-3"]
TORCH_TEXT = "[enforce fail at inline_container.cc:672] . unexpected pos 117504 vs 117392"
FAISS_TEXT = "Error in faiss::FileIOWriter::operator(): write error 16339 != 102400"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_store(tmp_path_factory.mktemp("full") / "store.h5", n_videos=30, frames=4)


def _train(store: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--features",
        store,
        "--variant",
        "prob",
        "--epochs",
        "2",
        "--out",
        out,
        "--quiet",
        *[x for s in SMALL for x in ("--set", s)],
        *extra,
    ]


def _one_line_error(res) -> str:
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    (line,) = [x for x in res.output.splitlines() if x.startswith("Error:")]
    return line


def _fail_torch_save_at(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """The n-th checkpoint write (from 1) dies as torch does on a full disk; the disk says 100 bytes free."""
    import torch

    real, calls = torch.save, {"n": 0}

    def save(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            monkeypatch.setattr(we, "free_bytes", lambda path: 100)
            raise RuntimeError(TORCH_TEXT)
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)


def test_train_on_a_full_disk_before_its_first_checkpoint_is_one_line_and_starts_over(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    _fail_torch_save_at(monkeypatch, 1)
    line = _one_line_error(invoke(_train(store, out)))
    assert f"cannot write {out / 'checkpoints' / 'last.pt'}: no space left on device (100 bytes free in" in line
    assert "run the same command again" in line
    assert json.loads((out / "status.json").read_text())["state"] == "failed"
    assert not list((out / "checkpoints").iterdir())  # no half checkpoint, no temp file
    monkeypatch.undo()
    res = invoke(_train(store, out))  # --quiet hides "starting over"; the run is complete
    assert res.exit_code == 0, res.output
    assert json.loads((out / "status.json").read_text())["state"] == "complete"


def test_train_on_a_full_disk_after_a_checkpoint_says_resume_and_resume_finishes(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    _fail_torch_save_at(monkeypatch, 3)  # epoch 1's last.pt and best.pt are written, epoch 2's last.pt is not
    line = _one_line_error(invoke(_train(store, out)))
    assert "no space left on device" in line and f"`dab train --resume --out {out}`" in line
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "failed" and status["resumable"] is True
    monkeypatch.undo()
    res = invoke(["train", "--resume", "--out", out, "--quiet"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "status.json").read_text())["state"] == "complete"


def test_a_run_whose_failure_could_not_even_be_recorded_starts_over(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk is so full that status.json cannot say "failed": the folder reads "running", nobody holds it and
    it has no checkpoint, so the same command starts over (no --resume to a checkpoint that does not exist)."""
    from dab_pipeline.core.errors import WriteError
    from dab_pipeline.runs.run_folder import RunFolder

    out = tmp_path / "run"
    _fail_torch_save_at(monkeypatch, 1)
    real = RunFolder.write_status

    def status(self, **data):
        if data.get("state") == "failed":
            raise WriteError(f"cannot write {self.path / 'status.json'}: no space left on device")
        return real(self, **data)

    monkeypatch.setattr(RunFolder, "write_status", status)
    line = _one_line_error(invoke(_train(store, out)))
    assert "last.pt: no space left on device" in line  # the first failure, not the status write's
    assert json.loads((out / "status.json").read_text())["state"] == "running"
    monkeypatch.undo()
    res = invoke(_train(store, out))
    assert res.exit_code == 0, res.output
    assert json.loads((out / "status.json").read_text())["state"] == "complete"


def test_index_on_a_full_disk_is_one_line_leaves_no_index_and_resumes(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faiss = pytest.importorskip("faiss")
    out = tmp_path / "idx"

    def full(index, path):
        monkeypatch.setattr(we, "free_bytes", lambda p: 100)
        raise RuntimeError(FAISS_TEXT)

    monkeypatch.setattr(faiss, "write_index", full)
    args = ["index", "--features", store, "--out", out, "--split", "train", "--chunk", "5"]
    line = _one_line_error(invoke(args))
    assert f"cannot write {out.parent / '.idx.building' / 'index.faiss'}: no space left on device" in line
    assert "the build resumes" in line and not out.exists()
    monkeypatch.undo()
    res = invoke(args)
    assert res.exit_code == 0 and (out / "index.json").is_file(), res.output


def test_video_terms_on_a_full_disk_are_one_line_leave_no_index_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dab index --video-terms: the disk holds the staged vectors but not terms.f16 (written in place through a
    memory map, its blocks reserved first): one line naming it, nothing at --out or in staging, and the same command
    finishes the build (terms included)."""
    pytest.importorskip("faiss")
    import ctypes
    import errno

    from ..helpers.models import hand_made_run

    store = random_store(tmp_path / "s32.h5", n_videos=20, dim=32, frames=4)
    run, _ = hand_made_run(tmp_path / "run", store, "dab")
    out = tmp_path / "idx"
    real = we._linux_fallocate()
    if real is None:
        pytest.skip("no fallocate here")

    def full_for_terms(fd: int, mode: int, offset: int, length: int) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("terms.f16"):
            ctypes.set_errno(errno.ENOSPC)
            return -1
        return real(fd, mode, offset, length)

    monkeypatch.setattr(we, "_linux_fallocate", lambda: full_for_terms)
    args = ["index", "--features", store, "--out", out, "--split", "train", "--run", run, "--video-terms"]
    line = _one_line_error(invoke(args))
    assert f"cannot write {out.parent / '.idx.building' / 'terms.f16'}: no space left on device" in line
    assert not out.exists() and not (tmp_path / ".idx.building").exists()  # what the reservation took is given back
    monkeypatch.undo()
    res = invoke(args)
    assert res.exit_code == 0 and json.loads((out / "index.json").read_text())["terms"] is True, res.output
    assert (out / "terms.f16").stat().st_size == 20 * 32 * 2


def test_a_memory_map_that_cannot_get_its_disk_blocks_is_refused_before_it_is_written(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stores into a sparse page of a full tmpfs are a SIGBUS: the index's vector file is reserved first."""
    pytest.importorskip("faiss")
    import ctypes
    import errno

    def no_blocks(fd: int, mode: int, offset: int, length: int) -> int:
        ctypes.set_errno(errno.ENOSPC)
        return -1

    monkeypatch.setattr(we, "_linux_fallocate", lambda: no_blocks)
    out = tmp_path / "idx"
    line = _one_line_error(invoke(["index", "--features", store, "--out", out, "--split", "train"]))
    assert "vectors.npy: no space left on device" in line
    assert not (tmp_path / ".idx.building").exists()  # what the reservation took is given back


# ----------------------------------------------------------------------------- the real thing on a tmpfs


def _can_mount() -> bool:
    return sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture()
def tmpfs(tmp_path: Path):
    """A small tmpfs at tmp_path/disk; yields it and a function that resizes it."""
    if not _can_mount():
        pytest.skip("mounting a tmpfs needs root on Linux")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("a tmpfs cannot be mounted here")

    def resize(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)

    try:
        yield disk, resize
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


PRE_FLIGHT_OFF = """
import sys
import dab_pipeline.store.backend_h5 as h5
import dab_pipeline.store.create as create
# a file system that cannot reserve blocks, and the race no pre-flight sees: the disk fills after it asked
h5.reserve_blocks = lambda *a, **k: False
h5.check_free_space = create.check_free_space = lambda *a, **k: None
from dab_pipeline.cli import main
sys.argv = ["dab", *sys.argv[1:]]
main()
"""


def _arrays(path: Path) -> dict:
    import h5py

    out: dict = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


@pytest.mark.slow
def test_a_real_full_disk_in_extract_index_and_train(
    tiny_folder_dataset: Path, store: Path, tmp_path: Path, tmpfs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a tmpfs of 16-32 KiB: `dab extract` into HDF5 with nothing reserved (HDF5's own writes fail) exits 1 with
    one line, not with HDF5's SIGSEGV at exit; with its writes reserved it stops before HDF5 writes, as do
    `dab train` and `dab index`; after the disk grows the same commands finish, and the store equals one made
    in one go."""
    from dab_pipeline.store import backend_h5

    disk, resize = tmpfs
    base = extract_args(tiny_folder_dataset, "--store-dtype", "float32", "--quiet")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    # 16 KiB: HDF5's writes fail while the store is created; 32 KiB: it is created (sparse), its writes fail
    for size, name in (("16k", "s0.h5"), ("32k", "race.h5")):
        resize(size)
        full = subprocess.run(
            [sys.executable, "-c", PRE_FLIGHT_OFF, *base, "--out", str(disk / name)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert full.returncode == 1, (size, full.returncode, full.stderr[-2000:])
        line = [x for x in full.stderr.splitlines() if x.startswith("Error:")]
        assert "Traceback" not in full.stderr and len(line) == 1, full.stderr
        assert f"cannot write {disk / name}: no space left on device" in line[0], line
    assert not (disk / "s0.h5").exists()
    race = disk / "race.h5"
    shutil.copyfile(race, tmp_path / "race.h5")  # looked at once the disk has room again
    race.unlink()

    monkeypatch.setattr(backend_h5, "H5_WRITE_SLACK", 4096)  # headroom scaled to a 32 KiB disk
    monkeypatch.setattr(backend_h5, "_UNCLOSED", [])
    res = invoke([*base, "--out", disk / "s.h5"])  # reserved first: refused before HDF5 writes
    assert "no space left on device" in _one_line_error(res) and (disk / "s.h5").exists()
    assert backend_h5.unclosed_files() == []  # HDF5 never saw the full disk: the file closed cleanly
    assert "no space left on device" in _one_line_error(invoke(_train(store, disk / "run")))
    if __import__("importlib").util.find_spec("faiss"):
        res = invoke(["index", "--features", store, "--out", disk / "idx", "--split", "train"])
        assert "no space left on device" in _one_line_error(res)

    resize("4m")
    res = invoke([*base, "--out", disk / "s.h5"])
    assert res.exit_code == 0, res.output
    clean = tmp_path / "clean.h5"
    assert invoke([*base, "--out", clean]).exit_code == 0
    a, b = _arrays(clean), _arrays(disk / "s.h5")
    assert sorted(a) == sorted(b)
    for name in a:  # the same command in one process, nothing encoded before the disk grew: bit-equal on any CPU
        assert np.array_equal(a[name], b[name]), name
    assert invoke(_train(store, disk / "run")).exit_code == 0
    if __import__("importlib").util.find_spec("faiss"):
        assert invoke(["index", "--features", store, "--out", disk / "idx", "--split", "train"]).exit_code == 0
    # HDF5's own failed write may leave its end-of-file record behind its data: then the same command says the
    # store is damaged and how to rebuild it, in one line, and --overwrite rebuilds it
    res = invoke([*base, "--out", tmp_path / "race.h5"])
    if res.exit_code != 0:
        line = _one_line_error(res)
        assert "is damaged" in line and "--overwrite" in line, line
        res = invoke([*base, "--out", tmp_path / "race.h5", "--overwrite"])
    assert res.exit_code == 0, res.output
