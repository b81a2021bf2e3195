"""Evaluation outputs: metrics.json, report.md and the diagnostic plots.

The results dict is the one the evaluation stage assembles from
:mod:`dab_pipeline.metrics`; every section is optional except ``t2v``::

    {"t2v": {...}, "v2t": {...},              # retrieval_metrics() dicts
     "postprocess": {"name": "none", ...},    # evaluate_all() label
     "selective": selective_report(...),      # its "curves" arrays are plotted, not stored
     "variance": variance_asymmetry(...),
     "neighbourhood": semantic_neighbourhood(...),
     "covariance": {...},                     # low-rank and mixture runs (stages/evaluate/covariance_report.py)
     ...}                                     # any other JSON-able keys are kept as is

Plots use matplotlib's object API on an Agg canvas, so no display and no
global pyplot state.  Every file is written to a temporary name in the run
folder and renamed into place, so a crash never leaves a half-written report.
The plots are drawn by :mod:`.plots`; the table of several runs is :mod:`.compare`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.errors import ConfigError
from ..core.fsutil import atomic_write_bytes
from ..runs.run_folder import RunFolder
from .calibration_md import md_calibration
from .plots import plot_rank_hist, plot_reliability, plot_risk_coverage

__all__ = ["TABLE_COLUMNS", "write_report", "format_metric", "to_jsonable", "md_table", "postprocess_label", "MISSING"]

# The paper's column order (Tables 1-4); R@50 is extra and goes last.
TABLE_COLUMNS: tuple[str, ...] = ("R@1", "R@5", "R@10", "MdR", "MnR", "RSum")
_REPORT_COLUMNS: tuple[str, ...] = TABLE_COLUMNS + ("R@50",)
MISSING = "–"


# --------------------------------------------------------------------------
# serialisation helpers
# --------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays, paths and tuples to plain JSON types; NaN/inf -> None."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [to_jsonable(v) for v in value.tolist()]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        f = float(value)
        # JSON has no NaN/inf; a null is honest and every reader accepts it.
        return f if math.isfinite(f) else None
    if isinstance(value, Path):
        return str(value)
    return value


def _strip_curves(results: dict[str, Any]) -> dict[str, Any]:
    """Drop per-query curve arrays: they are plotted, and would bloat metrics.json."""
    out = dict(results)
    selective = out.get("selective")
    if isinstance(selective, dict) and "curves" in selective:
        out["selective"] = {k: v for k, v in selective.items() if k != "curves"}
    return out


# --------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------


def format_metric(name: str, value: Any) -> str:
    """Format one metric the way the paper prints it (recalls 1 decimal, MdR as is)."""
    if value is None:
        return MISSING
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(f):
        return MISSING
    if name == "MdR":
        return f"{f:g}"
    if name == "MnR":
        return f"{f:.2f}"
    return f"{f:.1f}"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def postprocess_label(results: dict[str, Any]) -> str:
    label = results.get("postprocess")
    if isinstance(label, str) and label.strip():
        return label.strip()  # a caller's free-text label is shown as given
    if not isinstance(label, dict) or label.get("name", "none") == "none":
        return "none"
    parts = [str(label["name"])]
    parts += [f"{k}={v}" for k, v in label.items() if k != "name"]
    return parts[0] + " (" + ", ".join(parts[1:]) + ")" if len(parts) > 1 else parts[0]


def _render_markdown(title: str, results: dict[str, Any], plots: dict[str, Path]) -> str:
    out: list[str] = [f"# {title}", "", f"Post-processing: **{postprocess_label(results)}**", ""]
    sections = (
        _md_retrieval,
        _md_published,
        _md_selective,
        _md_variance,
        _md_covariance,
        md_calibration,
        _md_bridge,
        _md_neighbourhood,
    )
    for section in sections:
        out += section(results)
    if plots:
        out += ["## Plots", ""] + [f"![{name}]({path.name})" for name, path in plots.items()] + [""]
    return "\n".join(out)


def _md_retrieval(results: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, heading in (("t2v", "Text-to-video"), ("v2t", "Video-to-text")):
        metrics = results.get(key)
        if not isinstance(metrics, dict):
            continue
        n = metrics.get("n")
        suffix = f" ({n} {'queries' if key == 't2v' else 'videos'})" if n is not None else ""
        if key == "v2t" and results.get("v2t_convention"):
            suffix += (
                "; each other video ranked once, by its best caption"
                if results["v2t_convention"] == "videos"
                else "; every caption of every other video ranked"
            )
        row = [format_metric(c, metrics.get(c)) for c in _REPORT_COLUMNS]
        out += [f"## {heading}{suffix}", "", md_table(list(_REPORT_COLUMNS), [row]), ""]
    return out


def _md_published(results: dict[str, Any]) -> list[str]:
    """A zero-shot run beside the published figure for its dataset and CLIP (results/published.py)."""
    pub = results.get("published")
    if not isinstance(pub, dict):
        return []
    cols = [c for c in ("R@1", "R@5", "R@10", "MdR") if c in pub.get("t2v", {})]
    rows = [
        [f"published ({pub.get('short')})"] + [format_metric(c, pub["t2v"].get(c)) for c in cols],
        ["this run"] + [format_metric(c, pub.get("this_run", {}).get(c)) for c in cols],
    ]
    out = [f"## Published zero-shot figure: CLIP {pub.get('model')} on {pub.get('dataset')}", ""]
    out += [md_table(["text-to-video"] + cols, rows), ""]
    out += [f"Source: {pub.get('citation')}; checked: {pub.get('checked')}.", "", f"Protocol: {pub.get('protocol')}."]
    out += [""] + [f"- {note}" for note in pub.get("notes", [])] + [""]
    return out


def _md_selective(results: dict[str, Any]) -> list[str]:
    selective = results.get("selective")
    if not isinstance(selective, dict):
        return []
    rec_keys = [k for k in selective if k.startswith("R@") and isinstance(selective[k], dict)]
    cov_keys: list[str] = []
    for k in rec_keys:
        for c in selective[k].get("at_coverage", {}):
            if c not in cov_keys:
                cov_keys.append(c)
    headers = ["Correct if", "Accuracy", "AURC", "AURC random", "AURC oracle"]
    headers += [f"Acc @ {c} cov." for c in cov_keys]
    rows = []
    for k in rec_keys:
        s = selective[k]
        row = [
            f"rank <= {k[2:]}",
            format_metric(k, s.get("accuracy")),
            _fmt_fraction(s.get("aurc")),
            _fmt_fraction(s.get("aurc_random")),
            _fmt_fraction(s.get("aurc_optimal")),
        ]
        rows.append(row + [format_metric(k, s.get("at_coverage", {}).get(c)) for c in cov_keys])
    note = (
        f"Confidence: `{selective.get('confidence', '?')}` (larger = more confident); "
        "AURC is the mean risk over coverages 1/Q..1, random = 1 - accuracy."
    )
    return ["## Selective prediction", "", note, "", md_table(headers, rows), ""]


def _md_variance(results: dict[str, Any]) -> list[str]:
    variance = results.get("variance")
    if not (isinstance(variance, dict) and isinstance(variance.get("mean"), dict)):
        return []
    names = [n for n in ("text", "bridge", "video") if n in variance["mean"]]
    headers = [""] + [n.capitalize() for n in names]
    rows = [
        ["Avg. sigma^2"] + [f"{variance['mean'][n]:.3f}" for n in names],
        ["Ratio"] + [f"{variance['ratio'][n]:.2f}" for n in names],
    ]
    return ["## Variance asymmetry", "", md_table(headers, rows), ""]


def _md_covariance(results: dict[str, Any]) -> list[str]:
    cov = results.get("covariance")
    if not isinstance(cov, dict) or cov.get("kind") not in ("lowrank", "mixture"):
        return []
    where = f"{cov.get('texts')} texts of the {cov.get('split')} split, D = {cov.get('dim')}"
    if cov["kind"] == "lowrank":
        logdet = cov.get("logdet", {})
        lines = [f"## Text covariance (lowrank:{cov.get('rank')})", "", f"On the {where}:", ""]
        rows = [
            ["share of the text variance in U U^T", _fmt_percent(cov.get("variance_share"))],
            [
                "mean log det Sigma_t (std)",
                f"{_fmt_opt(logdet.get('mean'), '.2f')} ({_fmt_opt(logdet.get('std'), '.2f')})",
            ],
            ["mean log det(I + U^T S^-1 U)", _fmt_opt(logdet.get("lowrank_part"), ".3f")],
        ]
        return lines + [md_table(["", "value"], rows), ""]
    k = cov.get("k", cov.get("topk", "?"))  # topk: metrics.json's key before issue 62
    weights = " / ".join(_fmt_opt(w, ".3f") for w in cov.get("weights", []))
    ranked = " / ".join(_fmt_opt(w, ".3f") for w in cov.get("ranked_weights", []))
    rows = [
        ["mean weight per component (sorted)", weights],
        ["mean weight by rank within a text", ranked],
        ["weight entropy / log K (1 = uniform)", _fmt_opt(cov.get("entropy"), ".3f")],
        [f"queries whose top {k} mix best components", _fmt_percent(cov.get("mixed_share"))],
        [f"distinct best components in a top {k}", _fmt_opt(cov.get("distinct_mean"), ".2f")],
    ]
    lines = [f"## Text covariance (mixture:{cov.get('components')})", "", f"On the {where}:", ""]
    return lines + [md_table(["", "value"], rows), ""]


def _fmt_percent(value: Any) -> str:
    return MISSING if value is None or not math.isfinite(float(value)) else f"{float(value) * 100:.1f} %"


def bridge_summary(bridge: dict[str, Any]) -> str:
    """One line: the bridge's pair-dependent share and what its constant control retrieves."""
    share = ", ".join(f"{k} {v * 100:.1f} %" for k, v in bridge.get("pair_dependent_share", {}).items())
    if bridge.get("drift") == "constant":
        return f"the bridge is a constant shift by construction (model.drift=constant): pair-dependent share {share}"
    probe, ctrl = bridge.get("probe", {}), bridge.get("constant_control", {})
    parts = bridge.get("decomposition", {}).get("mu", {})
    split = (
        (
            f" (mu: text {parts['text'] * 100:.1f} %, video {parts['video'] * 100:.1f} %, "
            f"pair {parts['interaction'] * 100:.1f} %)"
        )
        if parts
        else ""
    )
    return (
        f"bridge: pair-dependent share of its shift {share}{split} on {probe.get('texts')} x "
        f"{probe.get('videos')} {probe.get('split', '')} pairs; with the bridge replaced by its mean shift: "
        f"R@1 {ctrl.get('R@1', float('nan')):.1f}, MnR {ctrl.get('MnR', float('nan')):.1f}"
    )


