"""Failed writes named in one line: the helper every writer uses, against injected failures of each library."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

import dab_pipeline.core.write_errors as we
from dab_pipeline.core.errors import WriteError
from dab_pipeline.core.fsutil import atomic_torch_save, atomic_write_text
from dab_pipeline.core.write_errors import check_free_space, named_write_errors, write_failure

H5_TEXT = (
    "Unable to synchronously flush file (file write failed: time = Thu Dec  3 07:41:28 2026, filename = "
    "'s.h5', file descriptor = 3, errno = 28, error message = 'No space left on device', buf = 0x5)"
)


def no_blocks(fd: int, mode: int, offset: int, length: int) -> int:
    """fallocate(2) on a full disk: -1 with errno ENOSPC."""
    import ctypes

    ctypes.set_errno(errno.ENOSPC)
    return -1


@pytest.fixture()
def full_disk(monkeypatch: pytest.MonkeyPatch):
    """The file system reports 100 bytes free."""
    monkeypatch.setattr(we, "free_bytes", lambda path: 100)


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError(H5_TEXT),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
    ],
    ids=["errno", "hdf5", "quota"],
)
def test_a_full_disk_is_named_from_its_errno_or_hdf5s_text(exc: BaseException, tmp_path: Path) -> None:
    err = write_failure(exc, tmp_path / "s.h5")
    assert isinstance(err, WriteError)
    assert str(err).startswith(f"cannot write {tmp_path / 's.h5'}: no space left on device (")
    assert "\n" not in str(err)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 117504 vs 117392"),
        RuntimeError("Error in faiss::FileIOWriter: write error 16339 != 102400"),
    ],
    ids=["torch", "faiss"],
)
def test_errors_without_an_errno_are_named_by_asking_the_file_system(exc, tmp_path: Path, full_disk) -> None:
    err = write_failure(exc, tmp_path / "x.bin", hint="free some space")
    assert err is not None and "no space left on device (100 bytes free in" in str(err)
    assert str(err).endswith("; free some space")


def test_an_error_the_file_system_does_not_explain_is_not_blamed_on_it(tmp_path: Path, full_disk) -> None:
    """Even on a nearly full disk: only errors worded as failed writes are put down to it."""
    assert write_failure(RuntimeError("a bug"), tmp_path / "x.bin") is None
    assert write_failure(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), tmp_path / "x.bin") is None
    assert write_failure(OSError(errno.EBADF, "Bad file descriptor"), tmp_path / "x.bin") is None
    with pytest.raises(RuntimeError, match="a bug"):
        with named_write_errors(tmp_path / "x.bin"):
            raise RuntimeError("a bug")


def test_read_only_and_permission_are_named(tmp_path: Path) -> None:
    assert "read-only file system" in str(write_failure(OSError(errno.EROFS, "Read-only file system"), tmp_path / "a"))
    assert "permission denied" in str(write_failure(PermissionError(errno.EACCES, "Permission denied"), tmp_path / "a"))


def test_the_preflight_refuses_what_the_disk_cannot_take(tmp_path: Path, full_disk) -> None:
    check_free_space(tmp_path, 100)
    with pytest.raises(WriteError, match=r"no space left on device \(100 bytes free in .*, 101 bytes needed\)"):
        check_free_space(tmp_path / "new" / "file.h5", 101)


def test_a_torch_save_that_fails_on_a_full_disk_is_one_line_and_leaves_nothing(
    tmp_path: Path, full_disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    target = tmp_path / "ck" / "last.pt"
    atomic_torch_save({"a": 1}, target)
    old = target.read_bytes()

    def cut_short(obj, fh, *a, **k):
        fh.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 117504 vs 117392")

    monkeypatch.setattr(torch, "save", cut_short)
    with pytest.raises(WriteError, match=f"cannot write {target}: no space left on device"):
        atomic_torch_save({"a": 2}, target)
    assert target.read_bytes() == old and sorted(p.name for p in target.parent.iterdir()) == ["last.pt"]


def test_an_atomic_text_write_that_hits_enospc_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    real = os.fsync

    def enospc(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", enospc)
    with pytest.raises(WriteError, match="status.json: no space left on device"):
        atomic_write_text(tmp_path / "status.json", "{}")
    monkeypatch.setattr(os, "fsync", real)
    assert list(tmp_path.iterdir()) == []


def test_an_hdf5_store_whose_write_fails_is_named_and_closes_without_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write whose blocks cannot be reserved is refused before HDF5 makes it; where the file system cannot
    reserve, the free space is asked; a write that fails all the same (a race) is named, later writes are
    refused, close() does not raise and the file is listed for the CLI's exit."""
    from dab_pipeline.store import backend_h5
    from dab_pipeline.testing import empty_store

    monkeypatch.setattr(backend_h5, "_UNCLOSED", [])
    store = empty_store(tmp_path / "s.h5", 4, dim=8, num_frames=2)  # opened for writing
    frames, mask = np.ones((1, 2, 8), np.float32), np.ones((1, 2), bool)

    monkeypatch.setattr(we, "_linux_fallocate", lambda: no_blocks)
    with pytest.raises(WriteError, match="s.h5: no space left on device"):
        store.write_videos([0], frames, mask, [2])  # the rows' blocks could not be reserved
    monkeypatch.setattr(backend_h5, "reserve_blocks", lambda *a, **k: False)  # a file system that cannot reserve
    monkeypatch.setattr(we, "free_bytes", lambda path: 100)
    with pytest.raises(WriteError, match="no space left on device"):
        store.write_videos([0], frames, mask, [2])  # the free space asked instead
    assert backend_h5.unclosed_files() == []
    monkeypatch.setattr(backend_h5, "check_free_space", lambda *a, **k: None)  # the disk fills after it asked

    class Failing:
        def __setitem__(self, key, value):
            raise RuntimeError(H5_TEXT)

    monkeypatch.setattr(store.raw_backend, "raw", lambda name: Failing())
    monkeypatch.setattr(store.raw_backend, "_span", lambda *a: None)
    with pytest.raises(WriteError, match="s.h5: no space left on device"):
        store.write_videos([0], frames, mask, [2])
    with pytest.raises(WriteError, match="an earlier write to it failed"):
        store.raw_backend.flush()
    backend = store.raw_backend
    real = backend.f
    real.close()  # the file itself is intact here; HDF5's failing close is what comes next

    class Unclosable:
        class id:  # noqa: N801  # h5py's FileID, as close() asks it
            valid = True

        def close(self):
            raise RuntimeError("Can't decrement id ref count (file write failed: ..., errno = 28, ...)")

    monkeypatch.setattr(backend, "f", Unclosable())
    store.close()  # does not raise: the failed write was the error to report
    assert backend_h5.unclosed_files() == [str(tmp_path / "s.h5")]
