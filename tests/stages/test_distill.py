"""`dab distill`: the S-step student of a trained bridge, as an ordinary run folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dab_pipeline.cli import cli
from dab_pipeline.core.errors import ConfigError
from dab_pipeline.core.overrides import apply_overrides
from dab_pipeline.model.losses import distill_loss
from dab_pipeline.runs.checkpoint import load_checkpoint
from dab_pipeline.runs.config import TrainConfig
from dab_pipeline.runs.costfile import read_costs
from dab_pipeline.runs.load import load_run
from dab_pipeline.stages.distill import DistillConfig, pair_outputs, run_distill
from dab_pipeline.stages.train import resolve_train_config, run_train
from dab_pipeline.store import open_store
from dab_pipeline.testing import random_store

from ..helpers.runner import invoke

SMALL = ["model.drift_hidden=16", "model.time_embed_dim=8", "batch_size=8", "lr=3e-3", "epochs=2"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("distill")
    store = random_store(root / "store.h5")
    cfg = apply_overrides(
        TrainConfig(features=store, out=root / "teacher"), [*SMALL, "model.variant=dab", "model.steps=4"]
    )
    with open_store(store) as st:
        run_train(resolve_train_config(cfg, st.manifest))
    return root / "teacher"


def test_loss_is_zero_for_identical_outputs_and_positive_otherwise() -> None:
    torch.manual_seed(0)
    cost, state = torch.randn(6, 6), [torch.randn(6, 6, 4), torch.randn(6, 6, 4)]
    zero, parts = distill_loss(cost, state, cost, state, torch.tensor(1.0), 1.0, 1.0)
    assert float(zero) == pytest.approx(0.0, abs=1e-6) and parts["state"] == 0.0
    loss, parts = distill_loss(cost + torch.randn(6, 6), state, cost, state, torch.tensor(1.0), 1.0, 1.0)
    assert parts["rank"] > 0 and float(loss) > 0


def test_student_reaches_the_teachers_state_and_scores_everywhere(
    teacher: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "student"
    res = run_distill(
        DistillConfig(teacher=teacher, out=out, student_steps=1, epochs=30, batch_size=8, lr=3e-3, rank_weight=0.1)
    )
    t = load_run(teacher).model
    s = load_run(out, checkpoint="last.pt").model
    assert s.cfg.steps == 1 and t.cfg.steps == 4
    with open_store(load_run(teacher).config.features) as st:
        train = st.load_split("train")
    text = torch.as_tensor(train.text[:8])
    frames = torch.as_tensor(train.frames[train.caption_video[:8]])
    mask = torch.as_tensor(train.frame_mask[train.caption_video[:8]])
    with torch.no_grad():
        _, t_state = pair_outputs(t, text, frames, mask)
        _, s_state = pair_outputs(s, text, frames, mask)
        from dab_pipeline.stages.distill import build_student

        untrained = build_student(load_run(teacher).model, 1)  # the student before any distillation
        _, u_state = pair_outputs(untrained.eval(), text, frames, mask)
    err = max(float((a - b).abs().mean()) for a, b in zip(s_state, t_state))
    before = max(float((a - b).abs().mean()) for a, b in zip(u_state, t_state))
    assert err < 0.5 * before, (err, before)  # the distillation closed most of the gap on training pairs
    # only the bridge trained: every other weight is the teacher's
    ts, ss = (
        load_checkpoint(teacher / "checkpoints" / "best.pt")["model"],
        load_checkpoint(out / "checkpoints" / "last.pt")["model"],
    )
    assert all(torch.equal(ts[k], ss[k]) for k in ts if not k.startswith("bridge."))
    assert any(not torch.equal(ts[k], ss[k]) for k in ts if k.startswith("bridge."))
    info = json.loads((out / "distill.json").read_text())
    assert info["teacher_steps"] == 4 and len(info["teacher_checkpoint_sha256"]) == 64
    assert json.loads((out / "config.json").read_text())["model"]["steps"] == 1
    assert res.test_metrics is not None
    # the scoring benchmark compares it with its teacher on the same pairs
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_scoring", Path(__file__).parents[2] / "benchmarks" / "scoring.py"
    )
    bench = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(bench)
    bench.bench_teacher(
        str(out), str(teacher), str(load_run(teacher).config.features), "test", torch.device("cpu"), repeats=1
    )
    # an ordinary run folder: evaluate, compare and search read it
    runner = CliRunner()
    printed = capsys.readouterr().out
    assert "speed-up" in printed and "T'=4" in printed and "T'=1" in printed
    for args in (
        ["evaluate", "--run", str(out), "--no-plots", "--examples", "2"],
        ["evaluate", "--run", str(teacher), "--no-plots", "--examples", "0", "--out", str(tmp_path / "t")],
        ["compare", str(tmp_path / "t"), str(out)],
    ):
        r = runner.invoke(cli, args, catch_exceptions=False)
        assert r.exit_code == 0, r.output


def test_resume_equals_uninterrupted(teacher: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dab_pipeline.stages.distill.run as D

    cfg = dict(teacher=teacher, student_steps=2, epochs=3, batch_size=8)
    run_distill(DistillConfig(out=tmp_path / "a", **cfg))
    real = D.DistillTask.begin_epoch
    calls = {"n": 0}

    def dying(self, epoch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, epoch)

    monkeypatch.setattr(D.DistillTask, "begin_epoch", dying)
    with pytest.raises(KeyboardInterrupt):
        run_distill(DistillConfig(out=tmp_path / "b", **cfg))
    monkeypatch.setattr(D.DistillTask, "begin_epoch", real)
    run_distill(DistillConfig(out=tmp_path / "b", **cfg), resume=True)
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")["model"]
    # a resume replays the uninterrupted run's computation from its saved state: bit-equal on any CPU (promised)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    ca = np.asarray(load_checkpoint(tmp_path / "a" / "checkpoints" / "best.pt")["best_value"] or 0)
    cb = np.asarray(load_checkpoint(tmp_path / "b" / "checkpoints" / "best.pt")["best_value"] or 0)
    assert ca == cb
    # a resume that asks for another distillation than the folder holds is refused, naming the option
    with pytest.raises(ConfigError, match=r"student_steps \(saved 2, given 3\)"):
        run_distill(DistillConfig(out=tmp_path / "b", **{**cfg, "student_steps": 3}), resume=True)


def test_a_run_without_a_bridge_is_refused(teacher: Path, tmp_path: Path) -> None:
    store = load_run(teacher).config.features
    cfg = apply_overrides(TrainConfig(features=store, out=tmp_path / "prob"), [*SMALL, "model.variant=prob"])
    with open_store(store) as st:
        run_train(resolve_train_config(cfg, st.manifest))
    with pytest.raises(ConfigError, match="has no bridge to distill"):
        run_distill(DistillConfig(teacher=tmp_path / "prob", out=tmp_path / "s"))
    r = invoke(["distill", "--run", str(tmp_path / "prob"), "--out", str(tmp_path / "s2")])
    assert r.exit_code != 0 and "has no bridge to distill" in r.output and "Traceback" not in r.output


def test_distillation_counts_steps_like_its_teacher(tmp_path: Path) -> None:
    """The teacher's epoch mode (one caption per video), its weight decay and warm-up, then a cosine decay."""
    from dab_pipeline.core.events import Event

    store = random_store(tmp_path / "store.h5")  # 20 training videos, 2 captions each
    cfg = apply_overrides(
        TrainConfig(features=store, out=tmp_path / "teacher"),
        [*SMALL, "model.variant=dab", "model.steps=2", "epoch=videos", "weight_decay=0.05", "warmup_ratio=0.2"],
    )
    with open_store(store) as st:
        run_train(resolve_train_config(cfg, st.manifest))
    events: list[Event] = []
    out = tmp_path / "student"
    run_distill(DistillConfig(teacher=tmp_path / "teacher", out=out, epochs=3, batch_size=4), progress=events.append)
    steps = sum(e.n for e in events if e.kind == "advance" and e.task == "distill")
    assert steps == 3 * (20 // 4)  # videos per epoch, not the 40 captions
    saved = json.loads((out / "config.json").read_text())
    assert saved["weight_decay"] == 0.05 and saved["warmup_ratio"] == 0.2 and saved["epoch"] == "videos"
    ck = load_checkpoint(out / "checkpoints" / "last.pt")
    assert ck["sched"]["last_epoch"] == steps and ck["optim"]["param_groups"][0]["lr"] == pytest.approx(0.0, abs=1e-9)
    assert ck["optim"]["param_groups"][0]["weight_decay"] == 0.05


def _dying_after(monkeypatch: pytest.MonkeyPatch, epochs: int) -> None:
    """Ctrl-C in distillation epoch ``epochs + 1`` (the first ``epochs`` are saved)."""
    import dab_pipeline.stages.distill.run as D

    real, calls = D.DistillTask.begin_epoch, {"n": 0}

    def dying(self, epoch):
        calls["n"] += 1
        if calls["n"] > epochs:
            raise KeyboardInterrupt
        return real(self, epoch)

    monkeypatch.setattr(D.DistillTask, "begin_epoch", dying)


def test_a_bare_resume_continues_a_distillation_started_with_other_values(
    teacher: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dab distill --resume` with nothing else typed: a default the user never gave is not a change."""
    out = tmp_path / "student"
    args = ["distill", "--run", teacher, "--out", out, "--quiet"]
    with monkeypatch.context() as m:
        _dying_after(m, 1)
        res = invoke([*args, "--epochs", "2", "--student-steps", "2", "--set", "lr=2e-3", "--set", "rank_weight=0.5"])
    assert res.exit_code == 130, res.output
    res = invoke([*args, "--resume"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "status.json").read_text())["state"] == "complete"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "config.json").read_text())["model"]["steps"] == 2
    # an option typed with another value than the saved one is still refused, naming it (and only it)
    for extra, named in (
        (["--epochs", "3"], "epochs (saved 2, given 3)"),
        (["--set", "lr=1e-3"], "lr (saved 0.002, given 0.001)"),
    ):
        res = invoke([*args, "--resume", *extra])
        text = " ".join(res.output.split())
        assert res.exit_code != 0 and named in text and "Traceback" not in res.output, res.output
        assert "student_steps" not in text and "rank_weight" not in text
    res = invoke([*args, "--resume", "--epochs", "2", "--student-steps", "2"])  # typed, but as saved
    assert res.exit_code == 0, res.output
    # a folder of an older dab holds None for the teacher's weight decay and warm-up: still the same distillation
    info = json.loads((out / "distill.json").read_text())
    info["distill"].update(weight_decay=None, warmup_ratio=None)
    (out / "distill.json").write_text(json.dumps(info))
    res = invoke([*args, "--resume"])
    assert res.exit_code == 0, res.output


def test_the_student_inherits_the_teachers_training_values_unless_typed(tmp_path: Path) -> None:
    """A teacher trained with --batch-size 4 on a split smaller than the default batch of 32: its student trains."""
    store = random_store(tmp_path / "store.h5", caps_per_video=1)  # 20 training captions
    teacher = tmp_path / "teacher"
    res = invoke(
        [
            "train",
            "--features",
            store,
            "--variant",
            "dab",
            "--steps",
            "2",
            "--epochs",
            "1",
            "--batch-size",
            "4",
            "--out",
            teacher,
            "--quiet",
            "--set",
            "model.drift_hidden=16",
            "--set",
            "model.time_embed_dim=8",
            "--set",
            "lr=3e-3",
            "--set",
            "weight_decay=0.05",
        ]
    )
    assert res.exit_code == 0, res.output
    out = tmp_path / "student"
    res = invoke(["distill", "--run", teacher, "--out", out, "--epochs", "1"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "inherited from the teacher: batch_size=4, lr=0.003, weight_decay=0.05" in text, text
    saved = json.loads((out / "config.json").read_text())
    assert saved["batch_size"] == 4 and saved["lr"] == 3e-3 and saved["weight_decay"] == 0.05
    assert json.loads((out / "distill.json").read_text())["distill"]["batch_size"] == 4  # what ran, not "inherit"
    # typed values are the user's: batch_size 2 is used and not reported as inherited
    res = invoke(
        [
            "distill",
            "--run",
            teacher,
            "--out",
            tmp_path / "typed",
            "--epochs",
            "1",
            "--set",
            "batch_size=2",
            "--set",
            "lr=1e-3",
        ]
    )
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "inherited from the teacher: weight_decay=0.05" in text and "batch_size=" not in text, text
    saved = json.loads((tmp_path / "typed" / "config.json").read_text())
    assert saved["batch_size"] == 2 and saved["lr"] == 1e-3


def test_the_student_inherits_the_batch_its_teacher_really_ran(tmp_path: Path) -> None:
    """Issue 59, 8f: `dab train` lowers a batch larger than the training split (32 to the 20 captions here) and
    records it in precision.json, config.json keeping the request; distill took the 32 and refused the teacher."""
    store = random_store(tmp_path / "store.h5", caps_per_video=1)  # 20 training captions
    teacher = tmp_path / "teacher"
    small = ["model.drift_hidden=16", "model.time_embed_dim=8"]
    args = ["train", "--features", store, "--variant", "dab", "--steps", "2", "--epochs", "1", "--out", teacher]
    res = invoke([*args, "--quiet", *[x for s in small for x in ("--set", s)]])
    assert res.exit_code == 0, res.output
    assert json.loads((teacher / "config.json").read_text())["batch_size"] == 32  # the request, as before
    assert json.loads((teacher / "precision.json").read_text())["batch_size"] == {"requested": 32, "used": 20}
    out = tmp_path / "student"
    res = invoke(["distill", "--run", teacher, "--out", out, "--epochs", "1"])
    assert res.exit_code == 0, res.output
    assert "inherited from the teacher: batch_size=20," in " ".join(res.output.split()), res.output
    assert json.loads((out / "config.json").read_text())["batch_size"] == 20
    res = invoke(["distill", "--run", teacher, "--out", out, "--epochs", "1", "--resume"])  # the same, resumed
    assert res.exit_code == 0 and "differ" not in res.output, res.output


def test_a_student_inside_another_runs_folder_is_refused(teacher: Path) -> None:
    inside = teacher / "student"
    with pytest.raises(ConfigError, match=f"inside the run folder {teacher}"):
        run_distill(DistillConfig(teacher=teacher, out=inside, student_steps=1, epochs=1))
    assert not inside.exists()
    r = invoke(["distill", "--run", str(teacher), "--out", str(inside)])
    assert r.exit_code == 2 and "inside the run folder" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("cov", ["lowrank:2", "mixture:2"])
def test_a_lowrank_dab_run_distills_and_its_student_scores(tmp_path: Path, cov: str) -> None:
    """The student copies the factor or mixture heads (frozen, like every non-bridge weight) and carries U as its teacher."""
    store = random_store(tmp_path / "store.h5")
    cfg = apply_overrides(
        TrainConfig(features=store, out=tmp_path / "teacher"),
        [*SMALL, "epochs=1", "model.variant=dab", "model.steps=2", f"model.covariance={cov}"],
    )
    with open_store(store) as st:
        run_train(resolve_train_config(cfg, st.manifest))
    out = tmp_path / "student"
    res = invoke(["distill", "--run", str(tmp_path / "teacher"), "--out", str(out), "--epochs", "1"])
    assert res.exit_code == 0, res.output
    student = load_run(out, checkpoint="last.pt").model
    assert student.cfg.covariance == cov and student.cfg.steps == 1
    ts, ss = (
        load_checkpoint(tmp_path / "teacher" / "checkpoints" / "best.pt")["model"],
        load_checkpoint(out / "checkpoints" / "last.pt")["model"],
    )
    head = "factor_head" if cov.startswith("lowrank") else "mixture."
    assert any(head in k for k in ss) and all(torch.equal(ts[k], ss[k]) for k in ts if head in k)
    costs = sorted(out.glob("costs_*.h5"))
    assert costs and all(np.isfinite(read_costs(p).cost).all() for p in costs), sorted(p.name for p in out.iterdir())


def _plain_distillation(teacher: Path, out: Path) -> tuple[dict, list[float]]:
    """The distillation as a plain loop (what `dab distill` ran before it used the shared training loop), with
    the values the student's config.json recorded: its final weights and each epoch's mean loss."""
    from dab_pipeline.runs.schedule import epoch_length, epoch_order, lr_lambda
    from dab_pipeline.stages.distill import build_student

    saved, t = json.loads((out / "config.json").read_text()), load_run(teacher)
    info = json.loads((out / "distill.json").read_text())["distill"]
    student = build_student(t.model, info["student_steps"])
    with open_store(t.config.features) as st:
        train = st.load_split("train")
    text, frames, mask = (torch.as_tensor(a) for a in (train.text, train.frames, train.frame_mask))
    cv = np.asarray(train.caption_video)
    b, epochs = saved["batch_size"], saved["epochs"]
    updates = epoch_length(cv, saved["epoch"]) // b
    optim = torch.optim.AdamW(
        [p for p in student.parameters() if p.requires_grad], lr=saved["lr"], weight_decay=saved["weight_decay"]
    )
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda(updates * epochs, saved["warmup_ratio"]))
    torch.manual_seed(saved["seed"])
    temperature, means = t.model.temperature().detach(), []
    for epoch in range(epochs):
        order, total = epoch_order(cv, saved["epoch"], saved["seed"], epoch), 0.0
        student.eval(), t.model.eval()
        for u in range(updates):
            q = order[u * b : (u + 1) * b]
            v = torch.as_tensor(cv[q.numpy()])
            with torch.no_grad():
                t_cost, t_state = pair_outputs(t.model, text[q], frames[v], mask[v])
            s_cost, s_state = pair_outputs(student, text[q], frames[v], mask[v])
            loss, _ = distill_loss(
                s_cost, s_state, t_cost, t_state, temperature, info["state_weight"], info["rank_weight"]
            )
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            sched.step()
            total += float(loss.detach())
        means.append(total / updates)
    return student.state_dict(), means


def test_the_shared_loop_distills_as_the_plain_loop_it_replaced(teacher: Path, tmp_path: Path) -> None:
    """`dab distill` is a task of the training loop `dab train` runs: its student is the plain loop's."""
    out = tmp_path / "student"
    run_distill(DistillConfig(teacher=teacher, out=out, student_steps=1, epochs=3, batch_size=8, rank_weight=0.1))
    plain, means = _plain_distillation(teacher, out)
    got = load_checkpoint(out / "checkpoints" / "last.pt")["model"]
    assert set(got) == set(plain)
    for k in plain:  # the same operations in the same order: equal up to float noise on any CPU
        torch.testing.assert_close(got[k], plain[k], rtol=1e-5, atol=1e-6, msg=k)
    logged = [json.loads(line)["loss"]["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged == pytest.approx(means, rel=1e-5, abs=1e-7)
    assert all(m > 0 for m in means) and means[-1] < means[0]  # it trained


def test_a_distillation_saved_before_the_shared_loop_resumes(teacher: Path, tmp_path: Path, monkeypatch) -> None:
    """Checkpoints of older distillations hold no position within an epoch, no world size and one random stream."""
    cfg = dict(teacher=teacher, student_steps=2, epochs=2, batch_size=8)
    run_distill(DistillConfig(out=tmp_path / "a", **cfg))
    with monkeypatch.context() as m:
        _dying_after(m, 1)
        with pytest.raises(KeyboardInterrupt):
            run_distill(DistillConfig(out=tmp_path / "b", **cfg))
    last = tmp_path / "b" / "checkpoints" / "last.pt"
    ck = load_checkpoint(last)
    for key in ("step_in_epoch", "epoch_loss", "epoch_sums", "world_size", "rng_ranks"):
        del ck[key]
    torch.save(ck, last)
    run_distill(DistillConfig(out=tmp_path / "b", **cfg), resume=True)
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(last)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
