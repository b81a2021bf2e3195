"""`dab sweep` on a tiny store: the grid, reuse, collapsed rows, failures, interruption, --jobs, the table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError, RunLockedError
from dab_pipeline.results.sweep import sweep_table
from dab_pipeline.runs.costfile import read_costs
from dab_pipeline.stages.sweep import (
    SweepConfig,
    SweepPlan,
    SweepRow,
    grid_plan,
    load_plan,
    load_sweep_config,
    plan_from_dict,
    plan_names,
    resolve_plan,
    run_sweep,
)
from dab_pipeline.testing import random_store

from ..helpers.runner import invoke

SMALL = ("model.drift_hidden=16", "model.time_embed_dim=8", "batch_size=8", "lr=3e-3", "epochs=2")
GRID = ["model.variant=xpool,dab", "model.steps=2,4"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_store(tmp_path_factory.mktemp("sweep") / "s.h5", n_videos=30)


@pytest.fixture(scope="module")
def swept(store: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("sweep") / "one"
    events = []
    res = run_sweep(
        SweepConfig(features=store, out=out, plan=grid_plan(GRID, seeds=(1, 2)), overrides=SMALL),
        progress=events.append,
    )
    return out, res, events


def test_a_grid_runs_every_row_and_seed_and_collapses_what_a_variant_ignores(swept) -> None:
    out, res, events = swept
    rows = list(res.table["rows"])
    assert rows == ["variant=xpool,steps=2", "variant=dab,steps=2", "variant=dab,steps=4"]
    assert res.notes == [
        "row variant=xpool,steps=4 is row variant=xpool,steps=2 (model.steps has no effect on xpool): run once"
    ]
    assert len(res.done) == 6 and not res.failed and not res.reused
    for row in rows:  # ordinary run folders: trained, evaluated
        for seed in (1, 2):
            run = out / row / f"seed{seed}"
            assert json.loads((run / "status.json").read_text())["state"] == "complete"
            assert json.loads((run / "config.json").read_text())["seed"] == seed
            assert (run / "metrics.json").is_file()
    assert {p.name for p in out.iterdir() if p.is_file()} >= {"sweep.json", "sweep.md", "sweep.png", "sweep_plan.json"}
    table = json.loads((out / "sweep.json").read_text())
    r1 = table["rows"]["variant=dab,steps=4"]["columns"]["R@1"]
    got = [
        json.loads((out / "variant=dab,steps=4" / f"seed{s}" / "metrics.json").read_text())["t2v"]["R@1"]
        for s in (1, 2)
    ]
    assert r1["values"] == got and r1["mean"] == pytest.approx(np.mean(got))
    assert table["rows"]["variant=xpool,steps=2"]["vs_baseline"] is None  # the baseline row
    vs = table["rows"]["variant=dab,steps=2"]["vs_baseline"]
    assert vs["seeds"] == [1, 2] and vs["low"] <= vs["diff"] <= vs["high"]
    md = (out / "sweep.md").read_text()
    assert "R@1 - variant=xpool,steps=2" in md and "run once" in md
    assert any(e.kind == "info" and "run once" in e.message for e in events)


def test_the_same_sweep_again_reuses_every_run(swept, store: Path) -> None:
    out, first, _ = swept
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("checkpoints/*.pt")}
    res = run_sweep(SweepConfig(features=store, out=out, plan=grid_plan(GRID, seeds=(1, 2)), overrides=SMALL))
    assert not res.done and len(res.reused) == 6
    assert {p: p.stat().st_mtime_ns for p in out.rglob("checkpoints/*.pt")} == stamps  # nothing retrained
    assert res.table["rows"] == json.loads(json.dumps(first.table["rows"], default=float))


@pytest.mark.slow
def test_jobs_2_gives_the_numbers_of_jobs_1(swept, store: Path, tmp_path: Path) -> None:
    out, first, _ = swept
    res = run_sweep(
        SweepConfig(features=store, out=tmp_path / "two", plan=grid_plan(GRID, seeds=(1, 2)), overrides=SMALL, jobs=2)
    )
    assert len(res.done) == 6 and not res.failed
    for row, vals in first.table["rows"].items():
        for col in ("R@1", "R@5", "R@10", "MdR", "MnR", "v2t R@1"):
            assert res.table["rows"][row]["columns"][col]["values"] == vals["columns"][col]["values"], (row, col)
        for seed in (1, 2):  # the costs themselves, up to float32 summation order (2 threads against 1)
            a = read_costs(next((out / row / f"seed{seed}").glob("costs_test.*"))).cost
            b = read_costs(next((tmp_path / "two" / row / f"seed{seed}").glob("costs_test.*"))).cost
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)


def test_a_failed_run_does_not_stop_the_others_and_a_rerun_retries_it(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dab_pipeline.stages.sweep.one as one

    real = one.run_train

    def broken_for_seed_2(cfg, **kw):
        if cfg.seed == 2:
            raise RuntimeError("simulated: the disk went away")
        return real(cfg, **kw)

    monkeypatch.setattr(one, "run_train", broken_for_seed_2)
    plan = grid_plan(["model.variant=xpool,prob"], seeds=(1, 2))
    args = [
        "sweep",
        "--features",
        store,
        "--out",
        tmp_path / "s",
        "--grid",
        "model.variant=xpool,prob",
        "--seeds",
        "1",
        "2",
        *[a for s in SMALL for a in ("--set", s)],
        "--quiet",
    ]
    r = invoke(args)
    assert r.exit_code == 1, r.output
    assert "2 run(s) failed" in r.output and "simulated: the disk went away" in r.output and "Traceback" not in r.output
    assert "variant=prob" in r.output  # the table of what finished is printed all the same
    table = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert sorted(table["failed"]) == [str(tmp_path / "s" / r / "seed2") for r in ("variant=prob", "variant=xpool")]
    assert table["rows"]["variant=prob"]["seeds"] == [1]
    monkeypatch.setattr(one, "run_train", real)
    res = run_sweep(load_sweep_config(tmp_path / "s"))  # what --resume runs: only the two that failed
    assert sorted(res.done) == sorted(table["failed"]) and len(res.reused) == 2 and not res.failed
    assert resolve_plan(plan, store, tmp_path / "s", SMALL).runs[0].config.seed == 1


def test_an_interrupted_sweep_loses_only_the_run_in_flight(store: Path, tmp_path: Path) -> None:
    cfg = SweepConfig(
        features=store,
        out=tmp_path / "k",
        plan=grid_plan(["model.variant=prob"], seeds=(1, 2)),
        overrides=(*SMALL[:-1], "epochs=3"),
    )
    epochs = []

    def stop_in_the_second_run(event) -> None:
        if event.kind == "advance" and "epoch" in event.data:  # a run's epoch, shown on the sweep's line
            epochs.append(event.data["epoch"])
            if len(epochs) == 5:  # run 1 done (3 epochs), run 2 at its second epoch
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, progress=stop_in_the_second_run)
    second = tmp_path / "k" / "variant=prob" / "seed2"
    assert json.loads((second / "status.json").read_text())["state"] == "interrupted"
    res = run_sweep(cfg)
    assert res.reused == [str(tmp_path / "k" / "variant=prob" / "seed1")] and res.done == [str(second)]
    log = [json.loads(x)["epoch"] for x in (second / "metrics.jsonl").read_text().splitlines()]
    assert log == [1, 2, 3]  # resumed after its checkpoint, not started over


def test_bad_plans_fail_before_any_run_naming_the_row(store: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sweep row nope=1: .*unknown key 'nope'; valid: .*epochs"):
        run_sweep(SweepConfig(features=store, out=tmp_path / "a", plan=grid_plan(["nope=1"], seeds=(1,))))
    with pytest.raises(ConfigError, match=r"sweep row steps=0: .*model.steps=0 is invalid"):
        run_sweep(
            SweepConfig(
                features=store,
                out=tmp_path / "a",
                plan=grid_plan(["model.steps=0"], seeds=(1,)),
                overrides=("model.variant=xpool",),
            )
        )
    assert not (tmp_path / "a").exists()
    with pytest.raises(ConfigError, match="--baseline model.variant=prob: no row has these values"):
        grid_plan(["model.variant=xpool,dab"], baseline="model.variant=prob")


SEEDS_OWN_IT = "seed is set by --seeds (the plan's seeds)"


def test_seed_in_a_grid_a_plan_or_set_is_refused_pointing_to_seeds(store: Path, tmp_path: Path) -> None:
    """Every run's seed is the plan's (--seeds): a seed anywhere else was silently overridden (rows seed=1,2,3 all
    trained with seed 1), so it is refused with where to put it instead."""
    with pytest.raises(ConfigError, match=r"--grid seed=1,2,3: seed is set by --seeds .*pass --seeds 1,2,3"):
        grid_plan(["model.variant=xpool", "seed=1,2,3"], seeds=(1,))
    for data, where in (
        ({"grid": {"seed": [1, 2]}}, "grid seed=1,2"),
        ({"rows": [{"name": "a", "set": {"seed": 5}}]}, "row a seed=5"),
        ({"grid": {"model.steps": [8]}, "set": {"seed": 5}}, "set seed=5"),
    ):
        with pytest.raises(ConfigError, match=rf"sweep plan 'mine': {where}: {re.escape(SEEDS_OWN_IT)}.*\"seeds\""):
            plan_from_dict(data, "mine")
    with pytest.raises(
        ConfigError, match=re.escape(SEEDS_OWN_IT)
    ):  # a plan built in Python, as the benchmarks build theirs
        SweepPlan(name="py", rows=(SweepRow("a", {"seed": 5}),))
    with pytest.raises(ConfigError, match=r"--set seed=5: seed is set by --seeds .*pass --seeds 5"):
        SweepConfig(
            features=store,
            out=tmp_path / "a",
            plan=grid_plan(["model.variant=xpool"], seeds=(1,)),
            overrides=(*SMALL, "seed=5"),
        )
    assert not (tmp_path / "a").exists()


def test_the_cli_refuses_seed_in_grid_plan_or_set_in_one_line(store: Path, tmp_path: Path) -> None:
    plan = tmp_path / "mine.json"
    plan.write_text(json.dumps({"rows": [{"name": "a", "set": {"model.variant": "xpool", "seed": 7}}]}))
    sets = [a for s in SMALL for a in ("--set", s)]
    for extra in (
        ["--grid", "seed=1,2,3", "--seeds", "1"],
        ["--plan", plan, "--seeds", "1"],
        ["--grid", "model.variant=xpool", "--set", "seed=5"],
    ):
        r = invoke(["sweep", "--features", store, "--out", tmp_path / "s", *extra, *sets, "--quiet"])
        assert r.exit_code != 0 and "Traceback" not in r.output, r.output
        assert SEEDS_OWN_IT in " ".join(r.output.split()), r.output  # rich may wrap the line
    assert not (tmp_path / "s").exists()  # refused before any run


def test_a_run_another_sweep_finished_is_not_listed_as_failed(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sweeps into one --out: the first is locked out of seed 2 while the second trains it, then writes its
    sweep.md after the second finished it. The run is in the table; its stale failure must not be listed too."""
    import dab_pipeline.stages.sweep.one as one

    real, out, racing = one.run_train, tmp_path / "s", []
    second = SweepConfig(features=store, out=out, plan=grid_plan(["model.variant=xpool"], seeds=(2,)), overrides=SMALL)

    def locked_out_while_the_other_sweep_finishes_it(cfg, **kw):
        if cfg.seed != 2 or racing:
            return real(cfg, **kw)
        racing.append(cfg.out)
        run_sweep(second)  # the other `dab sweep`: trains and evaluates seed 2
        raise RunLockedError(f"{cfg.out} is being written by another process (pid 1: dab train)")

    monkeypatch.setattr(one, "run_train", locked_out_while_the_other_sweep_finishes_it)
    res = run_sweep(
        SweepConfig(features=store, out=out, plan=grid_plan(["model.variant=xpool"], seeds=(1, 2, 3)), overrides=SMALL)
    )
    assert racing == [out / "variant=xpool" / "seed2"]
    assert res.table["rows"]["variant=xpool"]["seeds"] == [1, 2, 3]
    md = (out / "sweep.md").read_text()
    assert "| variant=xpool | 3 |" in md and "Failed runs" not in md
    assert json.loads((out / "sweep.json").read_text())["failed"] == {} and not res.failed
    assert any("seed2" in n and "finished" in n for n in res.notes)  # what happened is said, not hidden


