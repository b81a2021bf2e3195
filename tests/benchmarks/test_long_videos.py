"""benchmarks/long_videos.py on a small scale: the videos it writes have the GOP asked for, and every way of reading
them is timed (and pyav-seek really seeks); numbers are not checked, only that the table is whole."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import av

REPO = Path(__file__).resolve().parents[2]


def _long_videos():
    sys.path.insert(0, str(REPO / "benchmarks"))  # it imports its sibling extract.py, as when run as a script
    try:
        spec = importlib.util.spec_from_file_location("long_videos_benchmark", REPO / "benchmarks" / "long_videos.py")
        module = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def _key_frames(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for p in c.demux(c.streams.video[0]) if p.size and p.is_keyframe)


def test_generated_gops_and_a_whole_decode_table(tmp_path: Path) -> None:
    lv = _long_videos()
    a = lv.write_long_video(tmp_path / "g30.mp4", 1, 330, 30, (64, 48), 30)
    b = lv.write_long_video(tmp_path / "g0.mp4", 2, 330, 30, (64, 48), 0)
    assert _key_frames(a) == 11 and _key_frames(b) == 1
    assert lv.read_whole(a, convert=True) == lv.read_whole(a, convert=False) == 330
    times = lv.decode_rounds({"gop 30": [a], "one key frame": [b]}, frames=16, repeats=1)  # pyav-seek must seek
    rows = lv.decode_table(times, videos=1)
    assert [(r["gop"], r["way"]) for r in rows] == [(g, w) for g in ("gop 30", "one key frame") for w in lv.WAYS]
    assert all(r["videos_per_s"] > 0 for r in rows)
    assert [r["speed_vs_whole_file"] for r in rows if r["way"] == "whole file"] == [1.0, 1.0]
