"""Stage two: train DAB (or an ablation variant) on a cached feature store.

A run folder holds everything needed to trace and rebuild a result:

    runs/NAME/
      config.json            resolved TrainConfig (as asked: amp / score_dtype may say auto)
      precision.json         amp and score dtype as this machine ran them, and why (its capabilities)
      store_manifest.json    the manifest of the store the run read
      metrics.jsonl          one line per epoch (train loss, validation metrics)
      checkpoints/last.pt    resumable state (model, heads, optimiser, scheduler, RNG, position)
      checkpoints/best.pt    best validation checkpoint (model selection never looks at test)
      costs_test.h5|.zarr    test cost matrix, rankings, per-query variances (read by `dab evaluate`)
      status.json            running / complete, with the final numbers
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ..checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from ..choices import AMP_MODES, COST_FORMATS, EPOCH_MODES, LOGIT_SCALE_GROUPS, SCORE_DTYPES, SELECT_METRICS
from ..config import atomic_write_text, from_dict, save_config, to_dict
from ..errors import ConfigError, StoreError, TrainingError
from ..events import Event, ProgressCallback, null_progress
from ..model import ModelConfig
from ..devices import resolve_device


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides what `dab train` does (paper §4.1 defaults)."""

    features: Path
    out: Path
    model: ModelConfig = field(default_factory=ModelConfig)
    epochs: int = 10
    batch_size: int = 32
    lr: float = 1e-4  # new modules (pooling, probabilistic heads, bridge)
    clip_lr: float = 1e-6  # fine-tuned CLIP blocks, final LayerNorms and projections
    weight_decay: float = 0.02
    warmup_ratio: float = 0.1
    grad_clip: Optional[float] = 1.0
    seed: int = 24
    trainable_blocks: Optional[int] = None  # None: CLIP frozen; K: fine-tune the store's last K blocks
    train_split: str = "train"
    val_split: str = "val"
    test_split: str = "test"
    select_metric: str = "R@1"  # text-to-video metric on the validation split that picks best.pt, or "last"
    text_chunk: int = 128
    video_chunk: int = 512
    device: str = "auto"
    amp: str = "auto"  # auto: bf16 autocast on CUDA, none on CPU; or "bf16" | "none"
    checkpoint_every: int = 0  # steps; 0: at the end of each epoch only
    max_steps_per_epoch: Optional[int] = None  # cut epochs short (smoke runs)
    # "captions": an epoch visits every training caption once (X-Pool, CLIP4Clip);
    # "videos": one caption per training video, drawn anew each epoch (datasets with many
    # captions per video, where a caption epoch would repeat each video many times)
    epoch: str = "captions"
    cost_format: str = "auto"  # auto: same backend as the store (h5 / zarr)
    # precision of the bridge's products when scoring val / test (docs/performance.md):
    # "bfloat16" is several times faster on AMX / AVX512-BF16 CPUs and tensor-core GPUs and
    # runs as float32 (with a warning) elsewhere; "auto" picks it where it is native. float32
    # by default, so a run's metrics do not depend on the machine.
    score_dtype: str = "float32"
    # the cosine variants' logit scale: "new" (trained with the new modules, at lr, with weight
    # decay) or "clip" (X-Pool: CLIP's own parameter, at clip_lr, no weight decay, clamped at 100)
    logit_scale_group: str = "new"
    recipe: Optional[str] = None  # the shipped recipe these values started from (dab train --recipe)
    # a store made with --train-views N: each epoch trains every video on one of its N augmented
    # views, drawn from (seed, epoch); false: on the eval view, as without views. Val and test
    # always use the eval view.
    views: bool = True

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 2:
            raise ConfigError(f"batch_size must be >= 2 (contrastive loss), got {self.batch_size}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.select_metric not in SELECT_METRICS:
            raise ConfigError(f"select_metric must be one of {', '.join(SELECT_METRICS)}, got {self.select_metric!r}")
        if self.amp not in AMP_MODES:
            raise ConfigError(f"amp must be one of {', '.join(AMP_MODES)}, got {self.amp!r}")
        if self.cost_format not in COST_FORMATS:
            raise ConfigError(f"cost_format must be one of {', '.join(COST_FORMATS)}, got {self.cost_format!r}")
        if self.epoch not in EPOCH_MODES:
            raise ConfigError(f"epoch must be one of {', '.join(EPOCH_MODES)}, got {self.epoch!r}")
        if self.logit_scale_group not in LOGIT_SCALE_GROUPS:
            raise ConfigError(f"logit_scale_group must be one of {', '.join(LOGIT_SCALE_GROUPS)}, "
                              f"got {self.logit_scale_group!r}")
        if self.score_dtype not in SCORE_DTYPES:
            raise ConfigError(f"score_dtype must be one of {', '.join(SCORE_DTYPES)}, got {self.score_dtype!r}")


@dataclass
class TrainResult:
    run_dir: Path
    epochs_done: int
    best_epoch: Optional[int]
    best_value: Optional[float]
    val_metrics: Optional[dict]
    test_metrics: Optional[dict]
    costs_path: Optional[Path]


# --------------------------------------------------------------------------- helpers


def resolve_train_config(cfg: TrainConfig, manifest: dict, explicit: set[str] = frozenset()) -> TrainConfig:
    """Fill dataset-dependent defaults once, at the edge, from the store manifest.

    ``explicit`` names the ``model.*`` keys the user set; only unset ones change.
    """
    model = cfg.model
    dim = manifest.get("clip", {}).get("embed_dim") or manifest.get("embed_dim")
    if dim is not None and model.embed_dim != int(dim):
        if "model.embed_dim" in explicit:
            raise ConfigError(f"model.embed_dim={model.embed_dim} but the store's features have D={dim}")
        model = dataclasses.replace(model, embed_dim=int(dim))
    # X-Pool starts its logit scale from CLIP's own (100 for OpenAI's weights); a store
    # records the scale of the CLIP that made it (dab-world: 16.9).
    clip_scale = manifest.get("clip", {}).get("logit_scale")
    if clip_scale and "model.logit_scale_init" not in explicit and not model.probabilistic:
        model = dataclasses.replace(model, logit_scale_init=float(clip_scale))
    # Paper §4.1: dropout 0.3 for MSR-VTT/VATEX, 0.4 for MSVD.
    if manifest.get("dataset") == "msvd" and "model.dropout" not in explicit:
        model = dataclasses.replace(model, dropout=0.4)
    if cfg.trainable_blocks is not None:
        k_store = manifest.get("trainable_blocks")
        if k_store is None:
            raise ConfigError(
                f"--trainable-blocks {cfg.trainable_blocks} needs a store extracted with --trainable-blocks; "
                f"{cfg.features} holds projected features only"
            )
        if int(k_store) != cfg.trainable_blocks:
            raise ConfigError(
                f"--trainable-blocks {cfg.trainable_blocks} does not match the store's {k_store} "
                "(the store keeps the states entering exactly its last K blocks)"
            )
    return dataclasses.replace(cfg, model=model)


LOG_MAX_LOGIT_SCALE = math.log(100.0)


def optimizer_groups(model: torch.nn.Module, heads: Optional[torch.nn.Module], cfg: TrainConfig) -> list[dict]:
    """AdamW parameter groups: the new modules at ``lr``; CLIP's fine-tuned blocks at ``clip_lr``;
    with ``logit_scale_group="clip"`` the cosine variants' logit scale alone at ``clip_lr`` without
    weight decay (named ``logit_scale``: the caller clamps it after each step)."""
    scale = getattr(model, "log_logit_scale", None) if cfg.logit_scale_group == "clip" else None
    new = [p for p in model.parameters() if p.requires_grad and p is not scale]
    groups = [{"params": new, "lr": cfg.lr, "name": "new"}]
    if heads is not None:
        groups.append({"params": list(heads.parameters()), "lr": cfg.clip_lr, "name": "clip"})
    if scale is not None:
        groups.append({"params": [scale], "lr": cfg.clip_lr, "weight_decay": 0.0, "name": "logit_scale"})
    return groups


def _seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def epoch_order(caption_video: np.ndarray, mode: str, seed: int, epoch: int) -> torch.Tensor:
    """The training captions of one epoch, in order; a pure function of (seed, epoch).

    "captions": a permutation of every caption. "videos": one caption per video,
    uniformly at random, the videos in random order (the first caption of each
    video in a random permutation of all captions gives both at once).
    """
    gen = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(len(caption_video), generator=gen)  # (Q,)
    if mode == "captions":
        return perm
    _, first = np.unique(np.asarray(caption_video)[perm.numpy()], return_index=True)
    return perm[np.sort(first)]  # (V,)


def epoch_length(caption_video: np.ndarray, mode: str) -> int:
    return len(caption_video) if mode == "captions" else len(np.unique(np.asarray(caption_video)))


def lr_lambda(total_steps: int, warmup_ratio: float):
    """Linear warm-up over ``warmup_ratio`` of the steps, then cosine decay to zero."""
    warmup = int(round(total_steps * warmup_ratio))

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


class _Features:
    """One split's inputs in RAM, on the training device, frozen or with CLIP states."""

    def __init__(self, split, device: torch.device, with_states: bool) -> None:
        self.split = split
        self.video_ids = split.video_ids
        self.caption_ids = split.caption_ids
        self.caption_video = torch.as_tensor(np.asarray(split.caption_video), dtype=torch.long)  # (Q,)
        self.text = torch.as_tensor(np.asarray(split.text), dtype=torch.float32)  # (Q, D)
        self.frames = torch.as_tensor(np.asarray(split.frames), dtype=torch.float32)  # (V, F, D)
        self.mask = torch.as_tensor(np.asarray(split.frame_mask), dtype=torch.bool)  # (V, F)
        self.with_states = with_states
        if with_states:
            # Kept in the store dtype (float16 token grids are large); cast per batch.
            self.vision_states = torch.as_tensor(np.asarray(split.vision_states))  # (V, F, [L,] W)
        self.views = self.view_states = None  # augmented training views (train split of a --train-views store)
        if getattr(split, "views", None) is not None:
            self.views = torch.as_tensor(np.asarray(split.views), dtype=torch.float32)  # (V, N, F, D)
            if with_states:
                self.view_states = torch.as_tensor(np.asarray(split.view_states))  # (V, N, F, [L,] W)
        self.device = device

    @property
    def num_views(self) -> int:
        return 0 if self.views is None else int(self.views.shape[1])

    @property
    def num_queries(self) -> int:
        return int(self.text.shape[0])

    @property
    def num_videos(self) -> int:
        return int(self.frames.shape[0])


class _Heads(torch.nn.Module):
    """The fine-tuned tails of both CLIP towers (partial fine-tuning), or nothing."""

    def __init__(self, manifest: dict, k: int, device: torch.device) -> None:
        super().__init__()
        from ..clip_models import TextHead, VisionHead, check_store_weights, load_clip

        bundle = load_clip(manifest["model"], manifest.get("pretrained"), device="cpu", dtype="float32")
        check_store_weights(bundle, manifest, "fine-tuning from the store's token states needs the same weights")
        self.vision = VisionHead.from_bundle(bundle, k)
        self.text = TextHead.from_bundle(bundle, k)

    def encode_text(self, states, lengths) -> torch.Tensor:
        return self.text(states, lengths)

    def encode_frames(self, states: torch.Tensor) -> torch.Tensor:
        B, F = states.shape[:2]
        out = self.vision(states.flatten(0, 1))  # (B*F, D)
        return out.reshape(B, F, -1)  # (B, F, D)


def _text_state_batch(feats: _Features, qidx: torch.Tensor, device: torch.device):
    """CLIP text states of some captions: (B, W) pooled for K=0, or padded (B, T, W) + lengths for K>0."""
    split = feats.split
    rows = qidx.numpy()
    if split.text_offsets is not None:
        states, lengths = split.text_state_batch(rows)  # (B, T, W), (B,)
        return (torch.as_tensor(states, dtype=torch.float32, device=device),
                torch.as_tensor(lengths, dtype=torch.long, device=device))
    states = np.asarray(split.text_states[rows], dtype=np.float32)  # (B, W)
    return torch.as_tensor(states, device=device), None


# --------------------------------------------------------------------------- run folder


def _write_status(run_dir: Path, **data: Any) -> None:
    atomic_write_text(run_dir / "status.json", json.dumps(data, indent=2, default=str) + "\n")


def _read_status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------- distributed step


class _TrainStep(torch.nn.Module):
    """DAB (and the CLIP heads) as one module, so DistributedDataParallel averages the gradients of both.

    forward: this rank's slice of the global batch -> its rows of the global cost
    matrix: its b texts against the B = world * b videos of every rank (DAB pools
    every video per text, so a cost is per pair). The frames are gathered with
    gradients: the rows of rank r depend on rank k's videos, and rank k's heads
    must receive that gradient.
    """

    def __init__(self, model: torch.nn.Module, heads: Optional[_Heads]) -> None:
        super().__init__()
        self.model = model
        self.heads = heads

    def forward(self, text_in: torch.Tensor, lengths: Optional[torch.Tensor], video_in: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        from ..distributed import all_gather_with_grad

        if self.heads is not None:
            text = self.heads.encode_text(text_in, lengths)  # (b, D)
            frames = self.heads.encode_frames(video_in)  # (b, F, D)
        else:
            text, frames = text_in, video_in  # (b, D), (b, F, D)
        frames_all = all_gather_with_grad(frames)  # (B, F, D), rank order = global batch order
        mask_all = all_gather_with_grad(mask)  # (B, F)
        ts = self.model.encode_text(text)
        vs = self.model.encode_video(frames_all, mask_all)
        return self.model.pair_costs(ts, vs)  # (b, B)


def distributed_batch_loss(step: torch.nn.Module, model, text_in: torch.Tensor, lengths: Optional[torch.Tensor],
                           video_in: torch.Tensor, mask: torch.Tensor, loss_fn=None) -> torch.Tensor:
    """The loss of one global batch from this rank's slice; gradients match one process with the whole batch.

    ``step`` is the DistributedDataParallel-wrapped :class:`_TrainStep`. Each
    rank computes its b rows (texts) of the (B, B) cost against all B videos;
    the rows are all-gathered with gradients, so every rank holds the whole
    matrix and evaluates the *whole* loss L (both directions: the video->text
    terms need the columns, which span every rank's rows). Why the gradients
    are exact: rank r's rows C_r enter the loss of all N ranks, so the gather's
    backward sums N identical partials, N * dL/dC_r; back through C_r that is N
    times rank r's share of dL/dtheta, and DDP's average (1/N) sum_r of it is
    sum_r dL/dC_r dC_r/dtheta = dL/dtheta. The same holds for the heads through
    the gathered frames. The temperature / logit scale enter L directly on every
    rank: each rank gets the full dL/dtau and the average keeps it. Every pair
    is computed once (by its text's rank), so per-pair dropout noise is shared by
    both loss directions as in one process, and the per-rank work is b * B pairs
    rather than the 2 * b * B of computing rows and columns separately.
    """
    from ..distributed import all_gather_with_grad
    from ..model import ModelOutput

    if loss_fn is None:
        from ..losses import model_loss as loss_fn
    rows = step(text_in, lengths, video_in, mask)  # (b, B)
    cost = all_gather_with_grad(rows)  # (B, B): row i = text i of the global batch, diagonal = matched pairs
    # model_loss reads only the cost (and the model's temperature); the other outputs are per-pair extras.
    return loss_fn(model, ModelOutput(cost=cost))


def _batch_inputs(feats: _Features, q: torch.Tensor, heads: Optional[_Heads], device: torch.device,
                  views: Optional[torch.Tensor] = None):
    """Inputs of captions ``q`` (b,) and their videos: (text or text states, lengths, frames or states, mask).

    ``views`` (V,) int64: the augmented view each video trains on this epoch (None: the eval view).
    """
    v = feats.caption_video[q]  # (b,)
    mask = feats.mask[v].to(device)  # (b, F)
    if heads is not None:
        st, ln = _text_state_batch(feats, q, device)
        vis = feats.vision_states[v] if views is None else feats.view_states[v, views[v]]  # (b, F, [L,] W)
        return st, ln, vis.to(device, torch.float32), mask
    frames = feats.frames[v] if views is None else feats.views[v, views[v]]  # (b, F, D)
    return feats.text[q].to(device), None, frames.to(device), mask


def epoch_views(num_videos: int, num_views: int, seed: int, epoch: int) -> torch.Tensor:
    """The augmented view (0..N-1) each training video uses in ``epoch``; a pure function of (seed, epoch)."""
    gen = torch.Generator().manual_seed(seed * 1000 + epoch + 500_000_000)  # apart from epoch_order's stream
    return torch.randint(0, num_views, (num_videos,), generator=gen)  # (V,)


# --------------------------------------------------------------------------- scoring a split


def _score_inputs(heads: Optional[_Heads], feats: _Features, device: torch.device, lo: int, hi: int):
    """Texts ``lo:hi`` (Q', D) and all frames (V, F, D) of a split, through the heads when fine-tuning."""
    if heads is None:
        return feats.text[lo:hi], feats.frames
    heads.eval()
    text = []
    for s in range(lo, hi, 256):
        q = torch.arange(s, min(s + 256, hi))
        st, ln = _text_state_batch(feats, q, device)
        text.append(heads.encode_text(st, ln).float().cpu())
    text_t = torch.cat(text) if text else torch.zeros((0, feats.text.shape[1]))  # (Q', D)
    frames = []
    for s in range(0, feats.num_videos, 32):
        frames.append(heads.encode_frames(feats.vision_states[s : s + 32].to(device, torch.float32)).float().cpu())
    return text_t, torch.cat(frames)  # (V, F, D)


def score_split(model, heads: Optional[_Heads], feats: _Features, cfg: TrainConfig, device: torch.device,
                progress: ProgressCallback = null_progress, with_diagnostics: bool = False, dist=None):
    """Cost matrix of every (caption, video) pair of a split (bounded memory).

    ``dist`` (a several-process run): each rank scores a contiguous chunk of the
    queries against every video; the rows are gathered so every rank returns
    the whole matrix (and takes the same model-selection decision). One process
    scores every query (its chunk is the whole split).
    """
    from ..distributed import LocalContext, shard_range
    from ..scoring import ScoreResult, score_all

    ctx = dist if dist is not None else LocalContext(device)
    n_q, world = feats.num_queries, ctx.world_size
    bounds = [shard_range(n_q, r, world) for r in range(world)]
    lo, hi = bounds[ctx.rank]
    counts = [b - a for a, b in bounds]
    model.eval()
    local = None
    with torch.no_grad():
        text_t, frames_t = _score_inputs(heads, feats, device, lo, hi)
        if hi > lo:
            local = score_all(model, text_t, frames_t, feats.mask, text_chunk=cfg.text_chunk,
                              video_chunk=cfg.video_chunk, device=device, dtype=cfg.score_dtype,
                              gt=feats.caption_video[lo:hi] if with_diagnostics else None, progress=progress)
    cost = np.asarray(local.cost, np.float32) if local is not None else np.zeros((0, feats.num_videos), np.float32)
    res = ScoreResult(cost=ctx.gather_rows(cost, counts))  # (Q, V)
    if with_diagnostics and model.cfg.probabilistic:
        for name in ("text_var", "bridged_var", "video_var"):
            part = getattr(local, name, None) if local is not None else None
            part = np.zeros(0, np.float32) if part is None else np.asarray(part, np.float32)
            setattr(res, name, ctx.gather_rows(part, counts))  # (Q,)
    return res


# --------------------------------------------------------------------------- the stage


def run_train(cfg: TrainConfig, progress: ProgressCallback = null_progress, resume: bool = False,
              dist=None) -> TrainResult:
    """Train on ``cfg.features``; write the run folder ``cfg.out``. ``resume`` continues a stopped run.

    A run that stops on an error or Ctrl-C after its folder exists records that in
    status.json ("failed" / "interrupted", with the reason), so `dab evaluate` says
    so, and a rerun of the same command starts over when there is no checkpoint to
    resume from.
    """
    folder: dict[str, bool] = {}
    try:
        return _run_train(cfg, progress, resume, dist, folder)
    except BaseException as exc:
        if folder.get("ready"):
            state = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            _write_status(Path(cfg.out), state=state, error=reason, features=str(cfg.features),
                          resumable=(Path(cfg.out) / "checkpoints" / "last.pt").exists())
        raise


def _resolve_precision(cfg: TrainConfig, device: torch.device, progress: ProgressCallback
                       ) -> tuple[TrainConfig, dict[str, Any]]:
    """``amp`` and ``score_dtype`` as this device runs them, and the record written as precision.json."""
    from ..capabilities import capabilities, resolve_amp, resolve_score_dtype

    amp, score = resolve_amp(cfg.amp, device), resolve_score_dtype(cfg.score_dtype, device)
    for choice in (amp, score):
        if choice.warning:
            progress(Event("warning", message=choice.warning))
    record = {"amp": {"requested": amp.requested, "used": amp.dtype},
              "score_dtype": {"requested": score.requested, "used": score.dtype},
              "device": capabilities(device).as_dict()}
    return dataclasses.replace(cfg, amp=amp.dtype, score_dtype=score.dtype), record


def _run_train(cfg: TrainConfig, progress: ProgressCallback, resume: bool, dist, folder: dict) -> TrainResult:
    """The body of :func:`run_train`; sets ``folder["ready"]`` once this process owns a run folder.

    ``dist`` (a :class:`dab_pipeline.distributed.DistContext` of a torchrun job
    with several processes): DistributedDataParallel training; ``batch_size``
    is the *global* batch, split evenly over the ranks, so a run gives the same
    updates whatever the number of processes (dropout noise aside). Only rank 0
    writes the run folder; every rank reads the store. One process runs the same
    code with a :class:`~dab_pipeline.distributed.LocalContext`.
    """
    from ..distributed import LocalContext

    multi = dist is not None and dist.world_size > 1
    ctx = dist if multi else LocalContext(resolve_device(cfg.device))
    if not ctx.is_main:
        progress = null_progress  # one progress display: rank 0's
    run = _Run(cfg, ctx, progress, resume, multi)
    ctx.run_on_main(run.check_folder)  # the run folder is rank 0's
    asked = cfg  # what config.json records and --resume compares: the request, not this machine's answer
    cfg, precision = _resolve_precision(cfg, ctx.device, progress)
    run.cfg = cfg
    data = run.load_data()
    run.open_folder(asked, precision, data.manifest, folder)
    trainer = _Trainer(run, data)
    trainer.restore()
    trainer.fit()
    test_metrics, costs_path = trainer.test()
    return trainer.finish(test_metrics, costs_path)


@dataclass
class _Data:
    """The splits of one run, on its device, and the store's manifest."""

    train: _Features
    val: Optional[_Features]
    test: Optional[_Features]
    manifest: dict


class _Run:
    """One run's folder, context and reporting: what every step of training shares."""

    def __init__(self, cfg: TrainConfig, ctx, progress: ProgressCallback, resume: bool, multi: bool) -> None:
        self.cfg, self.ctx, self.progress, self.resume, self.multi = cfg, ctx, progress, resume, multi
        self.dir = Path(cfg.out)
        self.ckpt_dir = self.dir / "checkpoints"

    def shared(self, exc: Exception) -> Exception:
        """An error every rank raises at the same point: rank 0 alone reports it."""
        if self.multi:
            from ..distributed import mark_shared

            mark_shared(exc)
        return exc

    def check_folder(self) -> None:
        """Refuse a folder that holds another run; clear one that stopped before its first checkpoint."""
        cfg, run_dir = self.cfg, self.dir
        if self.resume:
            if not (run_dir / "config.json").exists():
                raise TrainingError(f"--resume: {run_dir} is not a run folder (no config.json)")
            saved = from_dict(TrainConfig, json.loads((run_dir / "config.json").read_text()))
            if to_dict(saved) != to_dict(cfg):
                diff = sorted(k for k, v in to_dict(cfg).items() if to_dict(saved).get(k) != v)
                raise TrainingError(f"--resume: {run_dir} was started with another configuration ({', '.join(diff)} differ)")
        elif (run_dir / "config.json").exists():
            status = _read_status(run_dir)
            if status.get("state") in ("failed", "interrupted") and not (self.ckpt_dir / "last.pt").exists():
                # Nothing to resume: the run stopped before its first checkpoint, so start over.
                self.progress(Event("info", message=f"{run_dir}: the earlier run {status['state']} before its first "
                                                    f"checkpoint ({status.get('error', 'no reason recorded')}); "
                                                    "starting over"))
                for name in ("config.json", "status.json", "metrics.jsonl", "store_manifest.json"):
                    (run_dir / name).unlink(missing_ok=True)
                return
            state = status.get("state", "unknown")
            hint = "use --resume to continue it" if state != "complete" else "it is complete"
            raise TrainingError(f"{run_dir} already holds a run (state {state!r}); {hint}, or choose another --out")

    def load_data(self) -> _Data:
        """The train / val / test splits in RAM, checked against the batch size."""
        from ..store import open_store

        cfg, device = self.cfg, self.ctx.device
        with_states = cfg.trainable_blocks is not None
        store = open_store(cfg.features)
        try:
            with_views = cfg.views and store.train_views > 0
            train = _Features(store.load_split(cfg.train_split, with_states=with_states, with_views=with_views),
                              device, with_states)
            val = None
            # no validation split at all (e.g. MSR-VTT with --option val_size=0): select the last epoch
            if cfg.val_split in store.splits():
                val_split = store.load_split(cfg.val_split, with_states=with_states)
                if len(val_split.caption_ids) > 0 and len(val_split.video_ids) > 0:
                    val = _Features(val_split, device, with_states)
            test_split = store.load_split(cfg.test_split, with_states=with_states)
            test = _Features(test_split, device, with_states) if len(test_split.caption_ids) > 0 else None
            manifest = store.manifest
        finally:
            store.close()
        self._check_sizes(train, val)
        return _Data(train, val, test, manifest)

    def _check_sizes(self, train: _Features, val: Optional[_Features]) -> None:
        cfg, world = self.cfg, self.ctx.world_size
        if train.num_queries < 2:
            raise self.shared(StoreError(f"{cfg.features}: the {cfg.train_split!r} split has {train.num_queries} "
                                         "usable captions; need >= 2"))
        if val is None and cfg.select_metric != "last":
            self.progress(Event("warning", message=f"no {cfg.val_split!r} split in the store: best.pt is the last "
                                                   "epoch (--set select_metric=last says so on purpose)"))
        if cfg.batch_size % world:
            raise self.shared(ConfigError(
                f"batch_size {cfg.batch_size} is the global batch and must split evenly over the {world} processes "
                f"(e.g. {max(world, cfg.batch_size // world * world)})"
            ))
        per_epoch = epoch_length(train.caption_video.numpy(), cfg.epoch)
        if per_epoch // cfg.batch_size == 0:
            what = "training captions" if cfg.epoch == "captions" else "training videos (epoch=videos)"
            raise self.shared(ConfigError(
                f"batch_size {cfg.batch_size} exceeds the {per_epoch} {what} of {cfg.features}; "
                f"pass a smaller --batch-size (at most {per_epoch})"))

    def open_folder(self, asked: TrainConfig, precision: dict, manifest: dict, folder: dict) -> None:
        """Rank 0 writes the folder's config, precision and store manifest, and marks the run running."""
        if not self.ctx.is_main:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir.mkdir(exist_ok=True)
        folder["ready"] = True
        atomic_write_text(self.dir / "precision.json", json.dumps(precision, indent=2) + "\n")
        if not self.resume:
            save_config(asked, self.dir / "config.json")
            atomic_write_text(self.dir / "store_manifest.json", json.dumps(manifest, indent=2, default=str) + "\n")
        _write_status(self.dir, state="running", features=str(self.cfg.features))

    def load(self, path: Path):
        """A checkpoint of this run: read by rank 0 and sent to the others, who need no access to the folder."""
        if self.multi:
            return self.ctx.run_on_main(lambda: load_checkpoint(path) if path.exists() else None)
        return load_checkpoint(path, map_location=self.ctx.device) if path.exists() else None


class _Trainer:
    """The model, its optimiser and the position in the run; each step of training a method."""

    def __init__(self, run: _Run, data: _Data) -> None:
        from ..model import DABModel

        self.run, self.data, self.cfg = run, data, run.cfg
        cfg, ctx = self.cfg, run.ctx
        _seed_everything(cfg.seed)
        self.model = DABModel(cfg.model).to(ctx.device)
        self.heads = None
        if cfg.trainable_blocks is not None:
            # Rank 0 first: it fills the CLIP weights cache that the others then read.
            self.heads = ctx.main_first(lambda: _Heads(data.manifest, cfg.trainable_blocks, ctx.device)).to(ctx.device)
        groups = optimizer_groups(self.model, self.heads, cfg)
        self.clamp_scale = next((g["params"][0] for g in groups if g["name"] == "logit_scale"), None)
        self.optim = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        self.steps_per_epoch = epoch_length(data.train.caption_video.numpy(), cfg.epoch) // cfg.batch_size
        if cfg.max_steps_per_epoch:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg.max_steps_per_epoch)
        self.total = self.steps_per_epoch * cfg.epochs
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.optim, lr_lambda(self.total, cfg.warmup_ratio))
        self.start_epoch, self.start_step, self.best_value, self.best_epoch = 0, 0, None, None
        self.resumed_loss: tuple[float, int] = (0.0, 0)  # running loss sum and count of a partly done epoch
        self.val_metrics: Optional[dict] = None
        self.step_module = None
        self.global_step = 0

    def restore(self) -> None:
        """Continue from last.pt (--resume), or seed this rank's own dropout stream; wrap for DDP."""
        run, ctx, cfg = self.run, self.run.ctx, self.cfg
        ck = run.load(run.ckpt_dir / "last.pt") if run.resume else None
        if ck is not None:
            saved_world = int(ck.get("world_size") or 1)
            if saved_world != ctx.world_size:
                raise run.shared(TrainingError(
                    f"--resume: {run.dir} was trained with {saved_world} process(es), this run has "
                    f"{ctx.world_size}; resume it with {saved_world} (the per-process random streams are saved for "
                    "that many)"))
            self._load_state(ck)
            if run.multi:
                set_rng_state(ck["rng_ranks"][ctx.rank], ctx.device)
            else:
                set_rng_state(ck["rng"])
            run.progress(Event("info", message=f"resuming {run.dir} at epoch {self.start_epoch + 1}, "
                                               f"step {self.start_step}"))
        elif ctx.rank > 0:
            # Own dropout noise per rank (identical streams would correlate the masks of the
            # ranks' pairs); rank 0 keeps the single-process stream.
            torch.manual_seed(cfg.seed + 1_000_003 * ctx.rank)
        self.global_step = self.start_epoch * self.steps_per_epoch + self.start_step
        if run.multi:
            from torch.nn.parallel import DistributedDataParallel

            device = ctx.device
            self.step_module = DistributedDataParallel(
                _TrainStep(self.model, self.heads), device_ids=[device.index] if device.type == "cuda" else None)
            run.progress(Event("info", message=f"distributed training: {ctx.world_size} processes, "
                                               f"{cfg.batch_size // ctx.world_size} of each global batch of "
                                               f"{cfg.batch_size} per process"))

    def _load_state(self, ck: dict) -> None:
        self.model.load_state_dict(ck["model"])
        if self.heads is not None:
            self.heads.load_state_dict(ck["heads"])
        self.optim.load_state_dict(ck["optim"])
        self.sched.load_state_dict(ck["sched"])
        self.start_epoch, self.start_step = ck["epoch"], ck["step_in_epoch"]
        self.best_value, self.best_epoch = ck.get("best_value"), ck.get("best_epoch")
        self.resumed_loss = tuple(ck.get("epoch_loss", (0.0, 0)))

    def checkpoint(self, epoch: int, step_in_epoch: int, path: Path, epoch_loss: tuple[float, int] = (0.0, 0)) -> None:
        """Every rank's random streams (for an exact resume), saved by rank 0 with the training state."""
        run, ctx = self.run, self.run.ctx
        rngs = ctx.all_gather_object(rng_state(ctx.device)) if run.multi else None
        if not ctx.is_main:
            return
        state = {
            "model": self.model.state_dict(), "heads": self.heads.state_dict() if self.heads is not None else None,
            "optim": self.optim.state_dict(), "sched": self.sched.state_dict(), "epoch": epoch,
            "step_in_epoch": step_in_epoch, "best_value": self.best_value, "best_epoch": self.best_epoch,
            "rng": rngs[0] if rngs else rng_state(), "config": to_dict(self.cfg), "epoch_loss": epoch_loss,
            "world_size": ctx.world_size,
        }
        if rngs:
            state["rng_ranks"] = rngs
        save_checkpoint(path, state)

    def fit(self) -> None:
        """Every remaining epoch: train, validate, checkpoint."""
        self.run.progress(Event("start", task="train", total=self.total - self.global_step))
        for epoch in range(self.start_epoch, self.cfg.epochs):
            t0 = time.time()
            loss = self.train_epoch(epoch)
            self.end_epoch(epoch, loss, time.time() - t0)
        self.run.progress(Event("end", task="train", message=f"best epoch {self.best_epoch}"))

    def train_epoch(self, epoch: int) -> tuple[float, int]:
        """One epoch's steps (from where a resumed run stopped); returns (loss sum, steps)."""
        cfg, train = self.cfg, self.data.train
        # The order of an epoch depends only on (seed, epoch): resuming mid-run replays it
        # exactly, and every rank of a distributed run draws the same order.
        order = epoch_order(train.caption_video.numpy(), cfg.epoch, cfg.seed, epoch)
        views = epoch_views(train.num_videos, train.num_views, cfg.seed, epoch) if train.num_views else None
        first = self.start_step if epoch == self.start_epoch else 0
        self.model.train()
        if self.heads is not None:
            self.heads.train()
        loss_sum, n = self.resumed_loss if (epoch == self.start_epoch and first > 0) else (0.0, 0)
        for step in range(first, self.steps_per_epoch):
            q = order[step * cfg.batch_size: (step + 1) * cfg.batch_size]  # (B,) caption indices
            loss = self.step(q, views, epoch, step)
            loss_sum += float(loss.item())
            n += 1
            self.run.progress(Event("advance", task="train", n=1, data={"unit": "it"},
                                    message=f"epoch {epoch + 1}/{cfg.epochs} loss {loss_sum / n:.4f}"))
            if cfg.checkpoint_every and self.global_step % cfg.checkpoint_every == 0 and step + 1 < self.steps_per_epoch:
                self.checkpoint(epoch, step + 1, self.run.ckpt_dir / "last.pt", (loss_sum, n))
        return loss_sum, n

    def batch_loss(self, q: torch.Tensor, views: Optional[torch.Tensor]) -> torch.Tensor:
        """The loss of the global batch ``q``: this rank's slice against every video of it."""
        from ..losses import model_loss

        ctx, train, device = self.run.ctx, self.data.train, self.run.ctx.device
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=self.cfg.amp == "bf16"):
            if self.run.multi:
                local_b = self.cfg.batch_size // ctx.world_size
                q_local = q[ctx.rank * local_b: (ctx.rank + 1) * local_b]  # (b,) this rank's slice
                text_in, lengths, video_in, mask = _batch_inputs(train, q_local, self.heads, device, views)
                return distributed_batch_loss(self.step_module, self.model, text_in, lengths, video_in, mask,
                                              model_loss)
            text_in, lengths, video_in, mask = _batch_inputs(train, q, self.heads, device, views)
            text = self.heads.encode_text(text_in, lengths) if self.heads is not None else text_in
            frames = self.heads.encode_frames(video_in) if self.heads is not None else video_in
            return model_loss(self.model, self.model(text, frames, mask))

    def step(self, q: torch.Tensor, views: Optional[torch.Tensor], epoch: int, step: int) -> torch.Tensor:
        """One optimiser step on batch ``q``; a non-finite loss stops the run (every rank alike)."""
        run, cfg = self.run, self.cfg
        loss = self.batch_loss(q, views)
        if not torch.isfinite(loss):
            # Every rank holds the same (gathered) loss, so all stop here together.
            if run.ctx.is_main:
                _write_status(run.dir, state="failed", error=f"non-finite loss at epoch {epoch + 1} step {step + 1}")
            raise run.shared(TrainingError(
                f"loss became {loss.item()} at epoch {epoch + 1}, step {step + 1} (global step "
                f"{self.global_step + 1}); the last good checkpoint is {run.ckpt_dir / 'last.pt'}. "
                "Try a lower --set lr=..."))
        self.optim.zero_grad(set_to_none=True)
        loss.backward()  # distributed: DDP has averaged the gradients across ranks when this returns
        if cfg.grad_clip:
            params = [p for g in self.optim.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        self.optim.step()
        if self.clamp_scale is not None:
            with torch.no_grad():
                self.clamp_scale.clamp_(max=LOG_MAX_LOGIT_SCALE)  # CLIP's and X-Pool's cap of 100
        self.sched.step()
        self.global_step += 1
        return loss

    def end_epoch(self, epoch: int, loss: tuple[float, int], seconds: float) -> None:
        """Validate, select (never on test), log the epoch and write last.pt / best.pt."""
        from ..metrics import t2v_metrics

        run, cfg, val = self.run, self.cfg, self.data.val
        record: dict[str, Any] = {"epoch": epoch + 1, "step": self.global_step,
                                  "train_loss": loss[0] / max(1, loss[1]), "lr": self.sched.get_last_lr()[0],
                                  "epoch_seconds": round(seconds, 3)}
        improved = True
        if val is not None:
            res = score_split(self.model, self.heads, val, cfg, run.ctx.device, dist=run.ctx if run.multi else None)
            self.val_metrics = t2v_metrics(res.cost, val.caption_video.numpy())
            record["val"] = self.val_metrics
        if val is not None and cfg.select_metric != "last":
            value = float(self.val_metrics[cfg.select_metric])
            higher_better = cfg.select_metric not in ("MnR", "MdR")
            improved = self.best_value is None or (value > self.best_value if higher_better else value < self.best_value)
            if improved:
                self.best_value, self.best_epoch = value, epoch + 1
        else:
            self.best_epoch = epoch + 1
        if run.ctx.is_main:
            with open(run.dir / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
        self.checkpoint(epoch + 1, 0, run.ckpt_dir / "last.pt")
        if improved:
            self.checkpoint(epoch + 1, 0, run.ckpt_dir / "best.pt")
        msg = f"epoch {epoch + 1}: loss {record['train_loss']:.4f}"
        if self.val_metrics is not None:
            m = self.val_metrics
            msg += f"  val R@1 {m['R@1']:.1f} R@5 {m['R@5']:.1f} MnR {m['MnR']:.1f}"
        run.progress(Event("metrics", message=msg, data=record))

    def test(self) -> tuple[Optional[dict], Optional[Path]]:
        """Score the test split with best.pt and write the cost file; (t2v metrics, its path) or Nones."""
        from ..costfile import CostMatrix, write_costs
        from ..metrics import t2v_metrics

        run, cfg, test = self.run, self.cfg, self.data.test
        if test is None:
            return None, None
        best = run.load(run.ckpt_dir / "best.pt")
        self.model.load_state_dict(best["model"])
        if self.heads is not None:
            self.heads.load_state_dict(best["heads"])
        res = score_split(self.model, self.heads, test, cfg, run.ctx.device, progress=run.progress,
                          with_diagnostics=True, dist=run.ctx if run.multi else None)
        gt = test.caption_video.numpy()
        extras = {k: np.asarray(getattr(res, k)) for k in ("text_var", "bridged_var", "video_var")
                  if getattr(res, k, None) is not None}
        fmt = cfg.cost_format
        if fmt == "auto":
            fmt = "zarr" if str(cfg.features).rstrip("/").endswith(".zarr") else "h5"
        costs_path = run.dir / f"costs_{cfg.test_split}.{fmt}"
        if run.ctx.is_main:
            write_costs(costs_path, CostMatrix(
                cost=np.asarray(res.cost, dtype=np.float32),
                query_ids=np.asarray(test.caption_ids), video_ids=np.asarray(test.video_ids), gt=gt.astype(np.int64),
                kind="cost", extras=extras,
                attrs={"config": json.dumps(to_dict(cfg)), "split": cfg.test_split, "best_epoch": self.best_epoch,
                       "variant": cfg.model.variant, "store": str(cfg.features)},
            ))
        return t2v_metrics(res.cost, gt), costs_path

    def finish(self, test_metrics: Optional[dict], costs_path: Optional[Path]) -> TrainResult:
        """Mark the run complete; nobody leaves before rank 0 has written everything."""
        run, cfg = self.run, self.cfg
        if run.ctx.is_main:
            _write_status(run.dir, state="complete", epochs=cfg.epochs, best_epoch=self.best_epoch,
                          best_value=self.best_value, select_metric=cfg.select_metric, val=self.val_metrics,
                          test_t2v=test_metrics, costs=str(costs_path) if costs_path else None)
        run.ctx.barrier()
        return TrainResult(run_dir=run.dir, epochs_done=cfg.epochs, best_epoch=self.best_epoch,
                           best_value=self.best_value, val_metrics=self.val_metrics, test_metrics=test_metrics,
                           costs_path=costs_path)