def _md_bridge(results: dict[str, Any]) -> list[str]:
    bridge = results.get("bridge")
    if not isinstance(bridge, dict):
        return []
    lines = ["## What the bridge does per pair", ""]
    if bridge.get("drift") == "constant":
        return lines + [bridge_summary(bridge), ""]
    probe = bridge["probe"]
    lines += [
        f"The bridge's shift (bridged minus text, per feature) on {probe['texts']} texts x {probe['videos']} "
        f"videos of the {probe['split']} split ({probe['pairs']} pairs; the split has {probe['of'][0]} x "
        f"{probe['of'][1]}), as shares of its sum of squares: the mean shift over the pairs (constant), "
        "what depends on the text alone, on the video alone, and on the pair.",
        "",
    ]
    headers = ["state", "pair-dependent", "constant", "text", "video", "pair"]
    rows = [
        [k, f"{v['pair_dependent'] * 100:.1f} %"]
        + [f"{v[p] * 100:.1f} %" for p in ("constant", "text", "video", "interaction")]
        for k, v in bridge["decomposition"].items()
    ]
    lines += [md_table(headers, rows), ""]
    t2v, ctrl = results.get("t2v", {}), bridge["constant_control"]
    headers = ["text-to-video", "R@1", "R@5", "R@10", "MdR", "MnR"]
    rows = [
        ["with the bridge"] + [format_metric(c, t2v.get(c)) for c in headers[1:]],
        ["bridge replaced by its mean shift"] + [format_metric(c, ctrl.get(c)) for c in headers[1:]],
    ]
    lines += [
        "The constant-bridge control: the same trained model with the bridge replaced by its mean shift.",
        "",
        md_table(headers, rows),
        "",
    ]
    if bridge.get("acts_as_constant"):
        lines += ["**The bridge acts as a constant shift (a temperature) on this data.**", ""]
    return lines


