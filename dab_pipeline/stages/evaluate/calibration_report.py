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
    run_calibration,
)
from ...calibration.maps import nested_probabilities
from ...calibration.record import video_ids_digest
from ...core.events import Event, ProgressCallback
from ...core.fsutil import sha256_file
from ...metrics.calibration import calibration_report, reliability_bins
from ...runs.costfile import CostMatrix
from ...runs.run_folder import RunFolder

REPORT_COVERAGES = (0.8, 0.9, 0.95)


def _sets(cal, cost: np.ndarray, gt: np.ndarray, tv: Optional[np.ndarray]) -> dict[str, Any]:
    """Per conformal score and coverage: the share of test queries whose set holds their match, and set sizes."""
    out: dict[str, Any] = {}
    n = len(cost)
    for score in cal.conformal:
        for coverage in REPORT_COVERAGES:
            if cal.queries < int(np.ceil(1.0 / (1.0 - coverage) - 1.0 - 1e-9)):
                continue  # too few calibration queries for this coverage
            got = assess(cal, list(cost), tv, UncertaintyRequest(coverage=coverage, score=score))
            sizes = np.array([len(u.set_indices) for u in got])
            hit = np.array([gt[i] in set(u.set_indices.tolist()) for i, u in enumerate(got)])
            out.setdefault(score, {})[f"{coverage:g}"] = {
                "coverage": float(hit.mean()),
                "standard_error": float(hit.std() / np.sqrt(n)),
                "size_mean": float(sizes.mean()),
                "size_median": float(np.median(sizes)),
                "size_p90": float(np.quantile(sizes, 0.9)),
            }
    return out


def calibration_section(
    run: Optional[Path], cm: CostMatrix, cost: np.ndarray, gt: np.ndarray, progress: ProgressCallback
) -> Optional[dict[str, Any]]:
    """None for a run without calibration.json (or no run); a warning and None for one made for another
    checkpoint."""
    if run is None or not (Path(run) / CALIBRATION_FILE).exists():
        return None
    ck = RunFolder(run).checkpoint(RunFolder.BEST)
    cal, problem = run_calibration(Path(run), sha256_file(ck) if ck.exists() else "")
    if cal is None:
        progress(Event("warning", message=f"{problem}; no calibration section"))
        return None
    tv = (
        (cm.extras or {}).get("text_var")
        if "log_text_var" in {f for m in cal.maps.values() for f in m.features}
        else None
    )
    feats = query_features(cost, cal.temperature, cal.k, None if tv is None else np.asarray(tv, np.float64))
    first, first_k = first_hit_outcomes(cost, gt, cal.k)
    p1, pk = nested_probabilities(cal.maps["first"], cal.maps["first_k"], feats)
    probs = {
        "first": {
            "calibrated": p1,
            "margin_sigmoid": cal.maps["margin_sigmoid"].predict(feats),
            "softmax": feats.column("p_first"),
        },
        "first_k": {"calibrated": pk, "softmax": feats.column("p_first_k")},
    }
    outcome = {"first": first, "first_k": first_k}
    section: dict[str, Any] = {
        "method": cal.method,
        "k": cal.k,
        "calibrated_on": {
            "split": cal.provenance.get("split"),
            "queries": cal.queries,
            "gallery": {k: v for k, v in cal.gallery.items() if k != "fingerprint"},
        },
        "test": {"queries": int(len(cost)), "videos": int(cost.shape[1])},
        # the cost file's videos are the gallery calibrated on (else the coverage is not guaranteed there)
        "same_gallery": cal.gallery.get("video_ids_sha256") == video_ids_digest(cm.video_ids),
    }
    for target, named in probs.items():
        section[target] = {name: calibration_report(p, outcome[target]) for name, p in named.items()}
    section["reliability"] = {}
    for name, p in probs["first"].items():
        r = reliability_bins(p, first, 15, "width")
        section["reliability"][name] = {
            "confidence": r.confidence.tolist(),
            "accuracy": r.accuracy.tolist(),
            "count": r.count.tolist(),
        }
    section["sets"] = _sets(cal, cost, gt, None if tv is None else np.asarray(tv, np.float64))
    return section
