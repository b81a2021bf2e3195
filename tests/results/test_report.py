"""Tests of dab_pipeline.results.report: files written, readable and consistent with the metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dab_pipeline import metrics as M
from dab_pipeline.core.errors import ConfigError
from dab_pipeline.results.compare import compare_markdown, compare_table
from dab_pipeline.results.report import format_metric, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _fake_results(seed: int = 0, q: int = 60, v: int = 20):
    rng = np.random.default_rng(seed)
    gt = np.arange(q) % v  # 3 captions per video
    cost = rng.random((q, v))
    cost[np.arange(q), gt] -= 0.4  # a model that is right most of the time
    results = M.evaluate_all(cost, gt)
    results["selective"] = M.selective_report(cost, gt)
    results["variance"] = M.variance_asymmetry(rng.random(q) * 0.5 + 0.25, rng.random(q) + 0.5, rng.random(q) * 3 + 1.5)
    results["neighbourhood"] = M.semantic_neighbourhood(
        cost, gt, rng.normal(size=(v, 8)), cosine_thresholds=(0.0, 0.3), k=5
    )
    return results, M.t2v_ranks(cost, gt)


def test_write_report_writes_readable_files(tmp_path):
    results, ranks = _fake_results()
    paths = write_report(tmp_path / "run", results, title="Demo run", curves=None, ranks=ranks)
    assert set(paths) == {"metrics", "report", "risk_coverage", "rank_hist"}

    data = json.loads(paths["metrics"].read_text())
    assert data["title"] == "Demo run"
    assert data["t2v"]["R@1"] == pytest.approx(results["t2v"]["R@1"])
    assert data["v2t"]["n"] == 20
    assert data["postprocess"] == {"name": "none"}
    assert data["selective"]["R@1"]["aurc"] == pytest.approx(results["selective"]["R@1"]["aurc"])
    assert "curves" not in data["selective"]  # per-query arrays are plotted, not stored
    assert data["variance"]["ratio"]["text"] == 1.0
    assert len(data["neighbourhood"]["rows"]) == 2

    md = paths["report"].read_text()
    assert md.startswith("# Demo run")
    assert "| R@1 | R@5 | R@10 | MdR | MnR | RSum | R@50 |" in md
    t2v = results["t2v"]
    row = " | ".join(format_metric(k, t2v[k]) for k in ("R@1", "R@5", "R@10", "MdR", "MnR", "RSum", "R@50"))
    assert f"| {row} |" in md
    assert "## Video-to-text (20 videos)" in md
    assert "Post-processing: **none**" in md
    assert "## Selective prediction" in md and "Acc @ 25% cov." in md
    assert f"{results['selective']['R@1']['aurc']:.3f}" in md
    assert "## Variance asymmetry" in md and "| Ratio | 1.00 |" in md
    assert "## Local semantic neighbourhood" in md and "not counted" in md
    assert "![risk_coverage](risk_coverage.png)" in md

    for key in ("risk_coverage", "rank_hist"):
        blob = paths[key].read_bytes()
        assert blob.startswith(PNG_MAGIC) and len(blob) > 1000
    # Atomic writes leave no temporary files behind.
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "metrics.json",
        "rank_hist.png",
        "report.md",
        "risk_coverage.png",
    ]


def test_write_report_minimal_and_overwrite(tmp_path):
    results = {"t2v": M.retrieval_metrics(np.array([1, 2, 3]))}
    first = write_report(tmp_path, results, title="first", curves=None, ranks=None)
    assert set(first) == {"metrics", "report"}  # no curves, no ranks -> no plots
    results2 = {"t2v": M.retrieval_metrics(np.array([1, 1, 1])), "extra": np.float32(0.5)}
    write_report(tmp_path, results2, title="second", curves=None, ranks=None)
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert data["title"] == "second" and data["t2v"]["R@1"] == 100.0
    assert data["extra"] == 0.5
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_write_report_labels_postprocessing_and_handles_large_ranks(tmp_path):
    rng = np.random.default_rng(1)
    cost = rng.random((40, 300))
    gt = rng.integers(0, 300, size=40)
    results = M.evaluate_all(cost, gt, postprocess="dsl", postprocess_temperature=0.05)
    sel = M.selective_report(cost, gt)
    paths = write_report(tmp_path, results, title="dsl", curves=sel["curves"], ranks=M.t2v_ranks(cost, gt))
    md = paths["report"].read_text()
    assert "Post-processing: **dsl (temperature=0.05)**" in md
    assert json.loads(paths["metrics"].read_text())["postprocess"]["name"] == "dsl"
    assert paths["rank_hist"].read_bytes().startswith(PNG_MAGIC)  # log-x branch
    assert paths["risk_coverage"].read_bytes().startswith(PNG_MAGIC)


def test_write_report_rejects_results_without_t2v(tmp_path):
    with pytest.raises(ConfigError):
        write_report(tmp_path, {"v2t": {}}, title="x", curves=None, ranks=None)


def test_compare_table_two_runs():
    base = {
        "t2v": {"R@1": 46.9, "R@5": 72.8, "R@10": 82.2, "MdR": 2, "MnR": 14.3, "RSum": 201.9},
        "postprocess": {"name": "none"},
    }
    dab = {
        "t2v": {"R@1": 52.64, "R@5": 82.7, "R@10": 90.8, "MdR": 1.0, "MnR": 5.3},
        "postprocess": {"name": "dsl", "temperature": 0.01},
    }
    headers, rows = compare_table([("Baseline", base), ("DAB", dab)])
    assert headers == ["Method", "R@1", "R@5", "R@10", "MdR", "MnR", "RSum"]
    assert rows[0] == ["Baseline", "46.9", "72.8", "82.2", "2", "14.30", "201.9"]
    # Missing RSum prints as a dash; the post-processing label follows the name.
    assert rows[1] == ["DAB [dsl (temperature=0.01)]", "52.6", "82.7", "90.8", "1", "5.30", "–"]
    md = compare_markdown([("Baseline", base), ("DAB", dab)])
    lines = md.strip().splitlines()
    assert lines[0] == "| Method | R@1 | R@5 | R@10 | MdR | MnR | RSum |"
    assert lines[2].startswith("| Baseline | 46.9 |") and len(lines) == 4
    # A run without the requested section gets a row of dashes rather than an error.
    # A free-text label (string) is shown as given.
    _, rows_str = compare_table([("IS", {"t2v": base["t2v"], "postprocess": "inverted softmax"})])
    assert rows_str[0][0] == "IS [inverted softmax]"
    _, rows_v2t = compare_table([("Baseline", base)], direction="v2t")
    assert rows_v2t == [["Baseline"] + ["–"] * 6]


def test_v2t_convention_is_named_in_metrics_json_and_report(tmp_path):
    results, ranks = _fake_results()  # 3 captions per video: the conventions differ
    for name, words in (
        ("videos", "each other video ranked once, by its best caption"),
        ("captions", "every caption of every other video ranked"),
    ):
        rng = np.random.default_rng(0)
        gt = np.arange(60) % 20
        cost = rng.random((60, 20))
        res = dict(results, **M.evaluate_all(cost, gt, v2t_convention=name))
        paths = write_report(tmp_path / name, res, title=name, curves=None, ranks=ranks)
        assert json.loads(paths["metrics"].read_text())["v2t_convention"] == name
        assert words in paths["report"].read_text()
