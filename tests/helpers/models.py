"""Tiny models, hand-made run folders and random inputs of the tests (the benchmarks' store factories stay in
dab_pipeline.testing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.runs.config import TrainConfig
from dab_pipeline.runs.run_folder import RunFolder


def hand_made_run(path: Path, store: Path, variant: str = "dab", model_kw: Optional[dict] = None, **train: Any):
    """A run folder as `dab train` leaves it (config.json, checkpoints/best.pt), of a small model whose every
    parameter is moved off its init; returns (path, the model in eval mode). ``model_kw``: ModelConfig fields."""
    import torch

    model_kw = {"steps": 3, "drift_hidden": 24, "time_embed_dim": 8, **(model_kw or {})}
    cfg = TrainConfig(features=store, out=path, model=ModelConfig(embed_dim=32, variant=variant, **model_kw), **train)
    torch.manual_seed(0)
    model = DABModel(cfg.model)
    with torch.no_grad():  # a "trained" model: every parameter off its init
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    run = RunFolder(path)
    run.checkpoint_dir.mkdir(parents=True)
    run.save_config(cfg)
    run.save_checkpoint(RunFolder.BEST, {"model": model.state_dict(), "heads": None, "epoch": 1})
    return path, model.eval()


# --------------------------------------------------------------------------- small models

SMALL_MODEL = {"embed_dim": 16, "steps": 3, "drift_hidden": 24, "time_embed_dim": 8, "dropout": 0.3}


def perturb(model, seed: int = 0, scale: float = 0.1):
    """Move every parameter off its (identity / zero) init by seeded Gaussian noise of ``scale``, so a test sees a
    generic model (a zero-initialised drift would leave the bridge the identity)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return model


def small_model(variant: str = "dab", *, seed: int = 0, scale: float = 0.1, **cfg: Any):
    """A small DABModel of ``variant`` (:data:`SMALL_MODEL` unless ``cfg`` says), built under ``torch.manual_seed(seed)``
    and perturbed by ``scale`` with the stream ``seed + 1`` (0: left at its init)."""
    import torch

    torch.manual_seed(seed)
    model = DABModel(ModelConfig(variant=variant, **{**SMALL_MODEL, **cfg}))
    return perturb(model, seed + 1, scale) if scale else model


def random_inputs(q: int = 11, v: int = 7, frames: int = 5, dim: int = 16, seed: int = 0):
    """CLIP-like inputs: text (q, dim), frames (v, frames, dim), a mask with two short videos, and a random gt (q,)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    text = torch.randn(q, dim, generator=gen) * 2
    feats = torch.randn(v, frames, dim, generator=gen) * 2
    mask = torch.ones(v, frames, dtype=torch.bool)
    mask[2 % v, 3:] = False  # short videos: padded frames
    mask[5 % v, 1:] = False
    gt = torch.randint(0, v, (q,), generator=gen)
    return text, feats, mask, gt


def write_split_costs(run: Path, model, store: Path, split: str) -> None:
    """``run``'s costs_test.h5 as `dab train` writes it (with the text variance), of ``split``'s captions against
    its videos scored by ``model``: a hand-made run's "test" costs from any split of the store."""
    from dab_pipeline.runs.costfile import CostMatrix, write_costs
    from dab_pipeline.scoring import score_all
    from dab_pipeline.store import open_store

    with open_store(store) as st:
        sp = st.load_split(split)
    res = score_all(model, sp.text, sp.frames, sp.frame_mask, gt=sp.caption_video)
    cm = CostMatrix(res.cost, sp.caption_ids, sp.video_ids, sp.caption_video, extras={"text_var": res.text_var})
    write_costs(run / "costs_test.h5", cm)


def calibrated_run(root: Path, gallery: Optional[str] = "all") -> tuple[Path, Path]:
    """(a hand-made dab run calibrated on its 40 validation captions against ``gallery`` (`dab calibrate
    --gallery`), its store of 48 videos (6 test, 2 train, 40 val)), under ``root``."""
    from dab_pipeline.stages.calibrate import CalibrateConfig, run_calibrate

    from .stores import CALIBRATION_CAPTIONS, CALIBRATION_SPLITS, SEARCH_CAPTIONS, text_store

    store = text_store(root / "store.h5", SEARCH_CAPTIONS + CALIBRATION_CAPTIONS, frames=4, splits=CALIBRATION_SPLITS)
    run, _ = hand_made_run(root / "run", store, "dab")
    run_calibrate(CalibrateConfig(run=run, device="cpu", gallery=gallery))
    return run, store
