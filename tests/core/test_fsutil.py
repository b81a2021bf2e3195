"""Atomic writes: the temp files of a killed writer are cleaned by the next write of the same file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from dab_pipeline.core.fsutil import atomic_file, atomic_write_text, remove_stale_temps

DEAD_PID = 2**22 + 7  # above Linux's largest pid: no process has it


def test_a_dead_writers_temp_file_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    target = tmp_path / "examples.html"
    dead = tmp_path / f".examples.html.{DEAD_PID}-abc123.tmp"
    dead.write_text("half a page")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".examples.html.{sleeper.pid}-def456.tmp"
        live.write_text("being written right now")
        old = tmp_path / ".examples.html.xyz.tmp"  # no pid (an older dab): removed once it is a day old
        old.write_text("old")
        os.utime(old, (time.time() - 2 * 86400,) * 2)
        other = tmp_path / f".report.md.{DEAD_PID}-aaa.tmp"  # another file's temp: not this write's business
        other.write_text("x")
        atomic_write_text(target, "the page")
        assert target.read_text() == "the page"
        assert not dead.exists() and not old.exists() and live.exists() and other.exists()
        assert remove_stale_temps(tmp_path / "report.md") == 1 and not other.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    atomic_write_text(target, "old")
    try:
        with atomic_file(target) as fh:
            fh.write(b"new, half")
            raise RuntimeError("disk full")
    except RuntimeError:
        pass
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]
