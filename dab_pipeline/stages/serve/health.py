"""Whether a server may still answer: its store's and index's files are the ones it opened, and reads of them
have not failed twice."""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional, Sequence

from ...core.errors import ConfigError, StoreError
from ...core.filewatch import FileWatch
from ...search import Searcher, SearchResult

__all__ = ["Health", "Unavailable", "search_or_fail", "run_batch", "log"]

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


def search_or_fail(
    searcher: Searcher, health: Health, items: Sequence[tuple[str, int]], shortlist: Optional[int]
) -> list[SearchResult | ConfigError]:
    """A batch's answers, (text, k) each -> its result or its own ConfigError (``Searcher.search_batch``); a read
    of the store or index that fails twice (damage, not a passing hiccup of a network file system) stops the
    server from answering (:meth:`Health.fail`)."""
    for attempt in (1, 2):
        try:
            return searcher.search_batch([t for t, _ in items], [k for _, k in items], shortlist=shortlist)
        except (StoreError, OSError) as exc:  # the store's or the index's, not the query's
            if attempt == 2:
                health.fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            log.warning("a read failed, trying once more: %s", exc)
    raise AssertionError("unreachable")


def run_batch(
    searcher: Searcher, health: Health, items: Sequence[tuple[str, int]], shortlist: Optional[int]
) -> list[SearchResult | Exception]:
    """A batch of queries under the Searcher's lock, the files checked before and after (changed while it was
    read: the answers may mix old and new bytes, and every query of the batch gets a 503). Should the batch fail
    for any other reason, its queries run again one by one, so that only the query at fault gets the error."""
    with searcher.lock:
        health.check()
        try:
            answers: list = search_or_fail(searcher, health, items, shortlist)
        except (StoreError, OSError):
            raise
        except Exception:
            if len(items) == 1:
                raise
            log.exception("a batch of %d queries failed; answering them one by one", len(items))
            answers = [_alone(searcher, health, item, shortlist) for item in items]
        health.check()
    return answers


def _alone(searcher: Searcher, health: Health, item: tuple[str, int], shortlist: Optional[int]):
    """One query's answer, or the exception it raised (a failure of the store still fails everything)."""
    try:
        return search_or_fail(searcher, health, [item], shortlist)[0]
    except (StoreError, OSError):
        raise
    except Exception as exc:
        return exc