def test_more_seeds_reuse_the_runs_and_a_foreign_run_is_refused(swept, store: Path) -> None:
    out, _, _ = swept
    res = run_sweep(SweepConfig(features=store, out=out, plan=grid_plan(GRID, seeds=(2, 3)), overrides=SMALL))
    rows = ("variant=xpool,steps=2", "variant=dab,steps=2", "variant=dab,steps=4")
    assert sorted(res.reused) == sorted(str(out / r / "seed2") for r in rows)  # the runs it shares: reused
    assert sorted(res.done) == sorted(str(out / r / "seed3") for r in rows)
    assert res.table["rows"]["variant=dab,steps=4"]["seeds"] == [2, 3]
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("config.json")}
    with pytest.raises(ConfigError, match=r"holds a run of another configuration \(lr \(saved 0.003, given 0.01\)"):
        run_sweep(SweepConfig(features=store, out=out, plan=grid_plan(GRID, seeds=(1,)), overrides=(*SMALL, "lr=0.01")))
    assert {p: p.stat().st_mtime_ns for p in out.rglob("config.json")} == stamps  # refused before anything ran
    r = invoke(["sweep", "--resume", "--out", out, "--grid", "model.variant=dab"])
    assert r.exit_code != 0 and "drop the options" in r.output


def test_the_cli_prints_the_table_and_accepts_seed_lists(swept, store: Path) -> None:
    out, first, _ = swept
    sets = [a for s in SMALL for a in ("--set", s)]
    r = invoke(
        [
            "sweep",
            "--features",
            store,
            "--out",
            out,
            *[a for g in GRID for a in ("--grid", g)],
            "--seeds",
            "1,2",
            *sets,
            "--quiet",
        ]
    )
    assert r.exit_code == 0, r.output
    assert "0 run(s) done, 6 reused, 0 failed" in r.output and "variant=dab" in r.output
    # outside a terminal (click's runner, a log, CI) the table fits 120 columns (issue 61, item 5), each std under
    # its mean, and is whole: no cell cut
    assert "…" not in r.output and max(len(x) for x in r.output.splitlines()) <= 120, r.output
    for name, row in first.table["rows"].items():
        v = row["vs_baseline"]
        diff = "-" if v is None else f"{v['diff']:+.1f} [{v['low']:+.1f}, {v['high']:+.1f}]"
        assert name in r.output and diff in r.output, (name, diff, r.output)
    r = invoke(["sweep", "--resume", "--out", out, "--json", "--quiet"])
    assert r.exit_code == 0 and json.loads(r.output)["baseline"] == "variant=xpool,steps=2"
    r = invoke(["sweep", "--features", store, "--out", out, "3"])
    assert r.exit_code != 0 and "seeds go after --seeds" in r.output


