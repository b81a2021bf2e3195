"""What the batcher's worker runs: a batch of queries under the Searcher's lock, its files checked before and
after, a failing batch answered query by query, a read that fails twice marking the server unhealthy."""

from __future__ import annotations

from typing import Optional, Sequence

from ...core.errors import ConfigError, StoreError
from ...search import Searcher, SearchResult
from .health import Health, log

__all__ = ["run_batch", "search_or_fail"]


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
