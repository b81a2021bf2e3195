"""Stage two: `dab train` on cached stores (frozen and partial fine-tuning)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline.core.errors import ConfigError, TrainingError
from dab_pipeline.core.overrides import apply_overrides
from dab_pipeline.runs.checkpoint import load_checkpoint
from dab_pipeline.runs.config import TrainConfig
from dab_pipeline.runs.costfile import read_costs
from dab_pipeline.stages.train import resolve_train_config, run_train
from dab_pipeline.store import open_store
from dab_pipeline.testing import random_store as make_random_store

from ..helpers.runner import invoke
from ..helpers.training import SMALL_TRAIN, interrupt_at, interrupted_run, patch_loss, train_config


@pytest.fixture(scope="module")
def random_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_store(tmp_path_factory.mktemp("rs") / "store.h5")


@pytest.mark.parametrize("variant", ["xpool", "prob", "bridge", "dab"])
def test_each_variant_writes_a_complete_run(random_store: Path, tmp_path: Path, variant: str) -> None:
    out = tmp_path / variant
    res = run_train(train_config(random_store, out, f"model.variant={variant}", "epochs=2"))
    assert (out / "config.json").exists() and (out / "store_manifest.json").exists()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2] and all("val" in x for x in lines)
    assert (out / "checkpoints" / "best.pt").exists() and (out / "checkpoints" / "last.pt").exists()
    cm = read_costs(res.costs_path)
    assert cm.cost.shape == (10, 5) and cm.cost.dtype == np.float32
    assert list(cm.video_ids) == ["v25", "v26", "v27", "v28", "v29"]
    np.testing.assert_array_equal(cm.gt, np.repeat(np.arange(5), 2))
    np.testing.assert_array_equal(cm.ranking[:, 0], cm.cost.argmin(1))
    if variant in ("prob", "dab"):
        assert {"text_var", "bridged_var", "video_var"} <= set(cm.extras)
        assert np.all(cm.extras["video_var"] > 0)
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "complete"
    # clustered features are easy: training must beat chance (R@1 = 20%) clearly
    assert res.test_metrics["R@1"] > 40.0


def test_bf16_scoring_gives_the_float32_ranking(random_store: Path, tmp_path: Path) -> None:
    # score_dtype only changes how val / test are scored: one epoch (no selection), near-equal costs
    runs = {
        dt: run_train(train_config(random_store, tmp_path / dt, "model.variant=dab", "epochs=1", f"score_dtype={dt}"))
        for dt in ("float32", "bfloat16")
    }
    c32, c16 = (read_costs(runs[dt].costs_path).cost for dt in ("float32", "bfloat16"))
    assert np.max(np.abs(c16 - c32) / np.abs(c32)) < 2e-2
    assert np.mean(c16.argmin(1) == c32.argmin(1)) >= 0.9
    saved = json.loads((tmp_path / "bfloat16" / "config.json").read_text())
    assert saved["score_dtype"] == "bfloat16"
    with pytest.raises(ConfigError, match="score_dtype"):
        train_config(random_store, tmp_path / "x", "score_dtype=float16")


@pytest.mark.parametrize("epoch", ["captions", "videos"])
def test_resume_equals_uninterrupted(
    random_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, epoch: str
) -> None:
    sets = ["model.variant=dab", "epochs=3", "checkpoint_every=1", f"epoch={epoch}"]
    a = run_train(train_config(random_store, tmp_path / "a", *sets))
    restore = patch_loss(monkeypatch, interrupt_at(4))  # second step of the second epoch (2 steps per epoch)
    with pytest.raises(KeyboardInterrupt):
        run_train(train_config(random_store, tmp_path / "b", *sets))
    restore()
    b = run_train(train_config(random_store, tmp_path / "b", *sets), resume=True)

    sa = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")["model"]
    sb = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")["model"]
    # a resume replays the uninterrupted run's computation from its saved state: weights, costs and losses are
    # bit-equal on any CPU (promised)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)
    np.testing.assert_array_equal(read_costs(a.costs_path).cost, read_costs(b.costs_path).cost)
    la = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    lb = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["train_loss"] for x in la] == [json.loads(x)["train_loss"] for x in lb]


def test_epoch_orders() -> None:
    from dab_pipeline.runs.schedule import epoch_length, epoch_order

    caption_video = np.repeat(np.arange(7), [1, 3, 2, 5, 1, 4, 2])  # (18,) captions of 7 videos
    caps = epoch_order(caption_video, "captions", seed=3, epoch=0)
    assert sorted(caps.tolist()) == list(range(18)) and epoch_length(caption_video, "captions") == 18
    seen_first = set()
    for epoch in range(30):
        vids = epoch_order(caption_video, "videos", seed=3, epoch=epoch)
        assert len(vids) == 7 == epoch_length(caption_video, "videos")
        assert sorted(caption_video[vids.numpy()].tolist()) == list(range(7))  # one caption per video
        seen_first.add(int(vids[0]))
        assert torch.equal(vids, epoch_order(caption_video, "videos", seed=3, epoch=epoch))  # (seed, epoch) only
    # every caption of a video gets drawn over epochs, and the video order changes
    drawn = {int(c) for e in range(30) for c in epoch_order(caption_video, "videos", 3, e)}
    assert drawn == set(range(18)) and len(seen_first) > 3
    with pytest.raises(ValueError, match="epoch"):
        TrainConfig(features=Path("x.h5"), out=Path("r"), epoch="steps")


def test_nan_loss_stops_with_a_clear_message(
    random_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    patch_loss(monkeypatch, lambda n, compute: compute() * float("nan") if n == 6 else compute())  # 5 steps an epoch
    out = tmp_path / "nan"
    with pytest.raises(TrainingError, match=r"epoch 2, update 1 \(update 6 of the run\)"):
        run_train(train_config(random_store, out, "epochs=3"))
    ck = load_checkpoint(out / "checkpoints" / "last.pt")
    assert ck["epoch"] == 1 and all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())
    assert json.loads((out / "status.json").read_text())["state"] == "failed"


def test_existing_run_is_not_overwritten(random_store: Path, tmp_path: Path) -> None:
    run_train(train_config(random_store, tmp_path / "r", "epochs=1"))
    with pytest.raises(TrainingError, match="state 'complete'.*another --out"):
        run_train(train_config(random_store, tmp_path / "r", "epochs=1"))


def test_interrupted_run_with_a_checkpoint_needs_resume(
    random_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dab_pipeline.stages.train as tr

    real = tr.score_split

    def interrupt(*args, **kwargs):  # Ctrl-C during validation, after the first epoch's checkpoint
        raise KeyboardInterrupt

    monkeypatch.setattr(tr.trainer, "score_split", interrupt)
    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt):
        run_train(train_config(random_store, out, "epochs=2", "checkpoint_every=1"))
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "interrupted" and status["resumable"] is True
    monkeypatch.setattr(tr.trainer, "score_split", real)
    with pytest.raises(TrainingError, match="state 'interrupted'.*--resume"):
        run_train(train_config(random_store, out, "epochs=2", "checkpoint_every=1"))
    res = run_train(train_config(random_store, out, "epochs=2", "checkpoint_every=1"), resume=True)
    assert res.epochs_done == 2


def test_run_that_stopped_before_a_checkpoint_starts_over(
    random_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dab_pipeline.stages.train as tr

    real = tr.score_split

    def broken(*args, **kwargs):
        raise RuntimeError("simulated failure in validation")

    monkeypatch.setattr(tr.trainer, "score_split", broken)
    out = tmp_path / "r"
    with pytest.raises(RuntimeError):
        run_train(train_config(random_store, out, "epochs=1"))
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "failed" and "simulated failure" in status["error"]
    assert not (out / "checkpoints" / "last.pt").exists()
    monkeypatch.setattr(tr.trainer, "score_split", real)
    events = []
    res = run_train(train_config(random_store, out, "epochs=1", "batch_size=4"), progress=events.append)
    assert res.epochs_done == 1 and json.loads((out / "status.json").read_text())["state"] == "complete"
    assert json.loads((out / "config.json").read_text())["batch_size"] == 4  # the new settings, not the old
    assert any("starting over" in (e.message or "") for e in events)


def test_a_batch_larger_than_the_split_is_lowered_with_one_line(
    random_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small folder of one's own: the batch becomes the training split's size, said once; precision.json records
    the batch that ran, config.json the request, so an interrupted run resumes with the same config (as a sweep's
    resume and `dab train --resume` give it) and a rerun of a finished one is "complete", not "another config"."""
    with open_store(random_store) as st:
        captions = len(st.load_split("train").caption_ids)
    out, events = tmp_path / "r", []
    sets = ["epochs=2", "batch_size=100000", "checkpoint_every=1"]
    restore = patch_loss(monkeypatch, interrupt_at(2))  # the second epoch's one step
    with pytest.raises(KeyboardInterrupt):
        run_train(train_config(random_store, out, *sets), progress=events.append)
    restore()
    lines = [e.message for e in events if e.kind == "warning" and "batch_size" in (e.message or "")]
    assert lines == [
        f"batch_size 100000 exceeds the {captions} training captions of {random_store}: lowered to "
        f"{captions} (recorded in precision.json; --batch-size sets it)"
    ]
    assert json.loads((out / "config.json").read_text())["batch_size"] == 100000
    assert json.loads((out / "precision.json").read_text())["batch_size"] == {"requested": 100000, "used": captions}
    res = run_train(train_config(random_store, out, *sets), resume=True)  # the same config as the sweep holds
    assert res.epochs_done == 2 and json.loads((out / "status.json").read_text())["state"] == "complete"
    again = run_train(train_config(random_store, out, *sets), resume=True)
    assert again.epochs_done == 2  # complete: nothing to resume, no "another configuration"
    cli = invoke(["train", "--resume", "--out", str(out)])
    assert cli.exit_code == 0 and "complete" in cli.output, cli.output