def test_shipped_plans_are_the_papers_tables() -> None:
    assert plan_names() == ("paper-table4", "paper-table5a", "paper-table5b")
    t4, t5a, t5b = (load_plan(n) for n in plan_names())
    assert [r.values["model.steps"] for r in t4.rows] == [8, 16, 32, 64] and t4.baseline_row == "steps=32"
    assert [r.values["model.variant"] for r in t5a.rows] == ["xpool", "prob", "bridge", "dab"]
    assert t5a.baseline_row == "variant=xpool" and t5b.baseline_row == "cost=kl"
    assert {p.recipe for p in (t4, t5a, t5b)} == {"paper-ablation"} and t4.seeds == (1, 2, 3)
    with pytest.raises(ConfigError, match="unknown sweep plan 'table9'; valid: paper-table4"):
        load_plan("table9")


def test_the_table_of_identical_rows_has_an_interval_around_zero() -> None:
    rng = np.random.default_rng(0)
    hits = {s: (rng.random(50) < 0.4).astype(float) for s in (1, 2, 3)}

    def runs(h):
        return {
            s: {"metrics": {"t2v": {"R@1": 100 * h[s].mean()}}, "hits": h[s], "query_ids": list(range(50))} for s in h
        }

    table = sweep_table({"a": runs(hits), "b": runs(hits)}, "a")
    v = table["rows"]["b"]["vs_baseline"]
    assert v["diff"] == 0 and v["low"] == 0 and v["high"] == 0 and not v["excludes_zero"]
    assert table["rows"]["a"]["columns"]["R@1"]["values"] == [100 * hits[s].mean() for s in (1, 2, 3)]
    other = {s: 1.0 - h for s, h in hits.items()}  # another row on the same queries: paired, seeds pooled
    v = sweep_table({"a": runs(hits), "b": runs(other)}, "a")["rows"]["b"]["vs_baseline"]
    expected = 100 * (np.mean([other[s] for s in hits], axis=0) - np.mean([hits[s] for s in hits], axis=0)).mean()
    assert v["diff"] == pytest.approx(expected) and v["excludes_zero"]


