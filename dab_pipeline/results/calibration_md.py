"""The report's calibration section (``dab evaluate`` on a run that ``dab calibrate`` has calibrated)."""

from __future__ import annotations

from typing import Any


def _num(x: Any) -> str:
    """A figure, or a dash where it is undefined (an AUROC of one-class outcomes)."""
    return "-" if x is None else f"{x:.3f}"


def _row(name: str, r: dict[str, Any]) -> str:
    cells = [_num(r[k]) for k in ("ece", "ece_mass", "brier", "log_loss", "auroc", "mean_probability", "accuracy")]
    return "| " + " | ".join([name, *cells]) + " |"


def probability_tables(cal: dict[str, Any]) -> dict[str, Any]:
    """metrics.json's calibration section's two probability tables, {"first": ..., "first_k": ...}: nested under
    "probabilities" since the integer k took the name "first_k"; at the top level in the files written before."""
    nested = cal.get("probabilities")
    if isinstance(nested, dict):
        return nested
    return {t: cal[t] for t in ("first", "first_k") if isinstance(cal.get(t), dict)}


def first_k_of(cal: dict[str, Any]) -> Any:
    """The k of P(a match in the first k) in metrics.json's calibration section: "first_k", or "k" in the files
    written before issue 62 ("k" where the section has no integer: a file of the version that lost it)."""
    for key in ("first_k", "k"):
        if isinstance(cal.get(key), int):
            return cal[key]
    return "k"


def measured_on(test: dict[str, Any]) -> str:
    """Where the section was measured: "N test queries against V videos", and the gallery's split where the test
    queries were scored here against the gallery calibrated on."""
    where = f"{test.get('queries')} test queries against {test.get('videos')} videos"
    if test.get("scored_here"):
        where += f" of split {test.get('split')!r}, the gallery calibrated on (scored here, as a search of it does)"
    return where


def md_calibration(results: dict[str, Any]) -> list[str]:
    cal = results.get("calibration")
    if not isinstance(cal, dict):
        return []
    on = cal.get("calibrated_on", {})
    gallery = on.get("gallery", {})
    test = cal.get("test", {})
    out = [
        "## Calibration (test queries)",
        "",
        f"Calibrated by `dab calibrate` ({cal.get('method')}) on {on.get('queries')} queries of split "
        f"`{on.get('split')}` against {gallery.get('videos')} videos of `{gallery.get('split')}`; measured here on "
        f"{measured_on(test)}. The baselines: the raw margin "
        "through a sigmoid fitted on the same queries (`margin_sigmoid`) and the softmax of the costs at the run's "
        "temperature (`softmax`). ECE over 15 equal-width and equal-mass bins.",
        "",
    ]
    if test.get("why_not"):
        out += [f"Not measured on the gallery calibrated on: {test['why_not']}.", ""]
    if not cal.get("same_gallery"):
        out += [
            "The test gallery is not the one calibrated on, so the coverage asked is *not* guaranteed here (a "
            "softmax over another number of videos spreads its mass differently): the sets below measure how far "
            "the calibration transfers. Calibrate on the gallery you search (`dab calibrate --gallery`, "
            "docs/uncertainty.md).",
            "",
        ]
    head = "| probability | ECE | ECE (mass) | Brier | log loss | AUROC | mean p | accuracy |"
    tables = probability_tables(cal)
    for target, title in (
        ("first", "P(the first hit is a match)"),
        ("first_k", f"P(a match in the first {first_k_of(cal)})"),
    ):
        rows = tables.get(target) or {}
        out += [f"**{title}**", "", head, "|---|---|---|---|---|---|---|---|"]
        out += [_row(name, r) for name, r in rows.items()] + [""]
    out += _selection_and_top_bins(cal)
    sets = cal.get("sets") or {}
    if sets:
        out += [
            "**Conformal sets on the test queries** (coverage asked, coverage measured ± standard error, set size)",
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
        out += _group_table(cal, sets)
    return out


def _group_table(cal: dict[str, Any], sets: dict[str, Any]) -> list[str]:
    """Coverage per group (band) and per coverage level, where the calibration has groups."""
    groups = cal.get("groups")
    rows = [(score, asked, s) for score, per in sets.items() for asked, s in per.items() if s.get("groups")]
    if not groups or not rows:
        return []
    names = list(rows[0][2]["groups"])
    out = [
        f"**Coverage per group** (`--groups {groups['spec']}`; the video as the unit; ± a standard error over "
        "videos; in brackets the share of the group's queries that got the marginal set, their band too small)",
        "",
        "| score | asked | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for score, asked, s in rows:
        cells = []
        for n in names:
            g = s["groups"].get(n)
            cells.append(
                "-"
                if g is None or g["coverage"] is None
                else f"{g['coverage']:.3f} ± {g['standard_error']:.3f} ({g['queries']} q"
                + (f", {g['marginal_share']:.0%} marginal" if g["marginal_share"] else "")
                + ")"
            )
        out.append(f"| {score} | {asked} | " + " | ".join(cells) + " |")
    return out + [""]


def _selection_and_top_bins(cal: dict[str, Any]) -> list[str]:
    """Which map each probability uses and why; reliability where P(first) >= 0.5 (bins of >= 100 queries)."""
    out = []
    for target, sel in (cal.get("selection") or {}).items():
        losses = ", ".join(f"{k} {v:.3f}" for k, v in (sel.get("cv_log_loss") or {}).items())
        why = f": cross-validated log loss on the fitted half, by video: {losses}" if losses else " (asked for)"
        out.append(f"- `{target}`: map `{sel.get('chosen')}`{why}")
    if out:
        out.append("")
    bins = cal.get("top_bins") or {}
    if not any(bins.values()):
        return out + ["P(first) reached 0.5 on fewer than 100 test queries: no top-bin reliability.", ""]
    out += [
        "**Where P(first) >= 0.5** (bins of at least 100 test queries: mean p against the observed rate, 95 % "
        "interval)",
        "",
        "| probability | P(first) from | to | queries | mean p | observed | 95 % interval | mean p - observed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in bins.items():
        for r in rows:
            lo, hi = r["interval"]
            out.append(
                f"| {name} | {r['low']:.3f} | {r['high']:.3f} | {r['count']} | {r['mean_p']:.3f} | "
                f"{r['observed']:.3f} | [{lo:.3f}, {hi:.3f}] | {r['mean_p'] - r['observed']:+.3f} |"
            )
    return out + [""]
