"""`dab evaluate`, `dab compare`, the CLI reference and the demo pipeline."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.runs.costfile import CostMatrix, write_costs
from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate
from dab_pipeline.testing import random_store

from ..helpers.runner import invoke
from ..helpers.training import train_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    from dab_pipeline.stages.train import run_train

    root = tmp_path_factory.mktemp("runs")
    store = random_store(root / "store.h5")
    for variant in ("xpool", "dab"):
        run_train(train_config(store, root / variant, f"model.variant={variant}", "epochs=2"))
    return store, root / "xpool", root / "dab"


def test_evaluate_run_writes_reports(two_runs) -> None:
    store, _, run = two_runs
    res = invoke(["evaluate", "--run", str(run)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "text-to-video" in res.output and "video-to-text" in res.output
    m = json.loads((run / "metrics.json").read_text())
    assert set(m["t2v"]) >= {"R@1", "R@5", "R@10", "R@50", "MdR", "MnR", "RSum"}
    assert m["postprocess"]["name"] == "none"
    # the numbers agree with metrics computed straight from the cost file
    from dab_pipeline.metrics import t2v_metrics
    from dab_pipeline.runs.costfile import read_costs

    cm = read_costs(run / "costs_test.h5")
    assert m["t2v"]["R@1"] == pytest.approx(t2v_metrics(cm.cost, cm.gt)["R@1"])
    assert "variance" in m and m["variance"]["mean"]["video"] > 0
    assert "neighbourhood" in m and len(m["neighbourhood"]["rows"]) == 4  # read the store for video features
    assert {"R@1", "R@5"} <= set(m["selective"])
    # a diagonal run has no covariance block (issue 36's diagnostics are for lowrank and mixture runs)
    assert "covariance" not in m and set(m) == {
        *("title", "source", "queries", "videos", "t2v", "v2t", "v2t_convention", "postprocess", "selective"),
        *("variance", "neighbourhood", "bridge", "run"),
    }
    report = (run / "report.md").read_text()
    assert "R@1" in report and "MnR" in report and "Text covariance" not in report
    for png in ("risk_coverage.png", "rank_hist.png"):
        data = (run / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_run_folder_files_follow_the_umask(two_runs) -> None:
    """Labs share run folders: files are 0666 less the umask, like any other file, not mkstemp's 0600."""
    import os

    _, _, run = two_runs
    assert invoke(["evaluate", "--run", str(run)]).exit_code == 0
    mask = os.umask(0o022)
    os.umask(mask)
    names = [
        "config.json",
        "status.json",
        "metrics.json",
        "report.md",
        "risk_coverage.png",
        "rank_hist.png",
        "store_manifest.json",
        "checkpoints/last.pt",
        "checkpoints/best.pt",
    ]
    for name in names:
        assert (run / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


def test_postprocessing_is_labelled(two_runs, tmp_path: Path) -> None:
    _, run, _ = two_runs
    res = run_evaluate(
        EvaluateConfig(run=run, out=tmp_path, postprocess="dsl", postprocess_temperature=0.1, plots=False)
    )
    assert res["postprocess"]["name"] == "dsl"
    assert json.loads((tmp_path / "metrics.json").read_text())["postprocess"]["name"] == "dsl"
    assert (
        "dsl" in (tmp_path / "report.md").read_text().lower() or "dual" in (tmp_path / "report.md").read_text().lower()
    )


def test_evaluate_any_cost_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    sim = rng.normal(size=(6, 4)).astype(np.float32)
    gt = np.array([0, 0, 1, 2, 3, 3])
    sim[np.arange(6), gt] += 5.0  # a method that is always right
    np.savez(
        tmp_path / "other.npz",
        similarity=sim,
        gt=gt,
        query_ids=np.array([f"q{i}" for i in range(6)]),
        video_ids=np.array([f"v{i}" for i in range(4)]),
    )
    res = invoke(["evaluate", "--costs", str(tmp_path / "other.npz"), "--json", "--no-plots"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    m = json.loads(res.output)
    assert m["t2v"]["R@1"] == 100.0 and m["v2t"]["R@1"] == 100.0
    # the same matrix as an h5 cost file written by the library
    write_costs(
        tmp_path / "c.h5",
        CostMatrix(
            cost=-sim,
            query_ids=np.array([f"q{i}" for i in range(6)]),
            video_ids=np.array([f"v{i}" for i in range(4)]),
            gt=gt,
        ),
    )
    m2 = run_evaluate(EvaluateConfig(costs=tmp_path / "c.h5", plots=False))
    assert m2["t2v"] == m["t2v"]


def test_evaluate_a_bare_npy_matrix_with_kind(tmp_path: Path) -> None:
    """`dab evaluate --costs x.npy` names the CLI option it needs (--kind), and works with it."""
    rng = np.random.default_rng(0)
    sim = rng.normal(size=(5, 5)).astype(np.float32)
    sim[np.arange(5), np.arange(5)] += 5.0  # square: query i matches video i; always right as similarities
    np.save(tmp_path / "x.npy", sim)
    res = invoke(["evaluate", "--costs", tmp_path / "x.npy", "--no-plots", "--examples", "0"])
    assert res.exit_code == 2 and "--kind cost" in res.output and "--kind similarity" in res.output, res.output
    assert "kind='cost'" not in res.output and "Traceback" not in res.output  # not the library's keyword
    args = ["evaluate", "--costs", tmp_path / "x.npy", "--json", "--no-plots", "--examples", "0"]
    res = invoke([*args, "--kind", "similarity"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["t2v"]["R@1"] == 100.0
    res = invoke([*args, "--kind", "cost"], catch_exceptions=False)  # the same numbers read as costs: always wrong
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["t2v"]["R@1"] == 0.0
    # --kind belongs to --costs, and a file that records its kind must agree with it
    assert invoke(["evaluate", "--run", tmp_path, "--kind", "cost"]).exit_code == 2
    np.savez(tmp_path / "s.npz", similarity=sim)
    res = invoke(["evaluate", "--costs", tmp_path / "s.npz", "--kind", "cost", "--no-plots", "--examples", "0"])
    assert res.exit_code != 0 and "'similarity'" in res.output and "Traceback" not in res.output, res.output


def test_evaluate_errors_are_one_line(tmp_path: Path) -> None:
    res = invoke(["evaluate"])
    assert res.exit_code != 0 and "--run" in res.output
    (tmp_path / "empty").mkdir()
    res = invoke(["evaluate", "--run", str(tmp_path / "empty")])
    assert res.exit_code != 0 and "no cost file" in res.output and "Traceback" not in res.output


def test_compare_two_runs(two_runs, tmp_path: Path) -> None:
    _, a, b = two_runs
    for run in (a, b):
        assert invoke(["evaluate", "--run", str(run), "--no-plots"]).exit_code == 0
    res = invoke(["compare", str(a), str(b), "--out", str(tmp_path / "cmp.md")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "xpool" in res.output and "dab" in res.output
    md = (tmp_path / "cmp.md").read_text()
    assert "| xpool" in md and "| dab" in md and "R@1" in md


@pytest.mark.parametrize(
    "damage", [b'{"t2v": {"R@1": 4', b"[1, 2, 3]", b"\xff\xfe not text"], ids=["truncated", "not-an-object", "not-utf8"]
)
@pytest.mark.parametrize("name_file", [False, True], ids=["folder", "file"])
def test_compare_names_a_damaged_metrics_json(tmp_path: Path, damage: bytes, name_file: bool) -> None:
    """A truncated, non-object or non-UTF-8 metrics.json: one line naming it and how to remake it, no traceback."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_bytes(damage)
    res = invoke(["compare", str(run / "metrics.json") if name_file else str(run)])
    text = " ".join(res.output.split())  # whatever the terminal width, the message is one line
    assert res.exit_code != 0 and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert str(run / "metrics.json") in text and "damaged" in text and f"dab evaluate --run {run}" in text, text


def _small_costs(path: Path, nan: bool = True) -> Path:
    cost = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.5]], np.float32)
    if nan:
        cost[1, 1] = np.nan
    write_costs(
        path,
        CostMatrix(
            cost=cost, query_ids=np.array(["q0", "q1", "q2"]), video_ids=np.array(["v0", "v1"]), gt=np.array([0, 1, 1])
        ),
    )
    return path


def test_a_failed_evaluation_leaves_no_new_folder(tmp_path: Path) -> None:
    """NaN costs fail in one line, and --out is made only when there is something to write in it."""
    costs = _small_costs(tmp_path / "nan.h5")
    out = tmp_path / "reports" / "nan"
    res = invoke(["evaluate", "--costs", str(costs), "--out", str(out), "--no-plots"])
    assert res.exit_code != 0 and "NaN" in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "reports").exists()
    existing = tmp_path / "existing"  # a folder that was there before is never removed
    existing.mkdir()
    assert invoke(["evaluate", "--costs", str(costs), "--out", str(existing)]).exit_code != 0
    assert existing.is_dir() and not any(existing.iterdir())


def test_an_evaluation_failing_at_its_first_write_removes_the_folders_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import dab_pipeline.stages.evaluate.run as evaluate

    def full_disk(out_dir: Path, *args, **kwargs):
        out_dir.mkdir(parents=True, exist_ok=True)
        raise OSError(errno.ENOSPC, "No space left on device", str(out_dir / "metrics.json"))

    monkeypatch.setattr(evaluate, "write_report", full_disk)
    costs = _small_costs(tmp_path / "ok.h5", nan=False)
    with pytest.raises(OSError, match="No space left"):
        run_evaluate(EvaluateConfig(costs=costs, out=tmp_path / "reports" / "ok", plots=False, examples=0))
    assert not (tmp_path / "reports").exists()
    with pytest.raises(OSError, match="No space left"):  # the cost file's own folder, which existed, stays
        run_evaluate(EvaluateConfig(costs=costs, plots=False, examples=0))
    assert costs.exists()


def test_evaluate_config_refuses_a_post_processing_temperature_not_above_zero(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="post-processing temperature must be > 0"):
        EvaluateConfig(costs=tmp_path, postprocess_temperature=0.0)


def test_cli_reference_is_current() -> None:
    from dab_pipeline.cli.docgen import render

    assert (REPO / "docs" / "cli.md").read_text() == render(), "docs/cli.md is stale: run `make docs-cli`"


@pytest.mark.slow
def test_demo_pipeline_small(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The demo end to end on the tiny world: extract with dab-world, train, evaluate, compare, search."""
    from dab_pipeline.cli.demo import QUERIES, main

    assert main(["--out", str(tmp_path / "demo"), "--world", "tiny", "--epochs", "2", "--quiet"]) == 0
    out, err = capsys.readouterr()
    # its log, as `make demo > log` writes it (issue 61, item 5): every line within 120 columns, no character cut
    for line in (out + err).splitlines():
        assert len(line) <= 120 and "\ufffd" not in line, line
    for command in ("extract", "train", "evaluate", "compare", "search"):
        assert f"$ dab {command}" in out
    md = (tmp_path / "demo" / "comparison.md").read_text()
    assert "xpool" in md and "dab" in md
    for variant in ("xpool", "dab"):
        assert (tmp_path / "demo" / "runs" / variant / "metrics.json").exists()
    # search shows each query's hits with what the videos really contain
    descriptions = json.loads((tmp_path / "demo" / "world" / "descriptions.json").read_text())
    assert all(q in out for q in QUERIES) and "what the video shows" in out
    assert any(text[:40] in out for text in descriptions.values())


def test_the_demos_calibration_captions_are_every_validation_caption(tmp_path: Path) -> None:
    """issue 61, item 1: the demo's store gets every caption of the validation videos (the calibration's queries),
    the training videos every caption, the test videos their one query."""
    from dab_pipeline.cli.demo import _every_validation_caption
    from dab_pipeline.world import make_world, world_preset

    captions = make_world(tmp_path / "world", world_preset("tiny"))
    rows = lambda p: list(csv.DictReader(open(p, newline="", encoding="utf-8")))  # noqa: E731
    got, every, one = (
        rows(_every_validation_caption(captions)),
        rows(captions.parent / "captions_all.csv"),
        rows(captions),
    )
    by_split = lambda rs, s: sorted((r["video_id"], r["caption"]) for r in rs if r["split"] == s)  # noqa: E731
    assert by_split(got, "val") == by_split(every, "val") and len(by_split(got, "val")) > len(by_split(one, "val"))
    assert by_split(got, "test") == by_split(one, "test") and by_split(got, "train") == by_split(every, "train")