@pytest.mark.slow
def test_the_ray_backend_runs_the_sweep_on_a_local_instance(swept, store: Path, tmp_path: Path) -> None:
    """Two Ray tasks on a local instance write the same runs as the in-process sweep (skipped without ray)."""
    ray = pytest.importorskip("ray")
    out, first, _ = swept
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        res = run_sweep(
            SweepConfig(
                features=store,
                out=tmp_path / "ray",
                plan=grid_plan(["model.variant=xpool,dab", "model.steps=2"], seeds=(1,)),
                overrides=SMALL,
                backend="ray",
            )
        )
    finally:
        ray.shutdown()
    assert len(res.done) == 2 and not res.failed, res.failed
    for row in ("variant=xpool,steps=2", "variant=dab,steps=2"):
        a = read_costs(next((tmp_path / "ray" / row / "seed1").glob("costs_test.*"))).cost
        b = read_costs(next((out / row / "seed1").glob("costs_test.*"))).cost
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4, err_msg=row)


def test_variant_cost_and_steps_are_the_model_keys_in_grids_plans_set_and_baseline(store: Path, tmp_path: Path) -> None:
    """`dab train`'s option names are the same keys as model.variant, model.cost, model.steps in a sweep."""
    out = tmp_path / "s"
    long = resolve_plan(
        grid_plan(GRID, seeds=(1,), baseline="model.variant=dab"), store, out, (*SMALL, "model.cost=w2")
    )
    short = resolve_plan(
        grid_plan(["variant=xpool,dab", "steps=2,4"], seeds=(1,), baseline="variant=dab"),
        store,
        out,
        (*SMALL, "cost=w2"),
    )
    assert short.rows == long.rows == ["variant=xpool,steps=2", "variant=dab,steps=2", "variant=dab,steps=4"]
    assert short.baseline == long.baseline == "variant=dab,steps=2" and short.notes == long.notes
    assert [r.config for r in short.runs] == [r.config for r in long.runs]
    assert {r.config.model.cost for r in short.runs} == {"w2"}
    plan = plan_from_dict(
        {
            "set": {"cost": "w2"},
            "grid": {"variant": ["prob", "dab"]},
            "rows": [{"name": "short", "set": {"variant": "dab", "steps": 2}}],
            "baseline": {"variant": "prob"},
        },
        "mine",
    )
    assert [r.name for r in plan.rows] == ["variant=prob", "variant=dab", "short"]
    assert plan.values == {"model.cost": "w2"} and plan.rows[2].values == {"model.variant": "dab", "model.steps": 2}
    assert plan.baseline_row == "variant=prob"
    with pytest.raises(ConfigError, match="--grid model.variant is given twice"):
        grid_plan(["model.variant=dab", "variant=xpool"])
    with pytest.raises(ConfigError, match="grid names a key twice"):
        plan_from_dict({"grid": {"variant": ["dab"], "model.variant": ["xpool"]}}, "twice")


