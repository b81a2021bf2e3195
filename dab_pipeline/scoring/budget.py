"""Work and memory planning: multiply-add counts and the memory budget of a block of pairs."""

from __future__ import annotations

from typing import Optional

import torch

from ..model import ModelConfig, bridge_macs_per_pair_step
from .result import GiB, MiB


def _dims(cfg: ModelConfig, num_frames: int) -> tuple[int, int, int, int, int]:
    """(D, H, R, n_state, L): n_state is 2 for the distribution bridge, 1 for the point bridge."""
    n_state = max(cfg.bridge_states, 1)  # the MAC terms of a variant without a bridge are dropped
    return cfg.embed_dim, cfg.drift_hidden, cfg.num_heads * num_frames, n_state, cfg.drift_layers


def _step_macs(cfg: ModelConfig) -> tuple[int, int]:
    """(state block of the first drift layer, rest of the drift) multiply-adds per pair and step."""
    d, h, _, n, layers = _dims(cfg, 1)
    return n * d * h, (layers - 2) * h * h + h * n * d


def _cov(cfg: ModelConfig) -> tuple[int, int]:
    """(R, K) of a probabilistic model's covariance: U's columns (lowrank:R, else 0) and the text's components (1)."""
    if not cfg.gaussian:
        return 0, 1
    cov = cfg.covariance_spec
    return cov.rank, cov.components


def _g_cols(cfg: ModelConfig) -> int:
    """Columns of the merged basis's heads: [mu | logvar [| U, rank-major]] [+ mu_v's block of the bridge]."""
    if not cfg.gaussian:
        return 0
    return 2 * cfg.embed_dim + _cov(cfg)[0] * cfg.embed_dim + (cfg.drift_hidden if cfg.runs_drift else 0)


def reference_macs(cfg: ModelConfig, num_frames: int) -> dict[str, int]:
    """Multiply-adds :func:`score_all_reference` executes (``model.pair_costs``), by what they depend on.

    ``per_pair`` includes all T' bridge steps.  ``paper_per_pair`` is the paper's count
    (:func:`~dab_pipeline.model.bridge_macs_per_pair_step` x T', the drift on the full
    concatenation plus the time MLP, per pair) plus the pooling and heads.
    """
    d, h, _, n, _ = _dims(cfg, num_frames)
    f = num_frames
    pool = 2 * f * d + 2 * d * d  # logits, weighted values, out_proj, linear_proj
    heads = 3 * d * d if cfg.gaussian else 0  # mu, logvar, W2 v_c
    state, rest = _step_macs(cfg)
    bridge = (n * d * h + cfg.steps * (state + rest)) if cfg.runs_drift else 0
    per_text = d * d + (2 * d * d if cfg.gaussian else 0)
    per_video = 2 * f * d * d + ((4 * f * d * d + 2 * f * f * d + d * d) if cfg.gaussian else 0)
    return {
        "per_text": per_text,
        "per_video": per_video,
        "per_pair": pool + heads + bridge,
        "pooling_heads_per_pair": pool + heads,
        "paper_per_pair": pool + heads + cfg.steps * bridge_macs_per_pair_step(cfg),
    }


def engine_macs(cfg: ModelConfig, num_frames: int) -> dict[str, int]:
    """Multiply-adds the engine executes, by what they depend on (docs/performance.md)."""
    d, h, r, n, _ = _dims(cfg, num_frames)
    f = num_frames
    state, rest = _step_macs(cfg)
    per_pair = f * d  # attention logits
    per_video = 3 * f * d * d + r * d * d  # k, v (+ out_proj folded into U), linear_proj on U's rows
    per_text = d * d  # q_proj
    c_cols = d if cfg.gaussian else (h if cfg.runs_drift else 0)  # token term | point bridge's target
    g_cols = _g_cols(cfg)  # heads [+ U] [+ mu_v's block]
    per_video += r * d * c_cols + r * d * g_cols
    rank = _cov(cfg)[0]
    per_pair += d * rank * (2 * rank + 1)  # lowrank:R: the KL's U^T S^-1 U, A_t U_v and A_t mu_v
    if cfg.gaussian:
        # LayerNorm statistics as quadratic forms in w, then one product with the merged basis
        per_pair += r * r + (r + 1) * (r + 1) + (r + 1) * (r + 3) + (r + 3) * (c_cols + g_cols)
        per_video += r * r * d + 2 * (r + 1) * (r + 1) * d + 2 * (r + 1) * d  # quad1, quad2, quad3
        per_text += 2 * d * d
        per_video += 4 * f * d * d + 2 * f * f * d + d * d  # token branch
    else:
        per_pair += r * 2 * d + (r + 2) * c_cols  # y and (w @ Rm); the point bridge's target
    bridge = 0
    if cfg.runs_drift:
        per_text += n * d * h  # the first step's state block
        # the first step's state is the text Gaussian: its block is per text, not per pair
        bridge = cfg.steps * (state + rest) - state
        if cfg.gaussian:
            bridge += d * h  # sigma_v block of the first layer (mu_v's is in the g basis)
    return {
        "per_text": per_text,
        "per_video": per_video,
        "per_pair": per_pair + bridge,
        "pooling_heads_per_pair": per_pair,
        "bridge_per_pair": bridge,
    }


def pair_bytes(cfg: ModelConfig, num_frames: int, dtype: str = "float32", aligned: bool = False) -> int:
    """Upper estimate of the bytes one pair holds while its sub-block is scored."""
    d, h, r, _, _ = _dims(cfg, num_frames)
    mm = 2 if dtype == "bfloat16" else 4
    n = 4 * (3 * r + 10 * d + 2 * h) + mm * (4 * d + 3 * h)
    rank, k = _cov(cfg)
    n += 4 * (6 * rank * d + (4 * k * d if k > 1 else 0))  # U's columns and the KL's passes; K components' KLs
    if aligned:  # per-video bases gathered per pair
        n += video_bytes(cfg, num_frames, transient=False)
    return n


def video_bytes(cfg: ModelConfig, num_frames: int, transient: bool = True) -> int:
    d, h, r, _, _ = _dims(cfg, num_frames)
    c_cols = d if cfg.gaussian else (h if cfg.runs_drift else 0)  # token term | point bridge's target
    g_cols = _g_cols(cfg)  # heads [+ U] [+ mu_v's block]
    n = num_frames * d + 2 * r * d + (r + 2) * c_cols + (r + 3) * g_cols + d + num_frames
    if cfg.gaussian:  # the quadratic forms and the merged copy of the bases
        n += 3 * (r + 3) ** 2 + (r + 3) * (c_cols + g_cols)
    if transient:  # U, A1, Rm, V1, Hb and the token branch while the bases are built
        n += 6 * r * d + 6 * num_frames * d + num_frames * num_frames
    return 4 * n


def available_ram() -> Optional[int]:
    try:
        import psutil  # type: ignore[import-not-found]

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_memory_budget(device: str | torch.device = "cpu") -> int:
    """Bytes the engine's working set may use on ``device``.

    CUDA: half the free device memory, at most 6 GiB.  CPU: a quarter of the
    available RAM, at most 64 MiB, i.e. ~1,400 pairs per sub-block at the default
    size: the matrix products are at full speed from a few hundred rows on, and the
    elementwise passes between them run from cache only while the block is small
    (measured: 95% of the matmul rate at 1-2K pairs, 67% at 5.4K).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(max(64 * MiB, min(0.5 * free, 6 * GiB)))
    avail = available_ram()
    cap = 64 * MiB
    return int(cap if avail is None else max(16 * MiB, min(0.25 * avail, cap)))
