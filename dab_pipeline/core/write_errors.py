"""Failed writes, named: a full disk, a read-only file system or a folder without write permission, in one line.

The libraries dab writes through do not all say why a write failed: h5py wraps the
errno in a RuntimeError's text ("errno = 28"), torch says "unexpected pos 117504 vs
117392", faiss "write error ... 16339 != 102400". So on any failed write the target's
file system is asked: free space, read-only flag, write permission. Ask *before*
removing what the failed write left (a half temp file frees the space it took).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path
from typing import Iterator, Optional

from .errors import DabError, WriteError

__all__ = [
    "write_failure",
    "named_write_errors",
    "free_bytes",
    "check_free_space",
    "human_bytes",
    "LOW_SPACE",
    "reserve_file",
    "reserve_blocks",
]

# Under this much free space a failed write is put down to the full disk: a write that
# failed for another reason on a nearly full disk would fail again after the user frees space.
LOW_SPACE = 1 << 20
_FULL_WORDS = ("no space left on device", "disk quota exceeded", "not enough space")
_ERRNO_IN_TEXT = re.compile(r"errno\s*=\s*(\d+)")


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor (the folder a new file would go into)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: Path) -> Optional[int]:
    """Bytes this process may still write on ``path``'s file system (root may use the reserved blocks); None
    when the file system cannot tell."""
    try:
        st = os.statvfs(nearest_existing(path))
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return int(blocks) * int(st.f_frsize)


def human_bytes(n: Optional[int]) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def _errno_of(exc: BaseException) -> Optional[int]:
    code = getattr(exc, "errno", None)
    if isinstance(code, int):
        return code
    m = _ERRNO_IN_TEXT.search(str(exc))  # HDF5's "file write failed: ..., errno = 28, ..."
    return int(m.group(1)) if m else None


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _folder(path: Path) -> Path:
    """The folder a write of ``path`` goes into (``path`` itself when it is one)."""
    path = Path(path)
    return path if path.is_dir() else nearest_existing(path.parent)


def _no_space(path: Path) -> str:
    where = _folder(path)
    return f"no space left on device ({human_bytes(free_bytes(where))} free in {where})"


# How the libraries word a failed write when they give no errno: torch's zip writer ("unexpected pos 117504 vs
# 117392"), faiss ("write error 16339 != 102400"), HDF5 ("file write failed", "Can't synchronously write").
_WRITE_WORDS = re.compile(
    r"unexpected pos|write error|write failed|can't (synchronously )?write|short write|"
    r"unable to (synchronously )?flush",
    re.IGNORECASE,
)


def write_cause(exc: BaseException, path: Path) -> Optional[str]:
    """Why writing ``path`` failed with ``exc``, in words, when the file system is the cause; None otherwise.

    An errno says it; without one, only an error worded as a failed write is put down to a full or read-only
    disk (a CUDA out-of-memory or a shape error on a nearly full disk stays what it is)."""
    code, text = _errno_of(exc), str(exc).lower()
    folder = _folder(Path(path))
    if code in (errno.ENOSPC, errno.EDQUOT) or any(w in text for w in _FULL_WORDS):
        return _no_space(Path(path))
    if code == errno.EROFS:
        return "read-only file system"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied (no write permission in {folder})"
    if code is not None or not _WRITE_WORDS.search(text):
        return None
    if _read_only(folder):
        return "read-only file system"
    free = free_bytes(folder)
    if free is not None and free < LOW_SPACE:
        return _no_space(Path(path))
    return None


def write_failure(exc: BaseException, path: Path, hint: str = "") -> Optional[WriteError]:
    """A :class:`WriteError` naming ``path`` and the cause of ``exc`` (one line), or None when the file system
    shows no cause (then the original error is a bug and keeps its traceback). ``hint``: what to do next."""
    if isinstance(exc, WriteError):
        return exc
    cause = write_cause(exc, Path(path))
    if cause is None:
        return None
    return WriteError(f"cannot write {path}: {cause}" + (f"; {hint}" if hint else ""))


@contextlib.contextmanager
def named_write_errors(path: Path, hint: str = "") -> Iterator[None]:
    """Turn a failed write of ``path`` inside the block into a :class:`WriteError` with its cause.

    Any exception is looked at (libraries wrap errno in RuntimeErrors); one the file system does not
    explain is re-raised unchanged, and so is every :class:`DabError` but a WriteError without the hint.
    """
    try:
        yield
    except WriteError as exc:
        if hint and hint not in str(exc):
            raise WriteError(f"{exc}; {hint}") from None
        raise
    except DabError:
        raise
    except (OSError, RuntimeError) as exc:  # torch, faiss and h5py raise RuntimeErrors for failed writes
        err = write_failure(exc, path, hint)
        if err is None:
            raise
        raise err from exc


def check_free_space(path: Path, need: int, hint: str = "") -> None:
    """Refuse, before writing, a write of ``need`` bytes under ``path`` that the disk cannot take.

    Some writers cannot fail cleanly part way (an HDF5 file whose write failed cannot be closed, and
    HDF5 crashes at exit; a memory map on a full tmpfs gets SIGBUS): they ask first."""
    where = _folder(Path(path))
    free = free_bytes(where)
    if free is not None and free < need:
        raise WriteError(
            f"cannot write {path}: no space left on device ({human_bytes(free)} free in {where}, "
            f"{human_bytes(need)} needed)" + (f"; {hint}" if hint else "")
        )


def reserve_file(path: Path, size: int, hint: str = "") -> None:
    """Give the existing file ``path`` its first ``size`` bytes on disk now (``posix_fallocate``).

    For files written through a memory map: a write into a sparse page the disk cannot hold is not an
    error but a SIGBUS that kills the process. Where the file system cannot reserve, the free space is
    checked instead."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise write_failure(exc, path, hint) or exc
    try:
        if not reserve_blocks(fd, path, 0, size, hint=hint):
            check_free_space(path, size - os.fstat(fd).st_blocks * 512, hint)
    finally:
        os.close(fd)


_FALLOC_FL_KEEP_SIZE = 1
_libc_fallocate = None


def _linux_fallocate():
    """libc's ``fallocate`` (Linux), for reserving blocks past the end of a file without changing its size."""
    global _libc_fallocate
    if _libc_fallocate is None:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            fn.restype = ctypes.c_int
            _libc_fallocate = fn
        except (OSError, AttributeError):
            _libc_fallocate = False
    return _libc_fallocate or None


def reserve_blocks(fd: int, path: Path, offset: int, length: int, *, past_end: bool = False, hint: str = "") -> bool:
    """Give bytes ``[offset, offset + length)`` of the open file ``fd`` their disk blocks now, so that a write
    there cannot fail for space; ``past_end``: blocks after the end of the file, its size unchanged (room for a
    file that grows). A :class:`WriteError` when the disk cannot hold them; False where the file system cannot
    reserve (the caller checks the free space instead), True when reserved."""
    if length <= 0:
        return True
    import ctypes

    # fallocate(2) itself, not posix_fallocate: where a file system cannot reserve, glibc's posix_fallocate writes
    # a byte into every 4 KiB block instead (hours for a 25 GB file on NFSv3); fallocate says EOPNOTSUPP
    fn = _linux_fallocate()
    if fn is None:
        return False
    if fn(fd, _FALLOC_FL_KEEP_SIZE if past_end else 0, offset, length) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
        return False
    exc = OSError(code, os.strerror(code))
    raise write_failure(exc, path, hint) or WriteError(f"cannot write {path}: {exc.strerror}") from None
