"""The calibration section of ``dab evaluate``: a calibrated run's probabilities and conformal sets measured on
the test split (queries the calibration never saw), beside the two baselines a user would try."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

from ...calibration import (
    CALIBRATION_FILE,
    UncertaintyRequest,
    assess,
    first_hit_outcomes,
    query_features,
    read_run_calibration,
)
from ...calibration.assess import query_groups
from ...calibration.maps import nested_probabilities
from ...calibration.record import video_ids_digest
from ...core.events import Event, ProgressCallback
from ...core.fsutil import sha256_file
from ...core.location import location
from ...metrics.calibration import calibration_report, reliability_bins, top_bins
from ...metrics.conformal import needed_calibration
from ...runs.config import TrainConfig
from ...runs.costfile import CostMatrix
from ...runs.run_folder import RunFolder
from ...store import open_store
from .calibrated_gallery import test_costs_on_calibrated_gallery

REPORT_COVERAGES = (0.8, 0.9, 0.95)


def _by_video(hit: np.ndarray, gt: np.ndarray) -> tuple[float, float]:
    """(coverage of a random caption of a random video, its standard error over videos)."""
    _, inv = np.unique(gt, return_inverse=True)
    share = np.bincount(inv, weights=hit.astype(np.float64)) / np.bincount(inv)  # (N,) each video's covered share
    return float(share.mean()), float(share.std() / np.sqrt(len(share)))


def _sets(
    cal, cost: np.ndarray, gt: np.ndarray, tv: Optional[np.ndarray], texts: Optional[list[str]]
) -> dict[str, Any]:
    """Per conformal score and coverage: the share of test queries whose set holds their match (the video as the
    unit: each caption weighted by one over its video's captions, the standard error over videos), set sizes, and
    the same per group where the calibration has groups (each band of each kind on its own)."""
    out: dict[str, Any] = {}
    bands = None
    if cal.groups is not None and (texts is not None or "length" not in cal.groups["bands"]):
        margin = query_features(cost, cal.temperature, cal.first_k, k0=cal.k0).column("margin")
        bands = query_groups(cal, margin, tv, texts)
    for score in cal.conformal:
        for coverage in REPORT_COVERAGES:
            if cal.videos < needed_calibration(1.0 - coverage):
                continue  # too few calibration videos for this coverage
            got = assess(cal, list(cost), tv, UncertaintyRequest(coverage=coverage, score=score), texts=texts)
            sizes = np.array([len(u.set_indices) for u in got])
            hit = np.array([gt[i] in set(u.set_indices.tolist()) for i, u in enumerate(got)])
            mean, se = _by_video(hit, gt)
            row = {
                "coverage": mean,
                "standard_error": se,
                "size_mean": float(sizes.mean()),
                "size_median": float(np.median(sizes)),
                "size_p90": float(np.quantile(sizes, 0.9)),
            }
            if bands is not None:
                row["groups"] = {}
                for kind, b in bands.items():
                    for i in range(len(cal.groups["edges"][kind]) + 1):
                        row["groups"][f"{kind} {i + 1}"] = _group_row(b == i, hit, gt, sizes, got)
            out.setdefault(score, {})[f"{coverage:g}"] = row
    return out


def _group_row(m: np.ndarray, hit: np.ndarray, gt: np.ndarray, sizes: np.ndarray, got: list) -> dict[str, Any]:
    """One group's coverage (None where no test query fell in it), queries, mean set size and marginal share."""
    if not m.any():
        return {"coverage": None, "standard_error": None, "queries": 0, "size_mean": None, "marginal_share": 0.0}
    mean, se = _by_video(hit[m], gt[m])
    return {
        "coverage": mean,
        "standard_error": se,
        "queries": int(m.sum()),
        "size_mean": float(sizes[m].mean()),
        "marginal_share": float(np.mean([got[j].set_scope == "marginal" for j in np.flatnonzero(m)])),
    }


def _probabilities(
    cal: Any, cost: np.ndarray, gt: np.ndarray, tv: Optional[np.ndarray]
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """({target: {probability: (Q,)}}, {target: outcome (Q,) bool}): the calibrated P(first) and P(first k) beside
    their baselines (the margin through a sigmoid, the softmax), and whether each query's first hit (first k) holds
    its match."""
    feats = query_features(
        cost, cal.temperature, cal.first_k, None if tv is None else np.asarray(tv, np.float64), cal.k0
    )
    first, in_first_k = first_hit_outcomes(cost, gt, cal.first_k)
    p1, pk = nested_probabilities(cal.maps["first"], cal.maps["first_k"], feats)
    probs = {
        "first": {
            "calibrated": p1,
            "margin_sigmoid": cal.maps["margin_sigmoid"].predict(feats),
            "softmax": feats.column("softmax_first"),
        },
        "first_k": {"calibrated": pk, "softmax": feats.column("softmax_first_k")},
    }
    return probs, {"first": first, "first_k": in_first_k}


def _where_measured(
    run: Path,
    cal: Any,
    cm: CostMatrix,
    cost: np.ndarray,
    gt: np.ndarray,
    tv: Optional[np.ndarray],
    store: Optional[Path],
    progress: ProgressCallback,
) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray], Optional[list[str]], dict[str, Any]]:
    """(costs (Q, V), matches (Q,), text variances, captions or None, where): the cost file's where its videos are
    the gallery calibrated on; else the test queries scored against that gallery where a store holds it unchanged;
    else the cost file's, with a warning saying why (none where the gallery cannot hold the test queries)."""
    where: dict[str, Any] = {"split": None, "videos": int(cost.shape[1]), "scored_here": False, "why_not": None}
    if cal.gallery.get("video_ids_sha256") == video_ids_digest(cm.video_ids):
        return cost, gt, tv, None, {**where, "same": True}
    test_split = RunFolder(run).load_config(TrainConfig).test_split
    got, why_not = test_costs_on_calibrated_gallery(
        run, cal, test_split, np.asarray(cm.query_ids), [store] if store else [], progress
    )
    if got is None:
        if why_not:
            progress(Event("warning", message=f"calibration section on the test split's own videos: {why_not}"))
        return cost, gt, tv, None, {**where, "why_not": why_not, "same": False}
    tv = got.text_var if "normalized" in cal.conformal else None
    where = {"split": got.split, "videos": int(got.cost.shape[1]), "scored_here": True, "why_not": None}
    return got.cost, got.gt, tv, got.texts, {**where, "same": True}


