"""Whether a server may still answer: its store's and index's files are the ones it opened, and reads of them
have not failed twice."""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from ...core.errors import StoreError
from ...core.filewatch import FileWatch
from ...search import Searcher

__all__ = ["Health", "Unavailable", "log"]

log = logging.getLogger("dab.serve")


class Health:
    """Whether the server may still answer: its store and index files are the ones it opened, and reading them
    has not failed. Once either fails the server answers 503 until it is restarted (an open HDF5 file that was
    truncated, deleted or copied over still reads, as zeros or as the old data)."""

    def __init__(self, searcher: Searcher) -> None:
        self.watch = FileWatch(searcher.identity_files())
        searcher.store.refuse_changes_after(time.time_ns())  # Zarr chunks rewritten in place: refused when read
        self.problem: Optional[str] = None
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise :class:`Unavailable` when the files changed (now or before) or a read failed before."""
        if self.problem is None:
            change = self.watch.changed()
            if change is not None:
                self.fail(change)
        if self.problem is not None:
            raise Unavailable(self.problem)

    def fail(self, what: str) -> None:
        """Record the first problem (logged once) and raise :class:`Unavailable`."""
        with self._lock:
            if self.problem is None:
                self.problem = (
                    f"{what}; this server stops answering from it: restart `dab serve` (after "
                    "`dab index --overwrite ...` if the store's videos changed)"
                )
                log.error("%s", self.problem)
        raise Unavailable(self.problem)


class Unavailable(StoreError):
    """The server's store or index changed or is damaged: 503 with one line, until a restart."""
