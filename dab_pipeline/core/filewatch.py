"""Has a file changed since it was opened? A cheap identity (device, inode, size, mtime) taken once, compared later.

A long-lived reader (``dab serve``) keeps its files open: a file truncated, deleted or copied over
under it still reads, from the open handle or as zeros, and would be answered from. One ``stat`` a
file per check (microseconds) finds each of those.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable, NamedTuple, Optional

__all__ = ["FileIdentity", "FileWatch", "identity"]


class FileIdentity(NamedTuple):
    dev: int
    ino: int
    size: int  # folders: 0 (their sizes are file system detail)
    mtime_ns: int  # folders: 0 (new entries, such as lock files, do not change what is read)
    ctime_ns: int  # any write or metadata change sets it, and no user call can set it back (cp -p, touch -d)
    is_dir: bool


def identity(path: Path) -> Optional[FileIdentity]:
    """``path``'s identity, or None when it does not exist (or cannot be stat-ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return FileIdentity(st.st_dev, st.st_ino, 0, 0, 0, True)
    return FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, False)


def _what_changed(path: Path, was: FileIdentity, now: Optional[FileIdentity]) -> str:
    if now is None:
        return f"{path} is gone"
    if (now.dev, now.ino) != (was.dev, was.ino):
        return f"{path} was replaced by another file"
    if now.size != was.size:
        return f"{path} changed size: {now.size:,} bytes, {was.size:,} when it was opened (truncated or rewritten)"
    return f"{path} was modified after it was opened"


class FileWatch:
    """The identities of ``paths`` now; :meth:`changed` says which one is no longer the same."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self._seen: dict[Path, FileIdentity] = {}
        for p in paths:
            ident = identity(Path(p))
            if ident is None:
                raise FileNotFoundError(f"{p} does not exist")
            self._seen[Path(p)] = ident

    @property
    def paths(self) -> list[Path]:
        return list(self._seen)

    def changed(self) -> Optional[str]:
        """A sentence naming the first watched path that changed, or None when every one is as it was."""
        for p, was in self._seen.items():
            now = identity(p)
            if now != was:
                return _what_changed(p, was, now)
        return None