def _texts(run: Path, cm: CostMatrix) -> Optional[list[str]]:
    """The test queries' captions from the run's store, for the length groups; None where it cannot be read."""
    try:
        with open_store(location(RunFolder(run).load_config(TrainConfig).features)) as st:
            text = dict(zip(map(str, st.caption_ids), map(str, st.caption_text)))
        return [text[str(q)] for q in cm.query_ids]
    except Exception:  # a store moved or gone: the report says the length groups could not be measured
        return None


def calibration_section(
    run: Optional[Path],
    cm: CostMatrix,
    cost: np.ndarray,
    gt: np.ndarray,
    progress: ProgressCallback,
    store: Optional[Path] = None,
) -> Optional[dict[str, Any]]:
    """None for a run without calibration.json (or no run); a warning and None for one made for another
    checkpoint. Measured on the test queries against the gallery calibrated on where it can be (``store``: the one
    ``dab evaluate`` reads), else against the cost file's videos."""
    if run is None or not (Path(run) / CALIBRATION_FILE).exists():
        return None
    ck = RunFolder(run).checkpoint(RunFolder.BEST)
    cal, problem = read_run_calibration(Path(run), sha256_file(ck) if ck.exists() else "")
    if cal is None:
        progress(Event("warning", message=f"{problem}; no calibration section"))
        return None
    tv = (cm.extras or {}).get("text_var") if "normalized" in cal.conformal else None  # a variance calibration
    cost, gt, tv, texts, measured = _where_measured(Path(run), cal, cm, cost, gt, tv, store, progress)
    probs, outcome = _probabilities(cal, cost, gt, tv)
    first = outcome["first"]
    section: dict[str, Any] = {
        "method": cal.method,
        "first_k": cal.first_k,
        "calibrated_on": {
            "split": cal.provenance.get("split"),
            "queries": cal.queries,
            "gallery": {k: v for k, v in cal.gallery.items() if k != "fingerprint"},
        },
        # the test queries against the gallery calibrated on where it could be read (scored here, ``measured``),
        # else against the cost file's videos; same_gallery: whether the coverage asked is guaranteed there
        "test": {"queries": int(len(cost)), **{k: v for k, v in measured.items() if k != "same"}},
        "same_gallery": bool(measured["same"]),
    }
    # the two probabilities' tables nested: at the top, "first_k" is the integer k (as in calibration.json)
    section["probabilities"] = {
        target: {name: calibration_report(p, outcome[target]) for name, p in named.items()}
        for target, named in probs.items()
    }
    section["top_bins"] = {name: top_bins(p, first) for name, p in probs["first"].items() if name != "margin_sigmoid"}
    section["selection"] = cal.report.get("selection")
    bins = {name: reliability_bins(p, first, 15, "width") for name, p in probs["first"].items()}
    section["reliability"] = {
        name: {
            "mean_probability": r.mean_probability.tolist(),
            "accuracy": r.accuracy.tolist(),
            "count": r.count.tolist(),
        }
        for name, r in bins.items()
    }
    if texts is None and cal.groups is not None and "length" in cal.groups["bands"]:
        texts = _texts(Path(run), cm)
    section["groups"] = None if cal.groups is None else {"spec": cal.groups["spec"], "signal": cal.groups["signal"]}
    section["sets"] = _sets(cal, cost, gt, None if tv is None else np.asarray(tv, np.float64), texts)
    return section
