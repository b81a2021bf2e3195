"""Small training runs for the stage tests: a config, and a run stopped part-way by a patched loss."""

from __future__ import annotations

from pathlib import Path

import pytest

from dab_pipeline.core.overrides import apply_overrides
from dab_pipeline.runs.config import TrainConfig
from dab_pipeline.stages.train import resolve_train_config, run_train
from dab_pipeline.store import open_store

# the --set values that keep a run on a random store to a second or two
SMALL_TRAIN = ["model.drift_hidden=16", "model.time_embed_dim=8", "model.steps=2", "batch_size=8", "lr=3e-3"]


def train_config(store: Path, out: Path, *sets: str) -> TrainConfig:
    """A resolved TrainConfig of :data:`SMALL_TRAIN` on ``store``, then ``sets`` (``key=value`` overrides)."""
    cfg = apply_overrides(TrainConfig(features=store, out=out), [*SMALL_TRAIN, *sets])
    with open_store(store) as st:
        return resolve_train_config(cfg, st.manifest)


def patch_loss(monkeypatch: pytest.MonkeyPatch, wrap):
    """Wrap the trainer's loss: ``wrap(n, compute)`` at the n-th step (from 1), ``compute()`` the real loss.
    Returns the function that takes the patch off."""
    import dab_pipeline.stages.train.trainer as loop

    real, calls = loop.loss_of, {"n": 0}

    def loss_of(spec):
        base = real(spec)

        def loss(cost, temperature):
            calls["n"] += 1
            return wrap(calls["n"], lambda: base(cost, temperature))

        return loss

    monkeypatch.setattr(loop, "loss_of", loss_of)
    return lambda: monkeypatch.setattr(loop, "loss_of", real)


def interrupt_at(n: int):
    """A ``wrap`` for :func:`patch_loss` that raises KeyboardInterrupt (Ctrl-C) at step ``n``."""

    def wrap(step: int, compute):
        if step == n:
            raise KeyboardInterrupt
        return compute()

    return wrap


def interrupted_run(store: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A dab run stopped (Ctrl-C) in its second epoch, with a checkpoint to resume from; returns its options."""
    sets = ["model.variant=dab", "epochs=2", "checkpoint_every=1"]
    restore = patch_loss(monkeypatch, interrupt_at(3))
    with pytest.raises(KeyboardInterrupt):
        run_train(train_config(store, out, *sets))
    restore()
    return sets