def _md_neighbourhood(results: dict[str, Any]) -> list[str]:
    neighbourhood = results.get("neighbourhood")
    if not (isinstance(neighbourhood, dict) and neighbourhood.get("rows")):
        return []
    k = neighbourhood.get("k", neighbourhood.get("topk", "?"))  # topk, tau: its keys before issue 62
    gt_note = "counted" if neighbourhood.get("counts_gt") else "not counted"
    note = (
        f"Mean number of top-{k} videos whose cosine to the ground-truth video is at least the threshold "
        f"(ground truth itself {gt_note}); random = exact expectation under random ranking."
    )
    headers = ["cosine >=", "Model", "Random", "Random (sampled)", "Model / random"]
    rows = [
        [
            f"{r.get('cosine', r.get('tau')):g}",
            f"{r['model']:.3f}",
            f"{r['random']:.3f}",
            _fmt_opt(r.get("random_sampled"), ".3f"),
            _fmt_opt(r.get("ratio"), ".2f"),
        ]
        for r in neighbourhood["rows"]
    ]
    return ["## Local semantic neighbourhood", "", note, "", md_table(headers, rows), ""]


def _fmt_fraction(value: Any) -> str:
    return _fmt_opt(value, ".3f")


def _fmt_opt(value: Any, spec: str) -> str:
    if value is None:
        return MISSING
    f = float(value)
    return format(f, spec) if math.isfinite(f) else MISSING


