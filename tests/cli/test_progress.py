"""The progress display's numbers: the rate a user reads is the task's real average."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from dab_pipeline.cli import progress as progress_mod
from dab_pipeline.cli.progress import RichProgress
from dab_pipeline.core.events import Event


def test_rate_is_the_average_since_the_task_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bursty work (prefetched batches arrive back to back) must not read as a huge rate.

    24 videos over 2.7 s, the last 16 arriving within 10 ms of each other: 8.9 videos/s,
    not the ~500 videos/s a short-window estimate gives.
    """
    clock = {"t": 100.0}
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: clock["t"])
    prog = RichProgress(console=Console(file=io.StringIO(), width=120))
    with prog:
        prog(Event("start", task="videos", total=24))
        clock["t"] += 2.69
        prog(Event("advance", task="videos", n=8, data={"unit": "videos"}))
        clock["t"] += 0.005
        prog(Event("advance", task="videos", n=8, data={"unit": "videos"}))
        clock["t"] += 0.005
        prog(Event("advance", task="videos", n=8, data={"unit": "videos"}))
        task = prog._progress.tasks[prog._tasks["videos"]]
        assert task.fields["rate"] == f"{24 / 2.7:.1f} videos/s"
        assert task.fields["eta"] == "eta 0:00:00"


def test_eta_follows_the_average_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"t": 0.0}
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: clock["t"])
    prog = RichProgress(console=Console(file=io.StringIO(), width=120))
    with prog:
        prog(Event("start", task="train", total=100))
        clock["t"] = 30.0
        prog(Event("advance", task="train", n=25, data={"unit": "it"}))
        task = prog._progress.tasks[prog._tasks["train"]]
        assert task.fields["rate"] == "0.8 it/s"
        assert task.fields["eta"] == "eta 0:01:30"  # 75 left at 25 / 30 s


def test_a_log_shows_the_whole_count_within_120_columns(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Issue 61, item 5e: outside a terminal the bars went to rich's 80 columns and the count was cut
    (`3674/36…`): now 120 columns, ASCII bars, the count and the rate whole; the message beside them yields first."""
    clock = {"t": 0.0}
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: clock["t"])
    prog = RichProgress()  # the default console: stderr, here captured (not a terminal)
    with prog:
        prog(Event("start", task="captions", total=36740))
        clock["t"] = 20.0
        prog(Event("advance", task="captions", n=36740, data={"unit": "captions"}))
        prog(Event("end", task="captions"))
        prog(Event("start", task="videos", total=36740))
        clock["t"] = 29.0
        message = "3674 ok, 0 failed, 0 missing, 17 with decoder warnings (dab inspect lists them)"
        prog(Event("advance", task="videos", n=3674, data={"unit": "videos"}, message=message))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 2 and all(len(x) <= 120 and "\ufffd" not in x for x in lines), err
    assert not any(set(x) & set("━╸╺") for x in lines), err  # an ASCII bar in a log
    assert "36740/36740" in lines[0] and "1837.0 captions/s" in lines[0], err
    assert "3674/36740" in lines[1] and "408.2 videos/s" in lines[1] and "eta 0:01:21" in lines[1], err
    assert "3674 ok, 0 failed" in lines[1], err
