"""Queries that arrive together, answered in one call: :class:`Batcher`.

A request enqueues its (query, k) and waits on a future; one worker thread takes the first query waiting,
gathers more until ``max_batch`` are waiting or ``wait_s`` has passed since that first one arrived (at once
when the worker was busy and the wait is already over), and runs them as one batch (``run_batch``: text
encoding in one batch, one scoring call, ``Searcher.search_batch``). Each future gets its own answer or its
own error; an error of the whole batch (the store changed, a read failed) goes to each of its queries.
``max_batch=1`` answers one query at a time, in arrival order, as the server did before batching.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

from .health import Unavailable

__all__ = ["Batcher", "BatchRunner"]

# the queries of a batch, (text, k) each -> an answer or an exception per query, in order
BatchRunner = Callable[[Sequence[tuple[str, int]]], Sequence[Any]]


@dataclass
class _Job:
    text: str
    k: int
    arrived: float  # time.monotonic() when enqueued
    future: Future = field(default_factory=Future)


class Batcher:
    """One worker thread answering queued queries in batches of at most ``max_batch`` (see the module)."""

    def __init__(self, run_batch: BatchRunner, max_batch: int = 16, wait_s: float = 0.005, workers: int = 1) -> None:
        # workers > 1: as many batches run at once (dab serve --ray: one a re-rank replica), each gathered as above
        if max_batch < 1 or not wait_s >= 0 or workers < 1:
            raise ValueError(
                f"max_batch and workers must be >= 1 and wait_s >= 0, got {max_batch}, {workers} and {wait_s}"
            )
        self.run_batch, self.max_batch, self.wait_s = run_batch, int(max_batch), float(wait_s)
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._open = threading.Event()  # cleared by hold(): the worker gathers nothing
        self._open.set()
        self._closed = False
        self.sizes: Counter[int] = Counter()  # batch size -> batches run
        self.busy = 0.0  # seconds spent running batches
        self.waited = 0.0  # seconds queries waited before their batch started, summed
        self._workers = [
            threading.Thread(target=self._work, name=f"dab-serve-batcher-{i}", daemon=True) for i in range(workers)
        ]
        for w in self._workers:
            w.start()

    def submit(self, text: str, k: int) -> Any:
        """Queue one query and wait for its answer (or raise its error)."""
        return self._enqueue(text, k).result()

    async def answer(self, text: str, k: int) -> Any:
        """:meth:`submit` for the event loop: the query waits without holding a thread."""
        return await asyncio.wrap_future(self._enqueue(text, k))

    def _enqueue(self, text: str, k: int) -> Future:
        job = _Job(text, k, time.monotonic())
        with self._cond:
            if self._closed:
                raise Unavailable("the server is shutting down")
            self._jobs.append(job)
            self._cond.notify_all()
        return job.future

    def stats(self) -> dict:
        """The settings and what ran: batches, queries, the largest batch and how many batches of each size."""
        with self._cond:
            sizes = dict(sorted(self.sizes.items()))
        return {
            "max_batch": self.max_batch,
            "wait_ms": 1000 * self.wait_s,
            "batches": sum(sizes.values()),
            "queries": sum(n * c for n, c in sizes.items()),
            "largest": max(sizes, default=0),
            "sizes": {str(n): c for n, c in sizes.items()},
            "busy_s": round(self.busy, 3),
            "waited_s": round(self.waited, 3),
        }

    @contextmanager
    def hold(self) -> Iterator[None]:
        """While held the worker starts no batch (one already running finishes): queued queries wait, so a test
        can queue a known set and release it as one gathering."""
        self._open.clear()
        try:
            yield
        finally:
            self._open.set()

    def wait_queued(self, n: int, timeout: Optional[float] = None) -> bool:
        """Wait until at least ``n`` queries are queued (not yet taken by the worker); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._jobs) >= n, timeout)

    def close(self) -> None:
        """Stop the worker after the batch it runs; queries still queued get :class:`Unavailable`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._open.set()
        for w in self._workers:
            w.join()
        with self._cond:
            left, self._jobs = list(self._jobs), deque()
        for job in left:
            job.future.set_exception(Unavailable("the server is shutting down"))

    # ------------------------------------------------------------------ the worker

    def _work(self) -> None:
        while True:
            batch = self._gather()
            if batch is None:
                return
            self._run(batch)

    def _gather(self) -> Optional[list[_Job]]:
        """The next batch: the first query waiting and those that join it in time; None once closed."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._closed)
                if self._closed:
                    return None
            self._open.wait()
            with self._cond:
                if not self._jobs:  # another worker took them
                    continue
                deadline = self._jobs[0].arrived + self.wait_s
                while len(self._jobs) < self.max_batch and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._cond.wait(left):
                        break
                batch = [self._jobs.popleft() for _ in range(min(self.max_batch, len(self._jobs)))]
                self._cond.notify_all()  # wait_queued sees the queue shrink
                if batch:
                    return batch

    def _run(self, batch: list[_Job]) -> None:
        """Run one batch and give each query its answer; an exception of the batch goes to every query."""
        t0 = time.monotonic()
        try:
            answers = list(self.run_batch([(j.text, j.k) for j in batch]))
            if len(answers) != len(batch):
                raise RuntimeError(f"{len(answers)} answers for a batch of {len(batch)}")
        except Exception as exc:  # the batch's failure (a changed store): each query's answer
            answers = [exc] * len(batch)
        with self._cond:
            self.sizes[len(batch)] += 1
            self.busy += time.monotonic() - t0  # summed over the workers
            self.waited += sum(t0 - j.arrived for j in batch)
        for job, answer in zip(batch, answers):
            if isinstance(answer, BaseException):
                job.future.set_exception(answer)
            else:
                job.future.set_result(answer)
