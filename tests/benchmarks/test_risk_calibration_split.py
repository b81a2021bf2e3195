"""benchmarks/risk_calibration_split.py (issue 61, item 1): the set-aside videos keep the number of captions asked,
the other splits all of theirs; its table fits a 120-column log; and (slow) the whole pipeline on a tiny world
reports what `dab search --max-risk` would answer, from the run's own calibration."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from dab_pipeline.world import make_world
from dab_pipeline.world.generate import WorldConfig

from ..helpers.benchmarks import load_benchmark


def test_set_aside_videos_keep_the_captions_asked_and_the_table_fits(tmp_path: Path) -> None:
    bench = load_benchmark("risk_calibration_split")
    cfg = WorldConfig(seed=3, train=6, val=2, test=5, frames=16, size=(32, 32), captions_per_video=(4, 6))
    make_world(tmp_path, cfg)
    out = bench.world_captions(tmp_path, 2, seed=3)
    rows = list(csv.DictReader(open(out, newline="", encoding="utf-8")))
    every = list(csv.DictReader(open(tmp_path / "captions_all.csv", newline="", encoding="utf-8")))
    kept = Counter(r["video_id"] for r in rows)
    for vid, n in Counter(r["video_id"] for r in every).items():
        split = next(r["split"] for r in every if r["video_id"] == vid)
        assert kept[vid] == (min(2, n) if split == "test" else n), (vid, split)
    assert {r["caption"] for r in rows} <= {r["caption"] for r in every}
    assert bench.world_captions(tmp_path, 2, seed=3).read_text() == out.read_text()  # the same draw each run
    result = {
        "seed": 7,
        "gallery": 1800,
        "held_out": {"queries": 2250, "videos": 750, "accuracy": 0.104},
        "top": {"10": 0.6, "20": 0.55, "50": 0.38, "100": 0.4},
        "answers": {str(a): {"threshold": None, "answered": 1234, "errors": 567} for a in bench.RISKS},
        "seconds": {"world": 100.0, "extract": 100.0, "train": 400.0, "calibrate": 242.0},
    }
    assert all(len(line) <= 120 for line in bench.table([result]))


@pytest.mark.slow
def test_the_pipeline_on_a_tiny_world_reports_the_searchs_answers(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    from dab_pipeline.calibration import read_calibration, risk_threshold

    bench = load_benchmark("risk_calibration_split")
    got = bench.one_world(tmp_path, seed=5, videos=24, captions=2, epochs=1, train=24, val=8)
    assert got["gallery"] == 24 + 8 + 24 and got["held_out"]["videos"] == 12  # half the set-aside videos
    cal = read_calibration(tmp_path / "dab" / "calibration.json")
    for a in bench.RISKS:  # what dab search --max-risk A would do with this calibration
        r = risk_threshold(cal, a, bench.DELTA)
        assert got["answers"][str(a)] == {"threshold": r.threshold, "answered": r.answered, "errors": r.errors}
