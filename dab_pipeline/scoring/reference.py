"""ScoreResult, input checks and the plain reference scorer the fast engine is tested against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional
import numpy as np
import torch
from torch import Tensor
from ..core.events import Event, ProgressCallback, null_progress
from ..model import DABModel



SCORE_DTYPES = ("float32", "bfloat16")


_MiB = 1 << 20


_GiB = 1 << 30


@dataclass
class ScoreResult:
    """Costs of every (query, video) pair plus optional ground-truth diagnostics and top-k."""

    cost: np.ndarray  # (Q, V) float32, lower is better (+inf: not scored, shortlist mode)
    text_var: Optional[np.ndarray] = None  # (Q,) mean sigma^2 of the text Gaussian
    bridged_var: Optional[np.ndarray] = None  # (Q,) ... of the bridged text for (q, gt[q])
    video_var: Optional[np.ndarray] = None  # (Q,) ... of the video Gaussian for (q, gt[q])
    topk_indices: Optional[np.ndarray] = None  # (Q, k) int64, each query's best videos, best first
    topk_costs: Optional[np.ndarray] = None  # (Q, k) float32, their costs
    shortlist: Optional[int] = None  # K of shortlist mode (None: every pair scored exactly)
    info: dict = field(default_factory=dict)  # engine plan: dtype, blocks, budget (for benchmarks / logs)


def _as_tensor(x: np.ndarray | Tensor) -> Tensor:
    if isinstance(x, Tensor):
        return x
    a = np.asarray(x)
    # torch warns on (and must not write through) read-only arrays such as memory maps
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def _prepare_inputs(model: DABModel, text, frames, mask, gt, text_chunk: Optional[int],
                    video_chunk: Optional[int]) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """Inputs as float32 / bool / long tensors, checked against the model: text (Q, D), frames (V, F, D), mask (V, F), gt (Q,)."""
    text_t = _as_tensor(text).to(torch.float32)
    frames_t = _as_tensor(frames).to(torch.float32)
    mask_t = _as_tensor(mask).to(torch.bool)
    gt_t = None if gt is None else _as_tensor(gt).to(torch.long)
    _check_inputs(model, text_t, frames_t, mask_t, text_chunk, video_chunk, gt_t)
    return text_t, frames_t, mask_t, gt_t


def _check_inputs(model: DABModel, text: Tensor, frames: Tensor, mask: Tensor,
                  text_chunk: Optional[int], video_chunk: Optional[int], gt: Optional[Tensor]) -> None:
    d = model.cfg.embed_dim
    if text.dim() != 2 or text.shape[1] != d:
        raise ValueError(f"text must be (Q, {d}), got {tuple(text.shape)}")
    if frames.dim() != 3 or frames.shape[2] != d:
        raise ValueError(f"frames must be (V, F, {d}), got {tuple(frames.shape)}")
    if tuple(mask.shape) != tuple(frames.shape[:2]):
        raise ValueError(f"mask must be {tuple(frames.shape[:2])}, got {tuple(mask.shape)}")
    if (text_chunk is not None and text_chunk < 1) or (video_chunk is not None and video_chunk < 1):
        raise ValueError(f"chunk sizes must be positive, got text_chunk={text_chunk}, video_chunk={video_chunk}")
    if gt is not None:
        if tuple(gt.shape) != (text.shape[0],):
            raise ValueError(f"gt must be ({text.shape[0]},), got {tuple(gt.shape)}")
        if len(gt) and (int(gt.min()) < 0 or int(gt.max()) >= frames.shape[0]):
            raise ValueError(f"gt indexes videos 0..{frames.shape[0] - 1}, got values in [{int(gt.min())}, {int(gt.max())}]")


@torch.no_grad()
def score_all_reference(
    model: DABModel,
    text: np.ndarray | Tensor,
    frames: np.ndarray | Tensor,
    mask: np.ndarray | Tensor,
    *,
    text_chunk: int = 128,
    video_chunk: int = 512,
    device: str | torch.device = "cpu",
    progress: ProgressCallback | None = None,
    gt: np.ndarray | Tensor | None = None,
) -> ScoreResult:
    """Score every text against every video.

    text (Q, D), frames (V, F, D), mask (V, F) bool; gt (Q,) optional index of each
    query's ground-truth video, for the per-query variance diagnostics.  The model
    is moved to ``device`` and run in eval mode (its training flag is restored).
    Emits "start" / "advance" (one per block) / "end" events for task "score".
    """
    progress = progress or null_progress
    text_t, frames_t, mask_t, gt_t = _prepare_inputs(model, text, frames, mask, gt, text_chunk, video_chunk)

    was_training = model.training
    model.eval()
    model.to(device)
    try:
        n_q, n_v = text_t.shape[0], frames_t.shape[0]
        cost = np.empty((n_q, n_v), dtype=np.float32)
        n_tc = -(-n_q // text_chunk)
        n_vc = -(-n_v // video_chunk)
        progress(Event("start", task="score", total=n_tc * n_vc))
        # text states are O(Q * D): encode once and reuse them for every video chunk
        ts_chunks = [model.encode_text(text_t[i: i + text_chunk].to(device)) for i in range(0, n_q, text_chunk)]
        for v0 in range(0, n_v, video_chunk):
            vs = model.encode_video(frames_t[v0: v0 + video_chunk].to(device), mask_t[v0: v0 + video_chunk].to(device))
            for ci, ts in enumerate(ts_chunks):
                q0 = ci * text_chunk
                block = model.pair_costs(ts, vs)  # (tq, tv)
                cost[q0: q0 + len(ts), v0: v0 + len(vs)] = block.float().cpu().numpy()
                progress(Event("advance", task="score", n=1))
        result = ScoreResult(cost=cost)
        if gt_t is not None and model.cfg.probabilistic:
            parts: dict[str, list[np.ndarray]] = {"text_var": [], "bridged_var": [], "video_var": []}
            for q0 in range(0, n_q, text_chunk):
                g = gt_t[q0: q0 + text_chunk]
                ts = model.encode_text(text_t[q0: q0 + text_chunk].to(device))
                # only the ground-truth videos of this chunk, paired one-to-one
                vs = model.encode_video(frames_t[g].to(device), mask_t[g].to(device))
                diag = model.pair_diagnostics(ts, vs)
                for name in parts:
                    parts[name].append(getattr(diag, name).float().cpu().numpy())
            for name, chunks in parts.items():
                setattr(result, name, np.concatenate(chunks) if chunks else np.empty(0, np.float32))
        progress(Event("end", task="score"))
        return result
    finally:
        model.train(was_training)
