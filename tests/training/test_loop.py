"""The shared training loop on a toy task: selection, a non-finite loss, an exact resume within an epoch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch

from dab_pipeline.core.errors import TrainingError
from dab_pipeline.runs.checkpoint import load_checkpoint
from dab_pipeline.runs.run_folder import RunFolder
from dab_pipeline.runtime.distributed import LocalContext
from dab_pipeline.training import Loop, LoopSettings

CAPTIONS = np.repeat(np.arange(12), 2)  # (24,) each caption's video


class Toy:
    """A linear map fitted to fixed targets; the validation metrics replay ``val`` epoch by epoch."""

    def __init__(self, val: Optional[list[dict]] = None, nan_at: int = -1) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.x, self.y = torch.randn(24, 4), torch.randn(24, 1)
        self.val, self.nan_at, self.calls, self.epoch = val, nan_at, 0, 0

    def modules(self) -> dict[str, Optional[torch.nn.Module]]:
        return {"model": self.model, "heads": None}

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.model.train()

    def loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        self.calls += 1
        err = self.model(self.x[batch] + 0.01 * torch.randn(len(batch), 4)) - self.y[batch]  # noise: the RNG matters
        loss = (err**2).mean() * (float("nan") if self.calls == self.nan_at else 1.0)
        return loss, {"abs": float(err.abs().mean().detach())}

    def after_update(self) -> None:
        pass

    def validate(self) -> Optional[dict]:
        return None if self.val is None else self.val[self.epoch]

    def record(self, epoch: int, means: dict[str, float], update: int, lr: float, seconds: float) -> dict[str, Any]:
        return {"epoch": epoch + 1, "update": update, "means": means}


def make_loop(task: Toy, out: Path, events: list, **settings: Any) -> Loop:
    folder = RunFolder(out)
    folder.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    optim = torch.optim.AdamW(task.model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda u: 1.0 / (1 + u))
    base = dict(task="toy", epochs=3, updates_per_epoch=6, batch_size=4, seed=1, epoch_mode="captions")
    s = LoopSettings(**{**base, **settings})
    return Loop(task, optim, sched, s, CAPTIONS, folder, LocalContext(torch.device("cpu")), events.append)


def test_lower_is_better_for_ranks_and_higher_for_recalls(tmp_path: Path) -> None:
    vals = [
        {"R@1": 10.0, "R@5": 1, "MnR": 5.0},
        {"R@1": 30.0, "R@5": 1, "MnR": 9.0},
        {"R@1": 20.0, "R@5": 1, "MnR": 2.0},
    ]
    for metric, best in (("R@1", 2), ("MnR", 3), ("last", 3)):
        loop = make_loop(Toy(vals), tmp_path / metric, [], select_metric=metric)
        loop.restore(None)
        loop.fit()
        assert loop.at.best_epoch == best, metric
        assert load_checkpoint(tmp_path / metric / "checkpoints" / "best.pt")["best_epoch"] == best
    lines = [json.loads(x) for x in (tmp_path / "R@1" / "metrics.jsonl").read_text().splitlines()]
    # each epoch's record: the task's fields, its loss parts averaged over the epoch's updates, the validation
    assert [r["update"] for r in lines] == [6, 12, 18] and set(lines[0]["means"]) == {"loss", "abs"}
    assert lines[1]["val"] == vals[1]


def test_a_non_finite_loss_stops_the_run_and_says_where(tmp_path: Path) -> None:
    events: list = []
    loop = make_loop(Toy(nan_at=8), tmp_path, events)
    loop.restore(None)
    with pytest.raises(TrainingError, match=r"at epoch 2, update 2 \(update 8 of the run\)"):
        loop.fit()
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "failed" and "non-finite" in status["error"]


def test_a_resume_within_an_epoch_replays_the_uninterrupted_run(tmp_path: Path) -> None:
    whole = make_loop(Toy(), tmp_path / "a", [], checkpoint_every=4)
    whole.restore(None)
    whole.fit()
    broken = make_loop(Toy(nan_at=11), tmp_path / "b", [], checkpoint_every=4)  # stops at update 11: last.pt at 8
    broken.restore(None)
    with pytest.raises(TrainingError):
        broken.fit()
    ck = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    assert (ck["epoch"], ck["step_in_epoch"]) == (1, 2) and ck["epoch_loss"][1] == 2
    events: list = []
    again = make_loop(Toy(), tmp_path / "b", events, checkpoint_every=4)
    torch.manual_seed(123)  # whatever the process's streams are now: the checkpoint's are restored
    again.restore(ck)
    again.fit()
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0)
    la = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    lb = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert la[1:] == lb[-2:]  # the resumed epoch's mean loss counts the updates before the stop too
    assert events[0].message.startswith(f"resuming {tmp_path / 'b'} at epoch 2, update 2")
