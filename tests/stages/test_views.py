"""Augmented training views: the seeded transform, the store arrays, extraction and training on them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline.core.overrides import apply_overrides
from dab_pipeline.runs.checkpoint import load_checkpoint
from dab_pipeline.runs.config import TrainConfig
from dab_pipeline.runs.costfile import read_costs
from dab_pipeline.runs.schedule import epoch_views
from dab_pipeline.stages.train import resolve_train_config, run_train
from dab_pipeline.store import open_store
from dab_pipeline.testing import random_store
from dab_pipeline.video.augment import augmented_views, crop_params, view_seed

from ..helpers.runner import extract_args, invoke

SMALL = [
    "model.drift_hidden=16",
    "model.time_embed_dim=8",
    "model.steps=2",
    "batch_size=8",
    "lr=3e-3",
    "model.variant=dab",
    "epochs=3",
    "checkpoint_every=1",
]


def test_crop_params_follow_random_resized_crop_and_are_seeded() -> None:
    seen = set()
    for j in range(200):
        top, left, ch, cw, flip = crop_params(48, 64, torch.Generator().manual_seed(view_seed("vid", j)))
        assert 0 <= top and top + ch <= 48 and 0 <= left and left + cw <= 64
        assert 0.5 * 48 * 64 * 0.98 <= ch * cw <= 48 * 64  # scale (0.5, 1.0), up to rounding
        seen.add(flip)
        again = crop_params(48, 64, torch.Generator().manual_seed(view_seed("vid", j)))
        assert again == (top, left, ch, cw, flip)
    assert seen == {True, False}
    assert view_seed("vid", 0) != view_seed("vid", 1) != view_seed("other", 1)


def test_augmented_views_shape_normalisation_and_determinism() -> None:
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (40, 56, 3), dtype=np.uint8) for _ in range(3)]
    a = augmented_views(frames, "clip7", 2, 32, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    b = augmented_views(frames, "clip7", 2, 32, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    assert a.shape == (2, 3, 3, 32, 32) and torch.equal(a, b)  # the same seeded computation twice: bit-equal
    assert not torch.equal(a[0], a[1])  # two views differ
    assert float(a.min()) >= (0 - 0.5) / 0.25 - 1e-5 and float(a.max()) <= (1 - 0.5) / 0.25 + 1e-5


def _extract(captions: Path, out: Path, *extra: str):
    args = extract_args(captions, "--store-dtype", "float32", "--dtype", "float32", "--quiet", *extra, out=out)
    return invoke(args, catch_exceptions=False)


def test_extract_stores_views_of_training_videos_only(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.h5"
    assert _extract(tiny_folder_dataset, out, "--train-views", "2").exit_code == 0
    with open_store(out) as st:
        assert (
            st.train_views == 2
            and st.manifest["train_views"] == 2
            and "RandomResizedCrop" in st.manifest["train_view_transform"]
        )
        train = st.load_split("train", with_views=True)
        assert train.views.shape == (len(train.video_ids), 2, 12, train.frames.shape[2])
        assert np.isfinite(train.views).all()
        assert not np.allclose(train.views[:, 0], train.frames) and not np.allclose(
            train.views[:, 0], train.views[:, 1]
        )
        test = st.load_split("test")
        assert test.views is None
    again = tmp_path / "again.h5"
    assert _extract(tiny_folder_dataset, again, "--train-views", "2").exit_code == 0
    with open_store(again) as st:
        # seeded, and the same command (same batches, same threads): the same computation, bit-equal on any CPU
        np.testing.assert_array_equal(st.load_split("train", with_views=True).views, train.views)
    res = _extract(tiny_folder_dataset, out, "--train-views", "3")
    assert res.exit_code != 0 and "train_views" in res.output  # resume refuses another view count
    res = _extract(tiny_folder_dataset, out)  # --train-views not typed: the store's 2, not a change (a resume)
    assert res.exit_code == 0 and "0 videos encoded, 6 already done" in res.output, res.output
    plain = tmp_path / "plain.h5"
    assert _extract(tiny_folder_dataset, plain).exit_code == 0
    from dab_pipeline.core.errors import StoreError

    with open_store(plain) as st, pytest.raises(StoreError, match="no augmented views"):
        st.load_split("train", with_views=True)


@pytest.mark.slow
def test_views_at_token_state_level_for_fine_tuning(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "k1.h5"
    assert _extract(tiny_folder_dataset, out, "--train-views", "2", "--trainable-blocks", "1").exit_code == 0
    with open_store(out) as st:
        train = st.load_split("train", with_states=True, with_views=True)
        assert train.view_states.shape == (len(train.video_ids), 2, *train.vision_states.shape[1:])
        assert not np.allclose(train.view_states[:, 0].astype(np.float32), train.vision_states.astype(np.float32))
    res = invoke(
        [
            "train",
            "--features",
            str(out),
            "--trainable-blocks",
            "1",
            "--epochs",
            "1",
            "--batch-size",
            "2",
            "--steps",
            "2",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output


def _view_store(path: Path, views: int = 3) -> Path:
    return random_store(path, train_views=views)


def _cfg(store: Path, out: Path, *sets: str) -> TrainConfig:
    cfg = apply_overrides(TrainConfig(features=store, out=out), [*SMALL, *sets])
    with open_store(store) as st:
        return resolve_train_config(cfg, st.manifest)


def test_epoch_views_one_per_video_seeded() -> None:
    a = epoch_views(50, 3, seed=24, epoch=2)
    assert a.shape == (50,) and int(a.min()) >= 0 and int(a.max()) <= 2
    assert torch.equal(a, epoch_views(50, 3, seed=24, epoch=2))
    assert not torch.equal(a, epoch_views(50, 3, seed=24, epoch=3))
    assert set(a.tolist()) == {0, 1, 2}


@pytest.mark.slow
def test_training_uses_the_views_and_scores_on_the_eval_view(tmp_path: Path, monkeypatch) -> None:
    import dab_pipeline.stages.train as T

    store = _view_store(tmp_path / "s.h5")
    seen: list[torch.Tensor] = []
    real = T.batch_inputs

    def spy(feats, q, heads, device, views=None):
        seen.append(views)
        return real(feats, q, heads, device, views)

    monkeypatch.setattr(T.trainer, "batch_inputs", spy)  # where the trainer looks it up
    with_views = run_train(_cfg(store, tmp_path / "views"))
    assert seen and all(v is not None and v.shape == (20,) for v in seen)
    seen.clear()
    without = run_train(_cfg(store, tmp_path / "eval", "views=false"))
    assert seen and all(v is None for v in seen)
    a = load_checkpoint(tmp_path / "views" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "eval" / "checkpoints" / "last.pt")["model"]
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the views changed what was learned
    # the test costs come from the eval view: scoring best.pt on the stored frames gives them again
    from dab_pipeline.runs.load import load_run
    from dab_pipeline.scoring import score_all

    run = load_run(tmp_path / "views")
    with open_store(store) as st:
        test = st.load_split("test")
    res = score_all(
        run.model, torch.as_tensor(test.text), torch.as_tensor(test.frames), torch.as_tensor(test.frame_mask)
    )
    np.testing.assert_allclose(read_costs(with_views.costs_path).cost, res.cost, rtol=1e-5, atol=1e-5)
    assert without.best_epoch is not None


@pytest.mark.slow
def test_resume_with_views_equals_uninterrupted(tmp_path: Path, monkeypatch) -> None:
    from ..helpers.training import interrupt_at, patch_loss

    store = _view_store(tmp_path / "s.h5")
    run_train(_cfg(store, tmp_path / "a"))
    restore = patch_loss(monkeypatch, interrupt_at(4))
    with pytest.raises(KeyboardInterrupt):
        run_train(_cfg(store, tmp_path / "b"))
    restore()
    run_train(_cfg(store, tmp_path / "b"), resume=True)
    sa = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")["model"]
    sb = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")["model"]
    # a resume replays the uninterrupted run's computation from its saved state: bit-equal on any CPU (promised)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)
    la = [json.loads(x)["train_loss"] for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x)["train_loss"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert la == lb
