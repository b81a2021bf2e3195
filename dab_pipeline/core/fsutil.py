"""Atomic file writes and publishing: readers (and a run killed mid-write) never see half a file or store."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from .errors import StoreError
from .write_errors import named_write_errors, write_failure


def _umask() -> int:
    # os.umask can only be read by setting it; set it back at once (module-level use, no threads yet).
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file object whose contents replace ``path`` in one rename when the block ends.

    Written via a hidden temp file in the same folder and fsynced; on an error the temp
    file is removed and ``path`` is untouched. The file gets the mode an ordinary
    ``open(path, "w")`` would (0666 less the umask), not mkstemp's private 0600: run
    folders are shared between people. A write the file system refuses (a full disk,
    read-only, no permission) raises a one-line :class:`WriteError` naming ``path``.
    """
    path = Path(path)
    remove_stale_temps(path)
    # the writer's pid in the name: a later write of the same file knows a dead writer's leftover
    with named_write_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        # named before the temp file goes: removing it frees the space whose lack made the write fail
        named = write_failure(exc, path) if isinstance(exc, (OSError, RuntimeError)) else None
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if named is not None:
            raise named from exc
        raise


def remove_stale_temps(path: Path) -> int:
    """Remove the temp files of earlier writes of ``path`` whose writer is dead (a killed run's litter); -> count.

    A temp file of a live process (another writer of the same file, right now) is left alone,
    and so is one whose name carries no pid (written by a dab before pids were recorded) unless
    it is older than a day.
    """
    import time

    removed = 0
    prefix = f".{path.name}."
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return 0
    for entry in entries:
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid_text = name[len(prefix) :].split("-", 1)[0]
        if pid_text.isdigit():
            stale = not _alive(int(pid_text))
        else:
            try:
                stale = time.time() - entry.stat().st_mtime > 86400
            except OSError:
                continue
        if stale:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path) as fh:
        fh.write(data)


_UMASK = _umask()


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` through :func:`atomic_file`.

    Saving to a file object (not a path) also makes the bytes depend on ``obj`` alone:
    torch names the archive inside the file after the path it is given, and the
    temporary path differs on every write.
    """
    import torch

    with atomic_file(path) as fh:
        torch.save(obj, fh)


def remove_path(p: Path) -> None:
    """Remove a file, link or folder tree; missing is fine."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def temp_sibling(path: Path, tag: str) -> Path:
    """A hidden, unique name beside ``path`` (same file system, so a rename publishes it)."""
    return path.parent / f".{path.name}.{tag}-{uuid.uuid4().hex[:12]}"


def publish(tmp: Path, dest: Path, overwrite: bool) -> None:
    """Move a fully built ``tmp`` to ``dest`` in one rename (two for replacing a folder)."""
    exists = dest.exists() or dest.is_symlink()
    if exists and not overwrite:
        raise StoreError(f"{dest} already exists; pass overwrite=True (--overwrite) to replace it")
    if tmp.is_dir() or (exists and dest.is_dir()):
        if exists:
            # A folder cannot be swapped atomically: move the old one aside first.
            # A kill between the renames leaves the old store under .{name}.old-*.
            old = temp_sibling(dest, "old")
            os.rename(dest, old)
            os.rename(tmp, dest)
            remove_path(old)
        else:
            try:
                os.rename(tmp, dest)
            except OSError as e:
                raise StoreError(f"{dest} appeared while the store was being built: {e}") from None
        return
    if overwrite:
        os.replace(tmp, dest)
        return
    try:
        # link() refuses to clobber, closing the race with a concurrent creator.
        os.link(tmp, dest)
    except FileExistsError:
        raise StoreError(f"{dest} already exists; pass overwrite=True (--overwrite) to replace it") from None
    except OSError:
        os.rename(tmp, dest)  # file systems without hard links
        return
    os.unlink(tmp)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """The hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """fsync a folder, so that a rename into it survives a crash (best effort: not every file system can)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
