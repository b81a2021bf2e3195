"""dab serve's Batcher (issue 38): queued queries gathered into batches of at most max_batch, each query answered
with its own result or error, deterministic through hold() and wait_queued() (no sleeps, no timing asserts)."""

from __future__ import annotations

import asyncio
import threading
from typing import Sequence

import pytest

from dab_pipeline.stages.serve import Unavailable
from dab_pipeline.stages.serve.batcher import Batcher

JOIN = 120  # seconds a thread may take before the test calls it hung (a bound, not a measurement)


class Recorder:
    """A run_batch that answers (text, k) with text * k, an error for "bad", and records the batches."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, int]]] = []

    def __call__(self, items: Sequence[tuple[str, int]]) -> list:
        self.batches.append(list(items))
        return [ValueError(f"bad query {t}") if t == "bad" else t * k for t, k in items]


def submit_all(batcher: Batcher, items: list[tuple[str, int]]) -> list:
    """Submit each item from its own thread, all queued before the held worker may gather; -> answers or errors."""
    out: list = [None] * len(items)

    def send(i: int) -> None:
        try:
            out[i] = batcher.submit(*items[i])
        except Exception as exc:
            out[i] = exc

    threads = []
    with batcher.hold():
        for i in range(len(items)):
            threads.append(threading.Thread(target=send, args=(i,)))
            threads[-1].start()
            assert batcher.wait_queued(i + 1, timeout=JOIN)  # queued in this order
    for t in threads:
        t.join(JOIN)
    assert not any(t.is_alive() for t in threads), "a query was never answered"
    return out


def test_queued_queries_are_gathered_in_batches_of_at_most_max_batch_in_arrival_order() -> None:
    rec = Recorder()
    batcher = Batcher(rec, max_batch=4, wait_s=0.0)
    try:
        items = [(c, n) for n, c in enumerate("abcdef", start=1)]
        assert submit_all(batcher, items) == ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"]
        assert rec.batches == [items[:4], items[4:]]
        stats = batcher.stats()
        assert stats["sizes"] == {"2": 1, "4": 1} and stats["batches"] == 2 and stats["queries"] == 6
        assert stats["largest"] == 4 and stats["max_batch"] == 4
    finally:
        batcher.close()


def test_max_batch_one_answers_one_query_at_a_time() -> None:
    rec = Recorder()
    batcher = Batcher(rec, max_batch=1, wait_s=0.005)
    try:
        assert submit_all(batcher, [("x", 1), ("y", 2), ("z", 3)]) == ["x", "yy", "zzz"]
        assert rec.batches == [[("x", 1)], [("y", 2)], [("z", 3)]]
    finally:
        batcher.close()


def test_a_bad_query_gets_its_own_error_and_a_failed_batch_fails_each_of_its_queries() -> None:
    rec = Recorder()
    batcher = Batcher(rec, max_batch=8, wait_s=0.0)
    try:
        out = submit_all(batcher, [("a", 2), ("bad", 1), ("c", 1)])
        assert out[0] == "aa" and out[2] == "c"
        assert isinstance(out[1], ValueError) and "bad query" in str(out[1])
        assert len(rec.batches) == 1
    finally:
        batcher.close()

    def broken(items):
        raise OSError("the store went away")

    batcher = Batcher(broken, max_batch=8, wait_s=0.0)
    try:
        out = submit_all(batcher, [("a", 1), ("b", 1)])
        assert all(isinstance(o, OSError) and "went away" in str(o) for o in out)
    finally:
        batcher.close()
    batcher = Batcher(lambda items: ["only one"], max_batch=8, wait_s=0.0)
    try:
        out = submit_all(batcher, [("a", 1), ("b", 1)])
        assert all(isinstance(o, RuntimeError) and "1 answers for a batch of 2" in str(o) for o in out)
    finally:
        batcher.close()


def test_a_full_batch_does_not_wait_for_its_wait_to_pass() -> None:
    """wait_s of an hour: the second query fills the batch of two, which runs at once (the threads end)."""
    rec = Recorder()
    batcher = Batcher(rec, max_batch=2, wait_s=3600.0)
    out: list = [None, None]
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, batcher.submit("q", i + 1))) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN)
        assert not any(t.is_alive() for t in threads) and sorted(out) == ["q", "qq"]
        assert [len(b) for b in rec.batches] == [2]
    finally:
        batcher.close()


def test_the_event_loop_waits_for_its_answer_without_a_thread() -> None:
    batcher = Batcher(Recorder(), max_batch=4, wait_s=0.0)
    try:

        async def two():
            return await asyncio.gather(batcher.answer("a", 1), batcher.answer("b", 2))

        assert asyncio.run(two()) == ["a", "bb"]
    finally:
        batcher.close()


def test_closing_answers_queued_queries_with_unavailable_and_refuses_new_ones() -> None:
    rec = Recorder()
    batcher = Batcher(rec, max_batch=4, wait_s=0.0)
    out: list = []

    def send() -> None:
        try:
            out.append(batcher.submit("late", 1))
        except Unavailable as exc:
            out.append(exc)

    with batcher.hold():
        t = threading.Thread(target=send)
        t.start()
        assert batcher.wait_queued(1, timeout=JOIN)
        closing = threading.Thread(target=batcher.close)
        closing.start()
        closing.join(JOIN)
    t.join(JOIN)
    assert not t.is_alive() and not closing.is_alive()
    # the worker was held when close began: it either ran the query as its last batch or left it to close()
    assert out == ["late"] or (isinstance(out[0], Unavailable) and rec.batches == [])
    with pytest.raises(Unavailable, match="shutting down"):
        batcher.submit("after", 1)


def test_bad_settings_are_refused() -> None:
    for kw in ({"max_batch": 0}, {"wait_s": -1.0}, {"wait_s": float("nan")}, {"workers": 0}):
        with pytest.raises(ValueError):
            Batcher(Recorder(), **kw)


def test_workers_run_batches_at_once_each_gathered_as_one_worker_gathers() -> None:
    """workers=2 (dab serve --ray, a worker a re-rank replica): two batches in flight together, which a barrier
    that only two batches at once can pass proves; every query answered once, none in two batches."""
    both = threading.Barrier(2, timeout=JOIN)
    rec = Recorder()

    def run(items):
        both.wait()  # a second batch must start while this one runs
        return rec(items)

    batcher = Batcher(run, max_batch=3, wait_s=0.0, workers=2)
    items = [(f"q{i}", 1) for i in range(6)]
    out = submit_all(batcher, items)
    batcher.close()
    assert out == [t for t, _ in items]
    assert sorted(q for b in rec.batches for q in b) == sorted(items) and all(len(b) <= 3 for b in rec.batches)
    assert batcher.stats()["queries"] == 6
