"""The report's calibration section (``dab evaluate`` on a run that ``dab calibrate`` has calibrated)."""

from __future__ import annotations

from typing import Any


def _row(name: str, r: dict[str, Any]) -> str:
    cells = [f"{r[k]:.3f}" for k in ("ece", "ece_mass", "brier", "log_loss", "auroc", "mean_probability", "accuracy")]
    return "| " + " | ".join([name, *cells]) + " |"


def md_calibration(results: dict[str, Any]) -> list[str]:
    cal = results.get("calibration")
    if not isinstance(cal, dict):
        return []
    on = cal.get("calibrated_on", {})
    gallery = on.get("gallery", {})
    test = cal.get("test", {})
    out = [
        "## Calibration (test split)",
        "",
        f"Calibrated by `dab calibrate` ({cal.get('method')}) on {on.get('queries')} queries of split "
        f"`{on.get('split')}` against {gallery.get('videos')} videos of `{gallery.get('split')}`; measured here on "
        f"{test.get('queries')} test queries against {test.get('videos')} videos. The baselines: the raw margin "
        "through a sigmoid fitted on the same queries (`margin_sigmoid`) and the softmax of the costs at the run's "
        "temperature (`softmax`). ECE over 15 equal-width and equal-mass bins.",
        "",
    ]
    if not cal.get("same_gallery"):
        out += [
            "The test gallery is not the one calibrated on, so the coverage asked is *not* guaranteed here (a "
            "softmax over another number of videos spreads its mass differently): the sets below measure how far "
            "the calibration transfers. Calibrate on the gallery you search (`dab calibrate --gallery`, "
            "docs/uncertainty.md).",
            "",
        ]
    head = "| probability | ECE | ECE (mass) | Brier | log loss | AUROC | mean p | accuracy |"
    for target, title in (
        ("first", "P(the first hit is a match)"),
        ("first_k", f"P(a match in the first {cal.get('k')})"),
    ):
        rows = cal.get(target) or {}
        out += [f"**{title}**", "", head, "|---|---|---|---|---|---|---|---|"]
        out += [_row(name, r) for name, r in rows.items()] + [""]
    sets = cal.get("sets") or {}
    if sets:
        out += [
            "**Conformal sets on the test split** (coverage asked, coverage measured ± standard error, set size)",
            "",
            "| score | asked | measured | mean size | median | 90th pct |",
            "|---|---|---|---|---|---|",
        ]
        for score, per in sets.items():
            for asked, s in per.items():
                out.append(
                    f"| {score} | {asked} | {s['coverage']:.3f} ± {s['standard_error']:.3f} | {s['size_mean']:.1f} | "
                    f"{s['size_median']:.0f} | {s['size_p90']:.0f} |"
                )
        out.append("")
    return out
