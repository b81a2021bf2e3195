"""How many validation videos the per-video risk guarantee needs before it answers anything (issue 61, item 1).

``dab search --max-risk A`` answers a query only where Learn-then-Test, with the video as the unit (Waudby-Smith &
Ramdas's betting test of one statistic a video, metrics/risk.py), certifies that the first hit's error rate among
answered queries is at most A with probability 1 - delta. A video whose captions are mostly unanswered adds almost
nothing to the test, so its power grows with the number of videos times the share answered times the room below A.

This script takes a run's calibration.json (its fitted and held-out halves' per-query confidence, outcome and video)
and draws videos with replacement to make calibrations of ``n`` videos: half from the fitted half's videos (which
order the thresholds, as ``dab calibrate`` orders them), half from the held-out half's (which test them; their
confidences are out of sample), ``--draws`` times per n: the share of draws that answer at all, the mean share of
queries answered, and how many distinct held-out source videos the answered queries come from, per max risk. A draw
re-uses the run's own few videos (30 a half on the demo), so the figures say what more videos *like these* would
give, a rough guide, not what another split or model would.

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

Half = tuple[np.ndarray, np.ndarray, list[np.ndarray]]  # confidence (Q,), correct (Q,), each video's rows


def halves(calibration: Path) -> tuple[Half, Half]:
    """(fitted, held-out): each half's confidence, outcome and the rows of each of its videos."""
    risk = json.loads(calibration.read_text())["risk"]

    def half(p: dict) -> Half:
        video = np.asarray(p["video"]).astype(str)
        rows = [np.flatnonzero(video == v) for v in np.unique(video)]
        return np.asarray(p["confidence"], np.float64), np.asarray(p["correct"], bool), rows

    return half(risk["fit"]), half(risk)


def draw(groups: list[np.ndarray], n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(query rows, their new video labels) of ``n`` videos drawn with replacement (a drawn twice is two videos)."""
    pick = rng.integers(0, len(groups), n)
    rows = [groups[i] for i in pick]
    return np.concatenate(rows), np.repeat(np.arange(n), [len(r) for r in rows])


def answered(fit: Half, held: Half, n: int, risk: float, delta: float, draws: int, seed: int = 0) -> tuple:
    """(share of draws answering any query, mean share of held-out queries answered, mean number of distinct held-out
    source videos among the answered) at ``n`` videos."""
    rng = np.random.default_rng(seed)
    any_, share, sources = 0, [], []
    of_row = np.empty(len(held[0]), np.int64)  # (Q,) each held-out query's source video, the same for every draw
    of_row[np.concatenate(held[2])] = np.concatenate([np.full(len(r), i) for i, r in enumerate(held[2])])
    for _ in range(draws):
        f, fv = draw(fit[2], n // 2, rng)
        h, hv = draw(held[2], n - n // 2, rng)
        order = risk_test_order(fit[0][f], fit[1][f], fv, risk, delta)
        t = learn_then_test(held[0][h], held[1][h], risk, delta, video=hv, order=order)
        got = t.answered / len(h) if t.threshold is not None else 0.0
        any_ += got > 0
        share.append(got)
        if t.threshold is not None:  # which of the held-out half's own videos the answered queries are captions of
            sources.append(len(np.unique(of_row[h[held[0][h] >= t.threshold]])))
    return any_ / draws, float(np.mean(share)), float(np.mean(sources)) if sources else 0.0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", type=Path, default=Path("demo_out/runs/dab/calibration.json"))
    ap.add_argument("--videos", type=int, nargs="+", default=[60, 250, 500, 1000, 2000, 4000])
    ap.add_argument("--risks", type=float, nargs="+", default=[0.2, 0.3, 0.5])
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--delta", type=float, default=0.05)
    args = ap.parse_args(argv)
    if min(args.videos) < 2:
        ap.error(f"--videos: each size must be at least 2 (a video a half), got {min(args.videos)}")
    fit, held = halves(args.calibration)
    print(
        f"{args.calibration}: {len(fit[0])} fitted queries of {len(fit[2])} videos, {len(held[0])} held out of "
        f"{len(held[2])}, first hit right {np.concatenate([fit[1], held[1]]).mean():.3f}; {args.draws} draws a cell, "
        f"delta {args.delta}; a cell: draws answering, mean share answered, distinct held-out source videos answered"
    )
    print("| videos (half held out) | " + " | ".join(f"max risk {r:g}" for r in args.risks) + " |")
    print("|---|" + "---|" * len(args.risks))
    for n in args.videos:
        cells = [answered(fit, held, n, r, args.delta, args.draws) for r in args.risks]
        print(f"| {n} | " + " | ".join(f"{a:.2f}, {s:.3f}, {v:.1f}" for a, s, v in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