def test_the_controls_are_variants_of_a_grid_with_todays_configs(store: Path, tmp_path: Path) -> None:
    """variant=dab-const in a grid or plan is the run model.variant=dab model.drift=constant made (and reuses it)."""
    out = tmp_path / "s"
    named = resolve_plan(grid_plan(["variant=dab,dab-const,prob-fixvar,dab-fixvar"], seeds=(1,)), store, out, SMALL)
    assert named.rows == ["variant=dab", "variant=dab-const", "variant=prob-fixvar", "variant=dab-fixvar"]
    old = SweepPlan(
        "old",
        rows=(
            SweepRow("variant=dab-const", {"model.variant": "dab", "model.drift": "constant"}),
            SweepRow("variant=prob-fixvar", {"model.variant": "prob", "model.variance": "fixed"}),
            SweepRow("variant=dab-fixvar", {"model.variant": "dab", "model.variance": "fixed"}),
        ),
        seeds=(1,),
    )
    by_row = {r.row: r.config for r in named.runs}
    for run in resolve_plan(old, store, out, SMALL).runs:
        assert by_row[run.row] == run.config, run.row  # the same config, the same folder: a sweep reuses it
    assert by_row["variant=dab"].model.drift == "mlp"
    with pytest.raises(ConfigError, match=r"sweep row variant=dab-const,drift=mlp: .*contradicts"):
        resolve_plan(grid_plan(["variant=dab-const", "model.drift=mlp"], seeds=(1,)), store, out, SMALL)
    with pytest.raises(ConfigError, match=r"sweep row variant=dab-cosnt: unknown model variant .*dab-const"):
        resolve_plan(grid_plan(["variant=dab-cosnt"], seeds=(1,)), store, out, SMALL)