def test_split_all_is_for_search_not_for_training(random_store: Path, tmp_path: Path) -> None:
    for name in ("train_split", "val_split", "test_split"):
        with pytest.raises(ConfigError, match=f"{name} must name one split of the store, not 'all'"):
            train_config(random_store, tmp_path / "r", f"{name}=all")


def test_a_split_too_small_for_any_batch_is_one_line(tmp_path: Path) -> None:
    store = make_random_store(tmp_path / "s.h5", n_videos=3, caps_per_video=2, splits=("train", "val", "test"))
    out = tmp_path / "r"
    with pytest.raises(ConfigError, match="no batch of 2 or more"):
        run_train(train_config(store, out, "epochs=1", "epoch=videos"))  # an epoch of 1 video
    assert not out.exists()


def test_trainable_blocks_need_a_store_with_states(random_store: Path, tmp_path: Path) -> None:
    cfg = apply_overrides(TrainConfig(features=random_store, out=tmp_path / "x"), ["trainable_blocks=1"])
    with open_store(random_store) as st, pytest.raises(ConfigError, match="needs a store extracted with"):
        resolve_train_config(cfg, st.manifest)


def test_msvd_dropout_default(random_store: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(features=random_store, out=tmp_path / "x")
    assert resolve_train_config(cfg, {"dataset": "msvd"}).model.dropout == 0.4
    assert resolve_train_config(cfg, {"dataset": "msvd"}, {"model.dropout"}).model.dropout == cfg.model.dropout
    assert resolve_train_config(cfg, {"dataset": "msrvtt"}).model.dropout == 0.3


@pytest.fixture(scope="module")
def states_store(tiny_folder_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dab_pipeline.stages.extract import ExtractConfig, run_extract

    out = tmp_path_factory.mktemp("k1") / "store.h5"
    run_extract(
        ExtractConfig(
            dataset="folder",
            out=out,
            annotations=tiny_folder_dataset,
            videos=tiny_folder_dataset.parent / "videos",
            model="dab-tiny",
            pretrained=None,
            trainable_blocks=1,
            store_dtype="float32",
            workers=0,
            batch_size=3,
        )
    )
    return out


def test_partial_heads_reproduce_stored_features_at_init(states_store: Path) -> None:
    from dab_pipeline.runs.inputs import SplitArrays, TrainHeads, text_state_batch

    with open_store(states_store) as st:
        manifest = st.manifest
        split = st.load_split("train", with_states=True)
    feats = SplitArrays(split, torch.device("cpu"), True)
    heads = TrainHeads(manifest, 1, torch.device("cpu")).eval()
    with torch.no_grad():
        frames = heads.encode_frames(feats.vision_states.float())  # (V, F, D)
        states, lengths = text_state_batch(feats, torch.arange(feats.num_queries), torch.device("cpu"))
        text = heads.encode_text(states, lengths)  # (Q, D)
    torch.testing.assert_close(frames, feats.frames, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(text, feats.text, rtol=1e-4, atol=1e-4)


def test_partial_finetuning_trains_clip_blocks(states_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "ft"
    cfg = train_config(states_store, out, "trainable_blocks=1", "epochs=2", "batch_size=4", "clip_lr=1e-3")
    assert cfg.model.embed_dim == 32
    res = run_train(cfg)
    ck = load_checkpoint(out / "checkpoints" / "last.pt")
    assert ck["heads"] is not None
    from dab_pipeline.runs.inputs import TrainHeads

    with open_store(states_store) as st:
        init = TrainHeads(st.manifest, 1, torch.device("cpu")).state_dict()
    changed = [k for k, v in ck["heads"].items() if not torch.equal(v, init[k])]
    assert any(k.startswith("vision.") for k in changed) and any(k.startswith("text.") for k in changed)
    assert read_costs(res.costs_path).cost.shape == (2, 1)
    # the bridge diagnostics read the test split through the run's fine-tuned heads
    from dab_pipeline.stages.evaluate import bridge_report

    bridge = bridge_report(out, read_costs(res.costs_path), states_store)
    assert bridge["probe"]["pairs"] == 2 and set(bridge["pair_dependent_share"]) == {"mu", "logvar"}


def test_cli_train_and_resume(random_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    args = [
        "train",
        "--features",
        str(random_store),
        "--variant",
        "prob",
        "--epochs",
        "1",
        "--out",
        str(out),
        "--quiet",
        *[x for s in SMALL_TRAIN for x in ("--set", s)],
    ]
    res = invoke(args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "test t2v: R@1" in res.output
    assert json.loads((out / "config.json").read_text())["model"]["variant"] == "prob"
    res = invoke(args)
    assert res.exit_code != 0 and "another --out" in res.output and "Traceback" not in res.output
    res = invoke(["train", "--resume", "--out", str(out), "--quiet"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    # --resume keeps the saved configuration: an option that would change it is refused, not ignored.
    res = invoke(["train", "--resume", "--out", str(out), "--batch-size", "3", "--quiet"])
    assert res.exit_code != 0 and "batch_size" in res.output and "saved" in res.output
    res = invoke(["train", "--resume", "--out", str(out), "--epochs", "1", "--quiet"])
    assert res.exit_code == 0, res.output  # the same value as saved is fine
    res = invoke(
        ["train", "--features", str(random_store), "--set", "model.variant=nope", "--out", str(tmp_path / "bad")]
    )
    assert res.exit_code != 0 and "xpool" in res.output and "Traceback" not in res.output


def test_resume_of_a_folder_that_holds_no_run_is_one_line(tmp_path: Path) -> None:
    for out in (tmp_path / "missing", tmp_path):
        res = invoke(["train", "--resume", "--out", str(out), "--quiet"])
        assert res.exit_code != 0 and "not a run folder (no config.json)" in res.output, res.output
        assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("how", ["copy", "move"])
def test_a_copied_or_moved_run_resumes_where_out_points(
    random_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    import shutil

    original = tmp_path / "original"
    interrupted_run(random_store, original, monkeypatch)
    target = tmp_path / how
    (shutil.copytree if how == "copy" else shutil.move)(original, target)
    before = _snapshot(original) if how == "copy" else {}
    res = invoke(["train", "--resume", "--out", str(target), "--quiet"])
    assert res.exit_code == 0, res.output
    assert json.loads((target / "status.json").read_text())["state"] == "complete"
    assert (target / "costs_test.h5").exists()
    if how == "copy":  # the original is untouched, byte for byte
        assert _snapshot(original) == before
    else:
        assert not original.exists()


def test_resuming_a_complete_run_changes_nothing(random_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "done"
    run_train(train_config(random_store, out, "model.variant=prob", "epochs=1"))
    before = _snapshot(out)
    res = invoke(["train", "--resume", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "is complete" in " ".join(res.output.split()) and "nothing to resume" in " ".join(res.output.split())
    assert _snapshot(out) == before
    assert json.loads((out / "status.json").read_text())["val"] is not None


def _hold_lock(folder: Path):
    """Another process holding the run folder's writer lock, as a live `dab train` does."""
    import subprocess
    import sys

    code = (
        "import sys, time; from dab_pipeline.runs.run_folder import RunFolder; "
        "lock = RunFolder(sys.argv[1]).writer_lock('dab train --resume'); lock.__enter__(); "
        "print('locked', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_live_run_refuses_a_second_writer_and_a_dead_ones_lock_is_taken_over(
    random_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "live"
    interrupted_run(random_store, out, monkeypatch)
    before = _snapshot(out)
    holder = _hold_lock(out)
    try:
        res = invoke(["train", "--resume", "--out", str(out), "--quiet"])
        text = " ".join(res.output.split())
        assert res.exit_code != 0 and "Traceback" not in res.output, res.output
        assert f"being written by another process (pid {holder.pid}: dab train --resume)" in text, text
        assert {k: v for k, v in _snapshot(out).items() if k != ".lock"} == {
            k: v for k, v in before.items() if k != ".lock"
        }  # nothing written, its status not marked failed
    finally:
        holder.kill()
        holder.wait()
    # the holder died (SIGKILL): its lock went with it, and the run resumes
    res = invoke(["train", "--resume", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "status.json").read_text())["state"] == "complete"


def test_distill_takes_the_lock_too(tmp_path: Path) -> None:
    from dab_pipeline.core.errors import RunLockedError
    from dab_pipeline.stages.distill import DistillConfig, run_distill

    store = make_random_store(tmp_path / "store.h5")
    run_train(train_config(store, tmp_path / "teacher", "model.variant=dab", "model.steps=2", "epochs=1"))
    (tmp_path / "student").mkdir()
    holder = _hold_lock(tmp_path / "student")
    try:
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}"):
            run_distill(DistillConfig(teacher=tmp_path / "teacher", out=tmp_path / "student", epochs=1, batch_size=4))
    finally:
        holder.kill()
        holder.wait()


def test_starting_over_a_live_run_names_its_process(random_store: Path, tmp_path: Path) -> None:
    from dab_pipeline.runs.run_folder import RunFolder

    out = tmp_path / "busy"
    run_train(train_config(random_store, out, "model.variant=prob", "epochs=1"))
    RunFolder(out).write_status(state="running")  # as a live run's folder reads
    holder = _hold_lock(out)
    try:
        with pytest.raises(TrainingError, match=f"being trained by another process \\(pid {holder.pid}"):
            run_train(train_config(random_store, out, "model.variant=prob", "epochs=1"))
    finally:
        holder.kill()
        holder.wait()
    # a "running" folder nobody holds was left by a killed run: --resume is the way on
    with pytest.raises(TrainingError, match="use --resume"):
        run_train(train_config(random_store, out, "model.variant=prob", "epochs=1"))


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_an_incomplete_store_is_refused_with_the_command_that_completes_it(tmp_path: Path, suffix: str) -> None:
    from dab_pipeline.core.errors import StoreError

    store = make_random_store(tmp_path / f"store{suffix}")
    with open_store(store, "a") as st:  # an extraction that stopped: three videos still pending
        st.set_status(np.array([0, 21, 27]), 0)
    out = tmp_path / "run"
    with pytest.raises(StoreError) as err:
        run_train(train_config(store, out, "model.variant=prob", "epochs=1"))
    msg = str(err.value)
    assert "is incomplete: 3 of 30 videos" in msg and "dab train needs a complete store" in msg
    assert f"dab extract --dataset random --out {store}" in msg and len(msg.splitlines()) == 1
    assert not out.exists()  # nothing written
    from dab_pipeline.stages.search import SearchConfig, run_search

    with pytest.raises(StoreError, match="dab search needs a complete store"):
        run_search(SearchConfig(tmp_path / "nowhere", store, ["x"]))


@pytest.mark.parametrize("split", ["train", "test"])
def test_non_finite_features_are_blamed_on_the_store_at_load(tmp_path: Path, split: str) -> None:
    from dab_pipeline.core.errors import StoreError

    store = make_random_store(tmp_path / "store.h5")
    with open_store(store) as st:
        row = int(st.load_split(split).caption_index[1])
    with open_store(store, "a") as st:  # one caption's features broken behind the store's back (its writes refuse NaN)
        st.raw_backend.raw("captions/features")[row] = np.full(st.dim, np.nan, np.float32)
    with pytest.raises(StoreError, match=rf"'{split}' split holds non-finite features .* \(store row {row}\)"):
        run_train(train_config(store, tmp_path / "run", "model.variant=prob", "epochs=1"))
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("amp", ["none", "bf16"])
def test_a_run_on_cuda_trains_and_scores(random_store: Path, tmp_path: Path, amp: str) -> None:
    """The CUDA path of `dab train`: bf16 autocast where the device has it, the engine's scoring on the GPU, the
    test costs equal to scoring the best checkpoint again."""
    from dab_pipeline.runs.load import load_run
    from dab_pipeline.scoring import score_all

    out = tmp_path / f"cuda-{amp}"
    res = run_train(train_config(random_store, out, "model.variant=dab", "epochs=2", "device=cuda", f"amp={amp}"))
    precision = json.loads((out / "precision.json").read_text())
    assert precision["device"]["device"] == "cuda"
    cost = read_costs(res.costs_path).cost
    assert np.isfinite(cost).all()
    with open_store(random_store) as st:
        test = st.load_split("test")
    again = score_all(load_run(out).model, test.text, test.frames, test.frame_mask, device="cuda").cost
    np.testing.assert_allclose(again, cost, rtol=1e-4, atol=1e-4)


def test_a_bare_resume_keeps_every_non_default_value(
    random_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dab train --resume --out RUN` after a run made with non-default values: nothing typed, nothing changed."""
    out = tmp_path / "run"
    args = [
        "train",
        "--features",
        random_store,
        "--variant",
        "dab",
        "--steps",
        "2",
        "--epochs",
        "2",
        "--batch-size",
        "4",
        "--seed",
        "3",
        "--out",
        out,
        "--quiet",
        "--set",
        "lr=2e-3",
        "--set",
        "model.drift_hidden=16",
        "--set",
        "model.time_embed_dim=8",
        "--set",
        "checkpoint_every=1",
    ]
    restore = patch_loss(monkeypatch, interrupt_at(13))  # in the second epoch (40 captions: 10 steps of 4)
    res = invoke(args)
    restore()
    assert res.exit_code == 130, res.output
    res = invoke(["train", "--resume", "--out", out, "--quiet"])
    assert res.exit_code == 0, res.output
    saved = json.loads((out / "config.json").read_text())
    assert (saved["epochs"], saved["batch_size"], saved["seed"], saved["lr"]) == (2, 4, 3, 2e-3)
    assert json.loads((out / "status.json").read_text())["state"] == "complete"
    # a typed option with another value is refused, naming it and only it
    res = invoke(["train", "--resume", "--out", out, "--quiet", "--set", "lr=1e-3"])
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "lr (saved 0.002, given 0.001)" in text and "batch_size" not in text, text


@pytest.mark.parametrize(
    "control,old",
    [
        ("prob-fixvar", ["model.variant=prob", "model.variance=fixed"]),
        ("dab-fixvar", ["model.variant=dab", "model.variance=fixed"]),
        ("dab-const", ["model.variant=dab", "model.drift=constant"]),
    ],
)
def test_a_control_named_as_the_variant_is_todays_combination_of_keys(
    random_store: Path, tmp_path: Path, control: str, old: list[str]
) -> None:
    from dab_pipeline.stages.train import build_train_config

    out = tmp_path / "run"
    today = build_train_config(random_store, out, overrides=[*SMALL_TRAIN, *old])
    assert build_train_config(random_store, out, options={"model.variant": control}, overrides=SMALL_TRAIN) == today
    assert build_train_config(random_store, out, overrides=[*SMALL_TRAIN, f"variant={control}"]) == today
    assert build_train_config(random_store, None, options={"model.variant": control}).out.name.endswith(control)


def test_a_control_run_made_the_old_way_loads_and_resumes_under_its_name(random_store: Path, tmp_path: Path) -> None:
    """`--variant dab --set model.drift=constant` (before the names) and `--variant dab-const` are one run."""
    from dab_pipeline.runs import RunFolder
    from dab_pipeline.stages.train import build_train_config

    out = tmp_path / "old"
    sets = [x for s in SMALL_TRAIN for x in ("--set", s)]
    res = invoke(
        [
            "train",
            "--features",
            random_store,
            "--variant",
            "dab",
            "--set",
            "model.drift=constant",
            "--epochs",
            "1",
            "--out",
            out,
            "--quiet",
            *sets,
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    saved = json.loads((out / "config.json").read_text())["model"]
    assert (saved["variant"], saved["drift"]) == ("dab", "constant")  # the form old runs have
    named = build_train_config(
        random_store, out, options={"model.variant": "dab-const", "epochs": 1}, overrides=SMALL_TRAIN
    )
    assert RunFolder(out).load_config(TrainConfig) == named
    res = invoke(["train", "--resume", "--out", out, "--variant", "dab-const", "--quiet"])
    assert res.exit_code == 0, res.output
    res = invoke(["train", "--resume", "--out", out, "--variant", "dab-fixvar", "--quiet"])  # another control
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "model.variance (saved 'learned', given 'fixed')" in text, text
    res = invoke(["train", "--features", random_store, "--variant", "dab-cosnt", "--out", tmp_path / "bad"])
    assert res.exit_code != 0 and "dab-const" in res.output and "prob-fixvar" in res.output, res.output


@pytest.mark.parametrize("cov", ["lowrank:2", "mixture:2"])
def test_a_lowrank_prob_run_trains_writes_test_costs_and_evaluates(
    random_store: Path, tmp_path: Path, cov: str
) -> None:
    out = tmp_path / "lowrank"
    sets = [x for s in [*SMALL_TRAIN, "epochs=2", f"model.covariance={cov}"] for x in ("--set", s)]
    args = ["train", "--features", str(random_store), "--out", str(out), "--variant", "prob", *sets]
    res = invoke(args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["model"]["covariance"] == cov
    cm = read_costs(out / "costs_test.h5")
    assert cm.cost.shape == (10, 5) and np.isfinite(cm.cost).all()
    head = "factor_head.weight" if cov.startswith("lowrank") else "mixture.offset.weight"
    assert head in "".join(load_checkpoint(out / "checkpoints" / "best.pt")["model"])
    res = invoke(["evaluate", "--run", str(out), "--no-plots"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "R@1" in (out / "report.md").read_text()
    check_covariance_report(out, cov, cm, random_store)


def check_covariance_report(out: Path, cov: str, cm, store: Path) -> None:
    """dab evaluate's covariance block (issue 36's diagnostics): present, in range, equal to the metrics recomputed
    from the run's model on the test split, and in report.md."""
    from dab_pipeline import metrics as M
    from dab_pipeline.runs.load import load_run

    block = json.loads((out / "metrics.json").read_text())["covariance"]
    kind, n = cov.split(":")
    assert (block["kind"], block["split"], block["texts"], block["dim"]) == (kind, "test", 10, 16)
    report = (out / "report.md").read_text()
    assert f"## Text covariance ({cov})" in report
    model = load_run(out).model
    with open_store(store) as st:
        sp = st.load_split("test")
        text, frames = torch.as_tensor(sp.text), torch.as_tensor(sp.frames)
    with torch.no_grad():
        ts = model.encode_text(text)
    if kind == "lowrank":
        assert block["rank"] == int(n) and 0 < block["variance_share"] < 1
        assert block["variance_share"] == pytest.approx(M.lowrank_variance_share(ts.logvar, ts.factor), rel=1e-5)
        logdet = M.text_logdet(ts.logvar.double(), ts.factor.double())
        assert block["logdet"]["mean"] == pytest.approx(logdet.mean(), rel=1e-6)
        assert block["logdet"]["lowrank_part"] > 0 and block["logdet"]["std"] >= 0
        assert "share of the text variance in U U^T" in report
        return
    assert block["components"] == int(n) and block["k"] == 5  # the test split has 5 videos
    assert sum(block["weights"]) == pytest.approx(1.0) and block["weights"] == sorted(block["weights"], reverse=True)
    assert block["ranked_weights"][0] >= 1 / int(n) and 0 <= block["entropy"] <= 1
    assert 0 <= block["mixed_share"] <= 1 and 1 <= block["distinct_mean"] <= int(n)
    # the components of every pair, on the full grid, give the same numbers as evaluate's top-k pairs
    with torch.no_grad():
        grid = model.pair_terms(ts, model.encode_video(frames, torch.as_tensor(sp.frame_mask)), grid=True)
    want = M.mixture_topk_components(grid.component.numpy(), cm.cost, k=5)
    assert (block["mixed_share"], block["distinct_mean"]) == pytest.approx((want["mixed_share"], want["distinct_mean"]))
    assert "queries whose top 5 mix best components" in report


@pytest.mark.parametrize("cov", ["lowrank:2", "mixture:2"])
def test_a_lowrank_dab_run_trains_writes_test_costs_and_evaluates(random_store: Path, tmp_path: Path, cov: str) -> None:
    """dab's bridge moves (mu, logvar) and carries the text's U unchanged (docs/model.md)."""
    out = tmp_path / "lowrank-dab"
    sets = [x for s in [*SMALL_TRAIN, "epochs=2", f"model.covariance={cov}"] for x in ("--set", s)]
    args = ["train", "--features", str(random_store), "--out", str(out), "--variant", "dab", *sets]
    res = invoke(args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    saved = json.loads((out / "config.json").read_text())["model"]
    assert (saved["variant"], saved["covariance"]) == ("dab", cov)
    cm = read_costs(out / "costs_test.h5")
    assert cm.cost.shape == (10, 5) and np.isfinite(cm.cost).all()
    keys = "".join(load_checkpoint(out / "checkpoints" / "best.pt")["model"])
    head = "factor_head.weight" if cov.startswith("lowrank") else "mixture.offset.weight"
    assert head in keys and "bridge.drift" in keys
    res = invoke(["evaluate", "--run", str(out), "--no-plots"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "R@1" in (out / "report.md").read_text()
    check_covariance_report(out, cov, cm, random_store)