# --------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------


def write_report(
    run_dir: Path,
    results: dict[str, Any],
    *,
    title: str,
    curves: dict[str, Any] | None = None,
    ranks: np.ndarray | None = None,
    reliability: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """Write metrics.json, report.md and the plots into ``run_dir``.

    ``curves`` is a ``selective_report()["curves"]`` dict; when None the one
    inside ``results["selective"]`` is used, and without either the
    risk-coverage plot is skipped.  ``ranks`` (Q,) are text-to-video ranks for
    ``rank_hist.png`` (skipped when None); ``reliability``: a calibration section's reliability bins for
    ``reliability.png``.  metrics.json holds every number
    of ``results`` except the per-query curve arrays, plus the title.
    Returns ``{"metrics": ..., "report": ..., "risk_coverage": ..., "rank_hist": ...}``
    (only the files written).
    """
    if not isinstance(results, dict) or "t2v" not in results:
        raise ConfigError("results must be a dict with at least a 't2v' section")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if curves is None and isinstance(results.get("selective"), dict):
        curves = results["selective"].get("curves")

    written: dict[str, Path] = {}
    plots: dict[str, Path] = {}
    if curves is not None and curves.get("coverage") is not None and curves.get("risk"):
        path = run_dir / "risk_coverage.png"
        plot_risk_coverage(curves, path)
        plots["risk_coverage"] = path
    if ranks is not None and np.asarray(ranks).size > 0:
        path = run_dir / "rank_hist.png"
        plot_rank_hist(np.asarray(ranks), path)
        plots["rank_hist"] = path
    if reliability:
        path = run_dir / "reliability.png"
        plot_reliability(reliability, path)
        plots["reliability"] = path

    payload = {"title": title, **_strip_curves(results)}
    payload.setdefault("postprocess", {"name": "none"})
    metrics_path = run_dir / RunFolder.METRICS
    # default=str: an odd attribute (bytes, a datetime) must not lose the whole report.
    text = json.dumps(to_jsonable(payload), indent=2, allow_nan=False, default=str)
    atomic_write_bytes(metrics_path, (text + "\n").encode("utf-8"))
    written["metrics"] = metrics_path

    report_path = run_dir / RunFolder.REPORT
    atomic_write_bytes(report_path, _render_markdown(title, payload, plots).encode("utf-8"))
    written["report"] = report_path
    written.update(plots)
    return written
