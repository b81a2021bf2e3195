"""How many validation videos the per-video risk guarantee needs before it answers anything (issue 61, item 1).

``dab search --max-risk A`` answers a query only where Learn-then-Test, with the video as the unit (Waudby-Smith &
Ramdas's betting test of one statistic a video, metrics/risk.py), certifies that the first hit's error rate among
answered queries is at most A with probability 1 - delta. A video whose captions are mostly unanswered adds almost
nothing to the test, so its power grows with the number of videos times the share answered times the room below A.

This script takes a run's calibration.json (its held-out and fitted halves' per-query confidence, outcome and video)
and draws videos from it with replacement to make calibrations of ``n`` videos (half fitted, which orders the
thresholds, half held out, which tests them, as ``dab calibrate`` does), ``--draws`` times per n: the share of draws
that answer at all and the mean share of queries answered, per max risk. A draw re-uses the run's own videos, so
the figures say what more videos *like these* would give, not what another model would.

    python benchmarks/risk_videos.py --calibration demo_out/runs/dab/calibration.json
        [--videos 60 250 500 1000 2000 4000] [--risks 0.2 0.3 0.5] [--draws 8] [--delta 0.05]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from dab_pipeline.metrics.risk import learn_then_test, risk_test_order


def outcomes(calibration: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(confidence, correct, video) of every calibration query, both halves, the video ids kept distinct."""
    risk = json.loads(calibration.read_text())["risk"]
    parts = [risk, risk["fit"]]
    conf = np.concatenate([np.asarray(p["confidence"], np.float64) for p in parts])
    ok = np.concatenate([np.asarray(p["correct"], bool) for p in parts])
    video = np.concatenate([np.asarray(p["video"]).astype(str) for p in parts])
    return conf, ok, video


def draw(groups: list[np.ndarray], n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(query rows, their new video labels) of ``n`` videos drawn with replacement (a drawn twice is two videos)."""
    pick = rng.integers(0, len(groups), n)
    rows = [groups[i] for i in pick]
    return np.concatenate(rows), np.repeat(np.arange(n), [len(r) for r in rows])


def answered(conf, ok, video, n: int, risk: float, delta: float, draws: int, seed: int = 0) -> tuple[float, float]:
    """(share of draws answering any query, mean share of held-out queries answered) at ``n`` videos."""
    groups = [np.flatnonzero(video == v) for v in np.unique(video)]
    rng = np.random.default_rng(seed)
    any_, share = 0, []
    for _ in range(draws):
        fit, fv = draw(groups, n // 2, rng)
        held, hv = draw(groups, n - n // 2, rng)
        order = risk_test_order(conf[fit], ok[fit], fv, risk, delta)
        t = learn_then_test(conf[held], ok[held], risk, delta, video=hv, order=order)
        got = t.answered / len(held) if t.threshold is not None else 0.0
        any_ += got > 0
        share.append(got)
    return any_ / draws, float(np.mean(share))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", type=Path, default=Path("demo_out/runs/dab/calibration.json"))
    ap.add_argument("--videos", type=int, nargs="+", default=[60, 250, 500, 1000, 2000, 4000])
    ap.add_argument("--risks", type=float, nargs="+", default=[0.2, 0.3, 0.5])
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--delta", type=float, default=0.05)
    args = ap.parse_args(argv)
    conf, ok, video = outcomes(args.calibration)
    print(
        f"{args.calibration}: {len(conf)} queries of {len(np.unique(video))} videos, first hit right "
        f"{ok.mean():.3f}; {args.draws} draws a cell, delta {args.delta}"
    )
    print(
        "| videos (half held out) | "
        + " | ".join(f"max risk {r:g}: draws answering, mean answered" for r in args.risks)
        + " |"
    )
    print("|---|" + "---|" * len(args.risks))
    for n in args.videos:
        cells = [answered(conf, ok, video, n, r, args.delta, args.draws) for r in args.risks]
        print(f"| {n} | " + " | ".join(f"{a:.2f}, {s:.3f}" for a, s in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