def test_a_grid_over_the_covariance_runs_each_form_and_refuses_a_variant_without_one(
    store: Path, tmp_path: Path
) -> None:
    """model.covariance in a grid (issue 36): lowrank:2 and mixture:2 of prob each train and evaluate; a row pairing
    it with xpool fails before any run, naming the row."""
    out = tmp_path / "cov"
    plan = grid_plan(["model.covariance=lowrank:2,mixture:2"], seeds=(1,))
    sets = (*SMALL, "epochs=1", "model.variant=prob")
    res = run_sweep(SweepConfig(features=store, out=out, plan=plan, overrides=sets))
    assert res.ok and len(res.done) == 2
    assert list(res.table["rows"]) == ["covariance=lowrank:2", "covariance=mixture:2"]
    for row in res.table["rows"]:
        run = out / row / "seed1"
        assert json.loads((run / "config.json").read_text())["model"]["covariance"] == row.split("=")[1]
        assert np.isfinite(json.loads((run / "metrics.json").read_text())["t2v"]["R@1"])
    with pytest.raises(ConfigError, match=r"sweep row variant=xpool,covariance=lowrank:2: .*not available"):
        run_sweep(
            SweepConfig(
                features=store,
                out=tmp_path / "bad",
                plan=grid_plan(["model.variant=xpool", "model.covariance=lowrank:2"], seeds=(1,)),
                overrides=SMALL,
            )
        )
    assert not (tmp_path / "bad").exists()
