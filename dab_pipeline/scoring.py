"""All-pairs scoring of a split in bounded memory: the plain reference and the fast engine.

The per-pair work of DAB (text-conditioned pooling, video Gaussian, bridge) cannot
be factored into one embedding per side, so every (text, video) pair runs through
the model.  Two implementations share one result type:

* :func:`score_all_reference` calls the model block by block: texts in chunks of
  ``text_chunk`` and videos in chunks of ``video_chunk`` (the paper's 128 / 512),
  so the largest per-pair tensor is ``(text_chunk, video_chunk, D)`` whatever the
  split size.  It is the correctness reference; the engine must match it.
* :func:`score_all` is the engine used by validation, ``dab train``'s final cost
  matrices and ``dab search``.  It computes the same function with the algebra
  taken out of the per-pair loop (docs/performance.md derives it):

  - per text, once: the pooling query, the text Gaussian, and the bridge's first
    step (its state is still the text Gaussian, so its projection is per text);
  - per video, once: keys, the value and output projections folded into one set
    of per-frame vectors, everything linear behind the pooling (``linear_proj``,
    the probabilistic heads, the token term ``W2 v_c``, the bridge's mu_v block)
    pushed through the LayerNorms onto per-frame bases, and the token branch;
  - per pair: attention weights, a few small batched products against those
    bases, the per-pair LayerNorm statistics, the sigma_v block of the bridge's
    first layer, then T' steps of large matrix products and the cost.

  Sub-blocks are sized from a memory budget, never a ``(Q, V, D)`` tensor for the
  split; ``dtype="bfloat16"`` runs the bridge's matrix products in bf16 (float32
  accumulation, float32 states and cost); ``topk`` returns each query's ranked
  best videos; ``shortlist=K`` scores only each query's top-K candidates of a cheap
  cosine stage (the others get ``+inf``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .cpu_kernels import Kernels, get_kernels
from .devices import resolve_device
from .events import Event, ProgressCallback, null_progress
from .model import DABModel, ModelConfig, masked_softmax

__all__ = [
    "ScoreResult",
    "score_all",
    "score_all_reference",
    "default_memory_budget",
    "pair_bytes",
    "engine_macs",
    "reference_macs",
    "topk_smallest",
    "SCORE_DTYPES",
]

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


# =========================================================================== the engine
#
# Notation (docs/performance.md has the full derivation).  D embed_dim, H drift
# hidden width, Hh pooling heads, F frames, R = Hh * F attention weights per pair,
# C(x) = x - mean(x) the centring that every LayerNorm starts with.
#
# Pooling of text i over video j, with w (R,) its attention weights:
#   y   = out_proj(sum_f w_f v_f)                     = w @ U              U: (R, D) per video
#   a   = LN_attn(y)   = g1 * C(y) * rs1 + b1          rs1 = 1/sqrt(var(y) + eps)
#   o   = a + linear_proj(a)                          = (w @ Rm) * rs1 + r0    Rm = A1 + A1 Wl^T, A1 = g1 * C(U)
#   v_c = LN_out(o)    = (w @ V1) * rs1 rs2 + v_a rs2 + v_b                     V1 = g2 * C(Rm)
#   h   = LN_p(v_c / |v_c|) = (w @ Hb) * rs1 rs2 g + h_a rs2 g + h_b g + h_c    Hb = gp * C(V1), g = rsp / |v_c|
# so every linear map applied to v_c or h (the mu/logvar heads, the token term W2 v_c,
# the bridge's mu_v block and the point bridge's target block) becomes a per-video
# basis (R + 2 or R + 3 rows) that a pair combines with R + 3 coefficients.  The
# per-pair scalars rs1, rs2, |v_c|, rsp come from the explicit y, o, v_c, which cost
# O(R D) a pair.  What is left per pair is the attention, those small products, the
# sigma_v block of the bridge's first layer and the bridge steps themselves.


_BIAS_PAD = 16  # columns after H in the hidden buffers: a 1 (bias input) and zeros


def _center(x: Tensor) -> Tensor:
    return x - x.mean(dim=-1, keepdim=True)


def _linears(seq: torch.nn.Sequential) -> list[torch.nn.Linear]:
    return [m for m in seq if isinstance(m, torch.nn.Linear)]


def _dims(cfg: ModelConfig, num_frames: int) -> tuple[int, int, int, int, int]:
    """(D, H, R, n_state, L): n_state is 2 for the distribution bridge, 1 for the point bridge."""
    n_state = 2 if cfg.variant == "dab" else 1
    return cfg.embed_dim, cfg.drift_hidden, cfg.num_heads * num_frames, n_state, cfg.drift_layers


def _step_macs(cfg: ModelConfig) -> tuple[int, int]:
    """(state block of the first drift layer, rest of the drift) multiply-adds per pair and step."""
    d, h, _, n, layers = _dims(cfg, 1)
    return n * d * h, (layers - 2) * h * h + h * n * d


def reference_macs(cfg: ModelConfig, num_frames: int) -> dict[str, int]:
    """Multiply-adds :func:`score_all_reference` executes (``model.pair_costs``), by what they depend on.

    ``per_pair`` includes all T' bridge steps.  ``paper_per_pair`` is the paper's count
    (:func:`~dab_pipeline.model.bridge_macs_per_pair_step` x T', the drift on the full
    concatenation plus the time MLP, per pair) plus the pooling and heads.
    """
    from .model import bridge_macs_per_pair_step

    d, h, _, n, _ = _dims(cfg, num_frames)
    f = num_frames
    pool = 2 * f * d + 2 * d * d  # logits, weighted values, out_proj, linear_proj
    heads = 3 * d * d if cfg.probabilistic else 0  # mu, logvar, W2 v_c
    state, rest = _step_macs(cfg)
    bridge = (n * d * h + cfg.steps * (state + rest)) if cfg.uses_bridge else 0
    per_text = d * d + (2 * d * d if cfg.probabilistic else 0)
    per_video = 2 * f * d * d + ((4 * f * d * d + 2 * f * f * d + d * d) if cfg.probabilistic else 0)
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
    c_cols = d if cfg.probabilistic else (h if cfg.variant == "bridge" else 0)
    g_cols = (2 * d + (h if cfg.variant == "dab" else 0)) if cfg.probabilistic else 0
    per_video += r * d * c_cols + r * d * g_cols
    if cfg.probabilistic:
        # LayerNorm statistics as quadratic forms in w, then one product with the merged basis
        per_pair += r * r + (r + 1) * (r + 1) + (r + 1) * (r + 3) + (r + 3) * (c_cols + g_cols)
        per_video += r * r * d + 2 * (r + 1) * (r + 1) * d + 2 * (r + 1) * d  # quad1, quad2, quad3
        per_text += 2 * d * d
        per_video += 4 * f * d * d + 2 * f * f * d + d * d  # token branch
    else:
        per_pair += r * 2 * d + (r + 2) * c_cols  # y and (w @ Rm); the point bridge's target
    bridge = 0
    if cfg.uses_bridge:
        per_text += n * d * h  # the first step's state block
        # the first step's state is the text Gaussian: its block is per text, not per pair
        bridge = cfg.steps * (state + rest) - state
        if cfg.variant == "dab":
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
    if aligned:  # per-video bases gathered per pair
        n += _video_bytes(cfg, num_frames, transient=False)
    return n


def _video_bytes(cfg: ModelConfig, num_frames: int, transient: bool = True) -> int:
    d, h, r, _, _ = _dims(cfg, num_frames)
    c_cols = d if cfg.probabilistic else (h if cfg.variant == "bridge" else 0)
    g_cols = (2 * d + (h if cfg.variant == "dab" else 0)) if cfg.probabilistic else 0
    n = num_frames * d + 2 * r * d + (r + 2) * c_cols + (r + 3) * g_cols + d + num_frames
    if cfg.probabilistic:  # the quadratic forms and the merged copy of the bases
        n += 3 * (r + 3) ** 2 + (r + 3) * (c_cols + g_cols)
    if transient:  # U, A1, Rm, V1, Hb and the token branch while the bases are built
        n += 6 * r * d + 6 * num_frames * d + num_frames * num_frames
    return 4 * n


def _available_ram() -> Optional[int]:
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
        return int(max(64 * _MiB, min(0.5 * free, 6 * _GiB)))
    avail = _available_ram()
    cap = 64 * _MiB
    return int(cap if avail is None else max(16 * _MiB, min(0.25 * avail, cap)))


@dataclass
class _Texts:
    """Per-text state of the engine (rows of Q)."""

    q: Tensor  # (Q, Hh, Dh) pooling queries, already scaled by 1/sqrt(Dh)
    unit: Optional[Tensor] = None  # (Q, D) t / |t| (xpool cost)
    mu: Optional[Tensor] = None  # (Q, D) text Gaussian (prob/dab)
    logvar: Optional[Tensor] = None  # (Q, D)
    first: Optional[Tensor] = None  # (Q, H) first bridge step: state block + time feature + bias

    def take(self, idx: slice | Tensor | tuple) -> "_Texts":
        """Rows ``idx``: a slice or index tensor (Q' rows), or ``(None, slice)`` / ``(slice, None)`` to add a
        broadcast axis, or an index grid (B, M) -> fields (B, M, ...)."""
        return _Texts(*(None if t is None else t[idx] for t in (self.q, self.unit, self.mu, self.logvar, self.first)))


@dataclass
class _Videos:
    """Per-video state of the engine (rows of V)."""

    mask: Tensor  # (V, F) bool
    key_t: Tensor  # (V, Hh, Dh, F) pooling keys, transposed for the logits product
    ur: Tensor  # (V, R, 2D) [U | Rm]: y = w @ U, (o - r0) / rs1 = w @ Rm
    c_basis: Optional[Tensor] = None  # (V, R + 2, Cc): W2 v_c + b2 (prob/dab) or the point bridge's target
    g_heads: Optional[Tensor] = None  # (V, R + 3, 2D): [mu | logvar] heads of the video Gaussian
    g_target: Optional[Tensor] = None  # (V, R + 3, H): the bridge's mu_v block (dab)
    tok: Optional[Tensor] = None  # (V, D) W1 h_bar + b1 (prob/dab)
    # prob/dab: the per-pair LayerNorm statistics as quadratic forms in the attention weights
    quad1: Optional[Tensor] = None  # (V, R, R): var of LN_attn's input = w^T quad1 w
    quad2: Optional[Tensor] = None  # (V, R + 1, R + 1): var of LN_out's input = z^T quad2 z, z = [rs1 w, 1]
    quad3: Optional[Tensor] = None  # (V, R + 1, R + 3): [M3 | k3 | k4], moments of v_c (see videos())
    g_all: Optional[Tensor] = None  # (V, R + 3, D + 2D [+ H]): [token term / g | heads | mu_v block]

    def take(self, idx: slice | Tensor) -> "_Videos":
        return _Videos(*(None if t is None else t[idx] for t in (
            self.mask, self.key_t, self.ur, self.c_basis, self.g_heads, self.g_target, self.tok,
            self.quad1, self.quad2, self.quad3, self.g_all)))

    def __len__(self) -> int:
        return self.mask.shape[0]


def pack_kept(x: Tensor, keep: Optional[Tensor], n_b: int, n_m: int) -> Tensor:
    """(1 | B, M, ...) -> the kept slots of the (B, M) grid as (P, 1, ...), so the bridge never sees padding.

    ``keep`` (B*M,) bool or None (every slot kept: ``x`` unchanged).
    """
    if keep is None:
        return x
    x = x.expand(n_b, n_m, *x.shape[2:])
    return x.reshape(n_b * n_m, *x.shape[2:])[keep][:, None]


class _Engine:
    """The model's function, re-associated; built once per :func:`score_all` call."""

    def __init__(self, model: DABModel, device: torch.device, mm_dtype: torch.dtype, batch_hint: int = 1024) -> None:
        cfg = model.cfg
        self.model, self.cfg, self.device, self.mm_dtype = model, cfg, device, mm_dtype
        pool = model.pool
        self.d, self.heads, self.head_dim = cfg.embed_dim, pool.num_heads, pool.head_dim
        self.variant = cfg.variant

        def f32(t: Tensor) -> Tensor:
            return t.detach().to(device=device, dtype=torch.float32)

        d = self.d
        self.eps1, self.eps2 = pool.ln_attn.eps, pool.ln_out.eps
        g1, b1 = f32(pool.ln_attn.weight), f32(pool.ln_attn.bias)
        self.g2, self.b2 = f32(pool.ln_out.weight), f32(pool.ln_out.bias)
        self.g1 = g1
        self.wl_t = f32(pool.linear_proj.weight).T.contiguous()  # (D, D)
        # out_proj folded into the values, head by head: (Hh, Dh, D)
        self.wo_heads = f32(pool.out_proj.weight).reshape(d, self.heads, self.head_dim).permute(1, 2, 0).contiguous()
        self.bo = f32(pool.out_proj.bias)
        # a's constant (b1) passes through the residual and linear_proj
        self.r0 = b1 + b1 @ self.wl_t + f32(pool.linear_proj.bias)  # (D,)
        v_a, v_b = self.g2 * _center(self.r0), self.b2  # v_c's constant rows (coefficients rs2 and 1)
        self.c0 = _center(self.r0)  # (D,) C(r0), the constant row of C(o)
        self.m0 = float(self.b2.mean())  # v_c's moments are taken around mean(b2)
        self.b2c = _center(self.b2)  # (D,)
        self.b2c_sq = float(self.b2c.square().sum())
        self.lo, self.hi = cfg.logvar_min, cfg.logvar_max
        # bf16 on CPU: the bridge's products as oneDNN linears on pre-packed weights, the
        # elementwise work between them in the fused kernels (cpu_kernels.py)
        self.onednn: Optional[_OneDNN] = None
        self.kernels: Optional[Kernels] = None

        # c basis: a linear map of v_c (coefficients w rs1 rs2, rs2, 1)
        self.c_w: Optional[Tensor] = None  # (D, Cc)
        self.c_rows: Optional[Tensor] = None  # (2, Cc)
        # g basis: linear maps of h = LN_p(v_c / |v_c|) (coefficients w rs1 rs2 g, rs2 g, g, 1)
        self.gh_w = self.gt_w = self.gh_rows = self.gt_rows = None
        bridge = model.bridge
        if bridge is not None:
            lins = _linears(bridge.drift)
            width = bridge.n_state * d
            w_first = f32(lins[0].weight)  # (H, n*D + n*D + d_t)
            self.ws_t = w_first[:, :width].T.contiguous()  # (n*D, H) state block
            w_target = w_first[:, width: 2 * width]  # (H, n*D)
            self.time_feat = f32(bridge.time_features())  # (T', H), includes the first layer's bias
            self.chi = [float(c) for c in bridge.chi.detach().cpu()]
            # Hidden and output layers carry their bias as an extra input row: the hidden
            # buffers keep a column of ones, so no per-step pass copies a bias into them.
            # The rows are padded with zeros to a multiple of 16 (aligned leading
            # dimensions for AVX-512 / AMX and cuBLAS).
            def with_bias(w: Tensor, b: Tensor) -> Tensor:
                w = torch.cat([w.T, b[None]])  # (H+1, out)
                return F.pad(w, (0, 0, 0, _BIAS_PAD - 1)).to(mm_dtype)  # (H+pad, out)

            # The trajectory carries logvar / 2 (sigma = exp of it, no multiply per step):
            # the output layer's logvar rows are halved, which is exact in floating point.
            w_last, b_last = f32(lins[-1].weight).clone(), f32(lins[-1].bias).clone()  # (n*D, H), (n*D,)
            if self.variant == "dab":
                w_last[d:] *= 0.5
                b_last[d:] *= 0.5
            self.mids = [with_bias(f32(m.weight), f32(m.bias)) for m in lins[1:-1]]  # (H+pad, H) each
            self.last = with_bias(w_last, b_last)  # (H+pad, n*D)
            self.ws_t_mm = self.ws_t.to(mm_dtype)
            self.time_mm = self.time_feat.to(mm_dtype)
            if self.variant == "dab":
                w_tmu, w_tsig = w_target[:, :d], w_target[:, d:]  # (H, D) each
                self.wsig_t = w_tsig.T.contiguous().to(mm_dtype)  # (D, H)
            else:
                self.c_w = w_target.T.contiguous()  # (D, H): the point bridge's target x_v = v_c / |v_c|
                self.c_rows = torch.stack([v_a @ self.c_w, v_b @ self.c_w])
            if mm_dtype == torch.bfloat16 and device.type == "cpu":
                linears = [(w_first[:, :width], None)] + [(f32(m.weight), f32(m.bias)) for m in lins[1:-1]]
                linears += [(w_last, b_last)]
                if self.variant == "dab":
                    linears.append((w_tsig, None))
                self.onednn = _OneDNN.pack(linears, batch_hint)
                if self.onednn is not None:
                    self.kernels = get_kernels()
        if cfg.probabilistic:
            assert model.prob is not None and model.token_unc is not None
            pr = model.prob
            self.gp, self.bp, self.eps_p = f32(pr.ln.weight), f32(pr.ln.bias), pr.ln.eps
            w2, b2 = f32(model.token_unc.w2.weight), f32(model.token_unc.w2.bias)
            self.c_w = w2.T.contiguous()  # (D, D)
            self.c_rows = torch.stack([v_a @ self.c_w, v_b @ self.c_w + b2])
            w_mu, b_mu = f32(pr.mu_head.weight), f32(pr.mu_head.bias)
            w_lv, b_lv = f32(pr.logvar_head.weight), f32(pr.logvar_head.bias)
            h_rows = torch.stack([self.gp * _center(v_a), self.gp * _center(v_b), self.bp])  # (3, D)
            self.gh_w = torch.cat([w_mu, w_lv]).T.contiguous()  # (D, 2D)
            gh_b = torch.cat([b_mu, b_lv])
            self.gh_rows = h_rows @ self.gh_w
            self.gh_rows[2] += gh_b
            if self.variant == "dab":
                self.gt_w = (w_tmu @ w_mu).T.contiguous()  # (D, H): mu_v's block, applied to h directly
                self.gt_rows = h_rows @ self.gt_w
                self.gt_rows[2] += w_tmu @ b_mu

    # ------------------------------------------------------------------ per text / per video

    def texts(self, text: Tensor) -> _Texts:
        """text (Q, D) -> per-text state."""
        m = self.model
        out = _Texts(q=m.pool.query(text) * (1.0 / math.sqrt(self.head_dim)))  # (Q, Hh, Dh)
        if self.variant == "xpool":
            out.unit = text / text.norm(dim=-1, keepdim=True).clamp_min(1e-8)  # as neg_cosine
        if self.cfg.probabilistic:
            assert m.prob is not None
            out.mu, out.logvar = m.prob(text)  # (Q, D) each
        if m.bridge is not None:
            if self.variant == "dab":
                state = torch.cat([out.mu, torch.exp(0.5 * out.logvar)], dim=-1)  # (Q, 2D)
            else:
                state = F.normalize(text, dim=-1)  # (Q, D)
                out.mu = state  # the point bridge starts from the unit text
            out.first = state @ self.ws_t + self.time_feat[0]  # (Q, H)
        return out

    def videos(self, frames: Tensor, mask: Tensor) -> _Videos:
        """frames (V, F, D), mask (V, F) bool -> per-video state (bases)."""
        m, pool = self.model, self.model.pool
        n_v, n_f, d = frames.shape
        x = pool.ln_in(frames)  # (V, F, D)
        key = pool.k_proj(x).reshape(n_v, n_f, self.heads, self.head_dim)  # (V, F, Hh, Dh)
        val = pool.v_proj(x).reshape(n_v, n_f, self.heads, self.head_dim)  # (V, F, Hh, Dh)
        # the weights of each head sum to one, so out_proj's bias splits evenly over the heads
        u = torch.einsum("vfhd,hde->vhfe", val, self.wo_heads) + self.bo / self.heads  # (V, Hh, F, D)
        u = u.reshape(n_v, self.heads * n_f, d)  # (V, R, D), row r = h * F + f
        a1 = self.g1 * _center(u)  # (V, R, D)
        rm = a1 + a1 @ self.wl_t  # (V, R, D)
        out = _Videos(mask=mask, key_t=key.permute(0, 2, 3, 1).contiguous(),  # (V, Hh, Dh, F)
                      ur=torch.cat([u, rm], dim=-1))  # (V, R, 2D)
        v1 = self.g2 * _center(rm)  # (V, R, D)

        def basis(rows: Tensor, w: Tensor, const: Tensor) -> Tensor:
            return torch.cat([rows @ w, const.expand(n_v, *const.shape)], dim=1)

        if self.c_w is not None:
            assert self.c_rows is not None
            out.c_basis = basis(v1, self.c_w, self.c_rows)  # (V, R + 2, Cc)
        if self.cfg.probabilistic:
            assert m.token_unc is not None and self.gh_rows is not None
            hb = self.gp * _center(v1)  # (V, R, D)
            out.g_heads = basis(hb, self.gh_w, self.gh_rows)  # (V, R + 3, 2D)
            if self.gt_w is not None:
                out.g_target = basis(hb, self.gt_w, self.gt_rows)  # (V, R + 3, H)
            out.tok = m.token_unc.video_term(frames, mask)  # (V, D)
            # LN_attn's input is y = w @ U, so C(y) = w @ C(U) and var = w^T (C(U) C(U)^T / D) w.
            uc = _center(u)  # (V, R, D)
            out.quad1 = uc @ uc.transpose(1, 2) / d  # (V, R, R)
            # C(o) = z @ A with z = [rs1 w, 1] and A = [C(Rm); C(r0)], so LN_out's variance is
            # z^T (A A^T / D) z, and v_c - m0 = rs2 (z @ A) * g2 + C(b2) (m0 = mean(b2)) gives
            # |v_c - m0|^2 = rs2^2 z^T M3 z + 2 rs2 z.k3 + |C(b2)|^2 and sum(v_c - m0) = rs2 z.k4,
            # with M3 = A diag(g2^2) A^T, k3 = A (g2 C(b2)), k4 = A g2.  Centering around m0
            # keeps the variance of v_c free of cancellation.
            a = torch.cat([_center(rm), self.c0.expand(n_v, 1, d)], dim=1)  # (V, R + 1, D)
            out.quad2 = a @ a.transpose(1, 2) / d  # (V, R + 1, R + 1)
            ag = a * self.g2  # (V, R + 1, D)
            out.quad3 = torch.cat([ag @ ag.transpose(1, 2), ag @ self.b2c[:, None], a @ self.g2[:, None]], dim=2)
            # one product per pair block: coefficients [wr g, rs2 g, g, 1] against the token basis
            # (its coefficients are these over g: a zero row for the last), the heads and mu_v's block
            tok_basis = torch.cat([out.c_basis, out.c_basis.new_zeros(n_v, 1, out.c_basis.shape[2])], dim=1)
            parts = [tok_basis, out.g_heads] + ([out.g_target] if out.g_target is not None else [])
            out.g_all = torch.cat(parts, dim=2)  # (V, R + 3, D + 2D [+ H])
            out.c_basis = out.g_heads = out.g_target = None  # merged: not kept twice
        return out

    # ------------------------------------------------------------------ per pair

    def pairs(self, ts: _Texts, vs: _Videos, keep: Optional[Tensor] = None, want_var: bool = False
              ) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """Costs of a block of pairs laid out (B, M): row b holds video b with M texts.

        ``vs`` has B videos; the fields of ``ts`` are (1, M, ...) (a grid: the same M
        texts for every video), (B, 1, ...) (aligned: text p with video p) or
        (B, M, ...) (rows of a shortlist).  Each video's bases serve its M texts in
        one batched product.  Returns cost (B, M) or, with ``keep`` (indices into the
        flattened B * M slots, e.g. without a shortlist's padding), cost (P,), the
        slots dropped before the bridge runs.  With ``want_var`` also the mean
        sigma^2 over D of the bridged text and of the video Gaussian, same shape.
        """
        d = self.d
        n_b, n_m = len(vs), ts.q.shape[1]
        q4 = ts.q.permute(0, 2, 1, 3)  # (1 | B, Hh, M, Dh)
        logits = torch.matmul(q4, vs.key_t)  # (B, Hh, M, F)
        w = masked_softmax(logits, vs.mask[:, None, None, :], dim=-1)  # (B, Hh, M, F)
        w = w.permute(0, 2, 1, 3).reshape(n_b, n_m, -1)  # (B, M, R)
        if self.cfg.probabilistic:
            return self._pairs_gaussian(ts, vs, w, keep, want_var)
        yr = torch.bmm(w, vs.ur)  # (B, M, 2D)
        var1, _ = torch.var_mean(yr[..., :d], dim=-1, unbiased=False, keepdim=True)  # (B, M, 1)
        rs1 = torch.rsqrt(var1 + self.eps1)
        o = torch.addcmul(self.r0, yr[..., d:], rs1)  # (B, M, D)
        del yr
        var2, mean2 = torch.var_mean(o, dim=-1, unbiased=False, keepdim=True)  # (B, M, 1)
        rs2 = torch.rsqrt(var2 + self.eps2)
        v_c = o.sub_(mean2).mul_(rs2).mul_(self.g2).add_(self.b2)  # (B, M, D) LN_out(o), in place
        nv = v_c.norm(dim=-1, keepdim=True)  # (B, M, 1)
        one = torch.ones_like(rs2)
        wr = w * (rs1 * rs2)  # (B, M, R)

        def pack(x: Tensor) -> Tensor:
            return pack_kept(x, keep, n_b, n_m)

        if self.variant == "xpool":
            assert ts.unit is not None
            cost = -(v_c / nv.clamp_min(1e-8) * ts.unit).sum(dim=-1)  # (B, M), as neg_cosine
            return (cost.reshape(-1)[keep] if keep is not None else cost), None, None

        if self.variant == "bridge":
            assert self.c_w is not None and vs.c_basis is not None and ts.mu is not None and ts.first is not None
            coef = torch.cat([wr, rs2, one], dim=-1) / nv.clamp_min(1e-12)  # (B, M, R + 2): x_v = v_c / |v_c|
            target = pack(torch.bmm(coef, vs.c_basis)).to(self.mm_dtype)  # (B, M, H) | (P, 1, H)
            x = self._trajectory([pack(ts.mu)], target, pack(ts.first))[0]  # (B, M, D) | (P, 1, D)
            v_c = pack(v_c)
            # neg_cosine clamps each norm at 1e-8, as F.normalize does
            cost = -(F.normalize(x, dim=-1, eps=1e-8) * F.normalize(v_c, dim=-1, eps=1e-8)).sum(dim=-1)
            return (cost[:, 0] if keep is not None else cost), None, None

        raise AssertionError(f"unhandled variant {self.variant!r}")

    def _pairs_gaussian(self, ts: _Texts, vs: _Videos, w: Tensor, keep: Optional[Tensor], want_var: bool
                        ) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """:meth:`pairs` for prob / dab, from the attention weights w (B, M, R).

        The three LayerNorm statistics of a pair (LN_attn, LN_out, and the probabilistic
        encoder's LN of v_c / |v_c|) come from small quadratic forms in w against per-video
        matrices (:meth:`videos`), so no (B, M, D) tensor is made before the heads; one
        product against the merged basis then gives the token term, both heads and the
        bridge's mu_v block.
        """
        d, n_b, n_m = self.d, w.shape[0], w.shape[1]
        assert vs.quad1 is not None and vs.quad2 is not None and vs.quad3 is not None and vs.g_all is not None
        assert vs.tok is not None and ts.mu is not None and ts.logvar is not None
        var1 = (torch.bmm(w, vs.quad1) * w).sum(dim=-1, keepdim=True)  # (B, M, 1)
        rs1 = torch.rsqrt(var1.clamp_min_(0.0) + self.eps1)
        one = torch.ones_like(rs1)
        z = torch.cat([w * rs1, one], dim=-1)  # (B, M, R + 1)
        var2 = (torch.bmm(z, vs.quad2) * z).sum(dim=-1, keepdim=True)  # (B, M, 1)
        rs2 = torch.rsqrt(var2.clamp_min_(0.0) + self.eps2)
        zq = torch.bmm(z, vs.quad3)  # (B, M, R + 3)
        r = z.shape[-1]
        s1 = rs2 * zq[..., r + 1: r + 2]  # sum(v_c - m0), (B, M, 1)
        s2 = (rs2.square() * (zq[..., :r] * z).sum(dim=-1, keepdim=True) + 2.0 * rs2 * zq[..., r: r + 1]
              + self.b2c_sq).clamp_min_(0.0)  # |v_c - m0|^2
        var_v = (s2 / d - (s1 / d).square()).clamp_min_(0.0)  # (B, M, 1)
        nv2 = (s2 + 2.0 * self.m0 * s1 + d * self.m0 * self.m0).clamp_min_(0.0)  # |v_c|^2
        den = nv2.sqrt().clamp_min_(1e-12)  # F.normalize's clamp
        g = torch.rsqrt(var_v / den.square() + self.eps_p) / den  # (B, M, 1)
        wr = w * (rs1 * rs2)  # (B, M, R)
        coef_g = torch.cat([wr * g, rs2 * g, g, one], dim=-1)  # (B, M, R + 3)

        def pack(x: Tensor) -> Tensor:
            return pack_kept(x, keep, n_b, n_m)

        sigma_v: Optional[Tensor] = None
        if self.kernels is not None:
            # bf16 on CPU (dab): one pass from the coefficients to mu_v, lv_v, bf16 sigma_v and the
            # bf16 target block, without the (B, M, 3D + H) float32 product
            assert self.variant == "dab"
            coef_rows, g_rows = coef_g.view(n_b * n_m, -1), g.view(n_b * n_m)  # (B*M, R + 3), (B*M,)
            vidx = torch.arange(n_b).repeat_interleave(n_m)  # (B*M,) each row's video
            if keep is not None:
                coef_rows, g_rows, vidx = coef_rows[keep], g_rows[keep], vidx[keep]
            p, hidden = coef_rows.shape[0], vs.g_all.shape[2] - 3 * d
            mu_v, lv_v = torch.empty(p, d), torch.empty(p, d)  # (P, D) float32
            sigma_v = torch.empty(p, d, dtype=torch.bfloat16)  # (P, D)
            target = torch.empty(p, hidden, dtype=torch.bfloat16)  # (P, H)
            self.kernels.pair_heads_(coef_rows, g_rows, vs.g_all, vidx, vs.tok, self.lo, self.hi, mu_v, lv_v,
                                     sigma_v, target)
            shape = (n_b, n_m) if keep is None else (p, 1)
            mu_v, lv_v, target = mu_v.view(*shape, d), lv_v.view(*shape, d), target.view(*shape, hidden)
        else:
            out = torch.bmm(coef_g, vs.g_all)  # (B, M, D + 2D [+ H]): [g (W2 v_c + b2) | mu | logvar | target]
            mu_v = out[..., d: 2 * d]  # (B, M, D)
            lv_raw, tok_g = out[..., 2 * d: 3 * d], out[..., :d]
            lv_v = lv_raw.clamp_(self.lo, self.hi).add_(tok_g / g).add_(vs.tok[:, None])  # (B, M, D)
            lv_v = lv_v.mul_(0.5).clamp_(self.lo, self.hi)
            if self.variant == "dab":
                target = out[..., 3 * d:].to(self.mm_dtype)  # (B, M, H): mu_v block
                mu_v, lv_v, target = pack(mu_v), pack(lv_v), pack(target)  # (B, M, .) | (P, 1, .)
        if self.variant == "prob":
            mu_t, lv_t = ts.mu, ts.logvar  # (1 | B, M, D)
            if keep is not None:
                mu_v, lv_v, mu_t, lv_t = pack(mu_v), pack(lv_v), pack(mu_t), pack(lv_t)
        else:
            if sigma_v is None:
                sigma_v = torch.exp(0.5 * lv_v).reshape(-1, d).to(self.mm_dtype)  # (P, D)
            if self.onednn is not None:
                shape = target.shape
                target = self.onednn.add(sigma_v, target.reshape(-1, shape[-1]), -1).view(shape)  # + sigma_v block
            else:
                target.view(-1, target.shape[-1]).addmm_(sigma_v, self.wsig_t)  # + sigma_v block
            del sigma_v
            if self.onednn is not None and self.cfg.cost == "kl" and not want_var:
                # KL straight from the float32 state [mu_t, logvar_t / 2], one pass
                assert self.kernels is not None
                st = self._trajectory_onednn([pack(ts.mu), pack(ts.logvar)], target, pack(ts.first), raw=True)
                cost = self.kernels.kl_rows(mu_v.reshape(-1, d), lv_v.reshape(-1, d), st)  # (P,)
                return (cost if keep is not None else cost.view(n_b, n_m)), None, None
            mu_t, lv_t = self._trajectory([pack(ts.mu), pack(ts.logvar)], target, pack(ts.first))
        cost = self.model._cost_fn(mu_v, lv_v, mu_t, lv_t)  # (B, M) | (P, 1)
        bridged_var = video_var = None
        if want_var:
            bridged_var = lv_t.exp().mean(dim=-1).expand(cost.shape)
            video_var = lv_v.exp().mean(dim=-1)
            if keep is not None:
                bridged_var, video_var = bridged_var[:, 0], video_var[:, 0]
        return (cost[:, 0] if keep is not None else cost), bridged_var, video_var

    def _trajectory(self, state: list[Tensor], target: Tensor, first: Tensor) -> list[Tensor]:
        """T' bridge steps on the B x M pairs of a block.

        state: [mu, logvar] (dab) or [x] (point), each broadcastable to (B, M, D)
        (per text); target (B, M, H): the first layer's target block, matmul dtype;
        first: broadcastable to (B, M, H), the first step's state block plus time
        feature and bias, projected per text.  Each step is three large products
        into preallocated buffers plus in-place elementwise work.  Returns the final
        state as float32 (B, M, D) tensors.
        """
        if self.onednn is not None:
            out = self._trajectory_onednn(state, target, first)
            assert isinstance(out, list)
            return out
        n_b, n_m, hidden = target.shape
        d, p = self.d, n_b * n_m
        dab = self.variant == "dab"
        dev, mm = target.device, self.mm_dtype
        width = 2 * d if dab else d
        target = target.view(p, hidden)
        # s is the state block's input [mu, sigma] | [x].  In float32 it holds mu (or x)
        # itself, updated in place; in bf16 it is a rounded copy of the float32 state
        # st = [mu, logvar / 2] | [x], which the update converts delta into once per step.
        # Halving logvar is exact, so hv = logvar / 2 clamped to [lo/2, hi/2] is the
        # reference's logvar / 2 bit for bit, and sigma = exp(hv) needs no multiply.
        s = torch.empty(p, width, device=dev, dtype=mm)  # (P, n*D)
        f32 = mm == torch.float32
        st = s if f32 else torch.empty(p, width, device=dev, dtype=torch.float32)  # (P, n*D)
        mu = st[:, :d]  # (P, D)
        hv = (torch.empty(p, d, device=dev, dtype=torch.float32) if f32 else st[:, d:]) if dab else None
        mu.view(n_b, n_m, d).copy_(state[0])  # per-pair copies: the per-text state is never written
        if hv is not None:
            torch.mul(state[1].expand(n_b, n_m, d), 0.5, out=hv.view(n_b, n_m, d))
        delta32 = None if f32 else torch.empty(p, width, device=dev, dtype=torch.float32)
        h_a = torch.zeros(p, hidden + _BIAS_PAD, device=dev, dtype=mm)  # (P, H+pad)
        h_a[:, hidden] = 1.0  # the bias input; the rest of the padding stays 0
        h_b = h_a.clone() if self.mids else h_a
        delta = torch.empty(p, width, device=dev, dtype=mm)  # (P, n*D)
        steps = len(self.chi)
        for k in range(steps):
            pre = h_a[:, :hidden]  # (P, H) view
            if k == 0:
                # the first step's state is the text's: its block was projected once per text
                torch.add(target.view(n_b, n_m, hidden), first, out=pre.view(n_b, n_m, hidden))
            else:
                torch.add(target, self.time_mm[k], out=pre)
                pre.addmm_(s, self.ws_t_mm)  # (P, H) += [mu, sigma] W_state^T, in place (beta = 1)
            F.silu(pre, inplace=True)
            h_in = h_a
            for w_mid in self.mids:
                h_out = h_b if h_in is h_a else h_a
                torch.mm(h_in, w_mid, out=h_out[:, :hidden])  # (P, H), bias from the ones column
                F.silu(h_out[:, :hidden], inplace=True)
                h_in = h_out
            torch.mm(h_in, self.last, out=delta)  # (P, n*D)
            chi = self.chi[k]
            last = k + 1 == steps
            if f32:
                mu.add_(delta[:, :d], alpha=-chi)
                if hv is not None:
                    hv.add_(delta[:, d:], alpha=-chi)
            else:
                assert delta32 is not None
                st.add_(delta32.copy_(delta), alpha=-chi)  # [mu, logvar / 2] | [x] in float32
            if hv is not None:
                hv.clamp_(0.5 * self.lo, 0.5 * self.hi)
                if not last:
                    torch.exp(hv, out=s[:, d:])  # sigma, in the matmul dtype
            if not f32 and not last:
                s[:, :d].copy_(mu)
        out = [mu.reshape(n_b, n_m, d)]  # float32 (B, M, D)
        if hv is not None:
            out.append((hv * 2.0).view(n_b, n_m, d))
        return out

    def _trajectory_onednn(self, state: list[Tensor], target: Tensor, first: Tensor, raw: bool = False
                           ) -> list[Tensor] | Tensor:
        """:meth:`_trajectory` for bf16 on CPU: oneDNN linears and the fused kernels.

        Each step: the first layer as one linear whose epilogue adds the time feature
        (its bias) and the pair's target block (a binary post-op), SiLU in place; the
        hidden layers likewise; the output layer; then one fused pass updates the
        float32 state ``[mu, logvar / 2]`` and writes the next step's bf16 input
        ``[mu, sigma]``.  Same arithmetic as the generic bf16 path: bf16 products with
        float32 accumulation, the state in float32.
        """
        assert self.onednn is not None and self.kernels is not None
        n_b, n_m, hidden = target.shape
        d, p = self.d, n_b * n_m
        dab = self.variant == "dab"
        width = 2 * d if dab else d
        kern, lin = self.kernels, self.onednn
        target = target.reshape(p, hidden).contiguous()  # (P, H) bf16
        st = torch.empty(p, width, dtype=torch.float32)  # (P, n*D): [mu, logvar / 2] | [x]
        s = torch.empty(p, width, dtype=torch.bfloat16)  # (P, n*D): the first layer's input
        st[:, :d].view(n_b, n_m, d).copy_(state[0])
        if dab:
            torch.mul(state[1].expand(n_b, n_m, d), 0.5, out=st[:, d:].view(n_b, n_m, d))
        # the first step's state is the text's: its block was projected once per text, and
        # a grid's M texts repeat for every video (row r takes text r % M)
        first_rows = first[0] if first.shape[0] == 1 else first.expand(n_b, n_m, hidden).reshape(p, hidden)
        lo, hi = 0.5 * self.lo, 0.5 * self.hi
        steps = len(self.chi)
        for k in range(steps):
            if k == 0:
                h = torch.empty(p, hidden, dtype=torch.bfloat16)  # (P, H)
                kern.add_silu_bf16_(h, target, first_rows.float().contiguous())  # silu(target + first)
            else:
                h = lin.add(s, target, 0, bias=self.time_mm[k])  # (P, H) = s W_s^T + time_k + target
                kern.silu_bf16_(h)
            for i in range(1, len(self.mids) + 1):
                h = lin.linear(h, i)  # (P, H)
                kern.silu_bf16_(h)
            delta = lin.linear(h, len(self.mids) + 1)  # (P, n*D) bf16
            kern.bridge_update_(st, delta, s, self.chi[k], lo, hi, d, k + 1 < steps)
        if raw:
            return st  # (P, n*D) float32: [mu, logvar / 2] | [x]
        out = [st[:, :d].view(n_b, n_m, d)]  # float32 (B, M, D)
        if dab:
            out.append((st[:, d:] * 2.0).view(n_b, n_m, d))
        return out


class _OneDNN:
    """bf16 linears on weights pre-packed for oneDNN (its AMX / AVX512-BF16 kernels on CPU).

    ``torch.ops.mkldnn._linear_pointwise`` is what torch.compile's CPU backend emits for
    a linear; called directly it skips the per-call weight reorder of ``torch.mm`` and
    fuses the bias and an elementwise add into the product's epilogue.
    """

    def __init__(self, weights: list[Tensor], biases: list[Optional[Tensor]]) -> None:
        self.weights, self.biases = weights, biases

    @staticmethod
    def pack(linears: list[tuple[Tensor, Optional[Tensor]]], batch_hint: int) -> Optional["_OneDNN"]:
        """(weight (out, in) float32, bias (out,) | None) each -> packed bf16, or None where unsupported."""
        try:
            if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
                return None
            weights, biases = [], []
            for w, b in linears:
                weights.append(torch.ops.mkldnn._reorder_linear_weight(w.contiguous().to(torch.bfloat16),
                                                                       max(1, batch_hint)))
                biases.append(None if b is None else b.to(torch.bfloat16))
            eng = _OneDNN(weights, biases)
            x = torch.zeros(2, linears[0][0].shape[1], dtype=torch.bfloat16)
            eng.linear(x, 0)  # a build without these ops fails here, not mid-run
            return eng
        except (RuntimeError, AttributeError):
            return None

    def linear(self, x: Tensor, i: int) -> Tensor:
        """x (P, in) bf16 -> x W_i^T + b_i (P, out) bf16."""
        return torch.ops.mkldnn._linear_pointwise(x, self.weights[i], self.biases[i], "none", [], "")

    def add(self, x: Tensor, other: Tensor, i: int, bias: Optional[Tensor] = None) -> Tensor:
        """x W_i^T + bias + other, the add fused into the product; other (P, out) bf16."""
        b = bias if bias is not None else self.biases[i]
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.weights[i], b, "add")


# =========================================================================== driver


def topk_smallest(cost: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``k`` smallest entries, ascending -> (indices (Q, k) int64, values (Q, k) float32).

    Equal costs are ordered by video index; NaN sorts last.  Works in row blocks
    with ``argpartition`` so a wide gallery costs O(V) a row, not O(V log V).
    """
    c_all = np.asarray(cost)
    n_q, n_v = c_all.shape
    k = max(0, min(int(k), n_v))
    idx = np.empty((n_q, k), np.int64)
    rows_per_block = max(1, (1 << 22) // max(n_v, 1))
    for r0 in range(0, n_q, rows_per_block):
        c = c_all[r0: r0 + rows_per_block]
        if k == 0:
            continue
        if k < n_v:
            part = np.argpartition(c, k - 1, axis=1)[:, :k]  # (b, k) unordered
        else:
            part = np.broadcast_to(np.arange(n_v), c.shape)
        vals = np.take_along_axis(c, part, axis=1)
        order = np.lexsort((part, vals), axis=-1)  # by value, then index
        idx[r0: r0 + len(c)] = np.take_along_axis(part, order, axis=1)
    return idx, np.take_along_axis(c_all, idx, axis=1).astype(np.float32)


class _Sink:
    """Moves finished blocks into the host cost matrix.

    On CUDA the device-to-host copies go to pinned buffers without blocking, so
    the next block's kernels are queued while they run; :meth:`flush` waits for
    them once per video chunk.
    """

    def __init__(self, out: np.ndarray, device: torch.device) -> None:
        self.out, self.device, self.cuda = out, device, device.type == "cuda"
        self.pending: list[tuple[Tensor, object, object]] = []

    def put(self, block: Tensor, rows: object, cols: object) -> None:
        if not self.cuda:
            self.out[rows, cols] = block.float().numpy()
            return
        host = torch.empty(block.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(block, non_blocking=True)
        self.pending.append((host, rows, cols))

    def flush(self) -> None:
        if self.pending:
            torch.cuda.synchronize(self.device)
            for host, rows, cols in self.pending:
                self.out[rows, cols] = host.numpy()
            self.pending.clear()


def _to_device(x: Tensor, device: torch.device) -> Tensor:
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def _inner_tiles(n_text: int, n_video: int, p_max: int, video_cap: Optional[int] = None) -> tuple[int, int]:
    """A near-square (texts, videos) tile of at most ``p_max`` pairs (and ``video_cap`` videos)
    that cuts an n_text x n_video block into equal tiles."""
    cap = min(n_video, video_cap) if video_cap is not None else n_video
    if n_text * cap <= p_max:
        tq, tv = n_text, cap
    else:
        tq = min(n_text, max(1, math.isqrt(p_max)))
        tv = min(cap, max(1, p_max // tq))
        tq = min(n_text, max(1, p_max // tv))
    # equal tiles instead of full ones and a thin remainder: the products run at full rate
    # only from a few hundred rows, and a remainder block of a few dozen pairs does not
    return -(-n_text // -(-n_text // tq)), -(-n_video // -(-n_video // tv))


def _shortlist(text: Tensor, frames: Tensor, mask: Tensor, k: int, device: torch.device, p_max: int) -> np.ndarray:
    """First stage: each query's top-k videos by cosine of the text and the mean of the real frames -> (Q, k)."""
    m = mask.to(frames.dtype)[..., None]  # (V, F, 1)
    mean = (frames * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)  # (V, D)
    vid = F.normalize(mean, dim=-1).to(device)  # (V, D)
    txt = F.normalize(text, dim=-1)
    out = np.empty((text.shape[0], k), np.int64)
    rows = max(1, p_max // max(1, vid.shape[0]) * 8)
    for q0 in range(0, text.shape[0], rows):
        sim = txt[q0: q0 + rows].to(device) @ vid.T  # (b, V)
        out[q0: q0 + rows] = torch.topk(sim, k, dim=1).indices.cpu().numpy()
    return out


def score_all(
    model: DABModel,
    text: np.ndarray | Tensor,
    frames: np.ndarray | Tensor,
    mask: np.ndarray | Tensor,
    *,
    text_chunk: Optional[int] = None,
    video_chunk: Optional[int] = None,
    device: str | torch.device = "cpu",
    progress: ProgressCallback | None = None,
    gt: np.ndarray | Tensor | None = None,
    topk: Optional[int] = None,
    memory_budget: Optional[int] = None,
    dtype: str = "float32",
    shortlist: Optional[int] = None,
) -> ScoreResult:
    """Score every text against every video with the fast engine (same function as the reference).

    text (Q, D), frames (V, F, D), mask (V, F) bool; gt (Q,) optional index of each
    query's ground-truth video (per-query variance diagnostics, Table 6).

    * ``text_chunk`` / ``video_chunk``: outer tiles (one progress step each); None
      derives them from the budget.  Within a tile, sub-blocks never exceed
      ``memory_budget`` bytes of per-pair work (default
      :func:`default_memory_budget` of ``device``).
    * ``dtype``: "float32" (matches the reference to ~1e-6) or "bfloat16" (the
      bridge's matrix products in bf16 with float32 accumulation, states and cost
      in float32).
    * ``topk``: also return each query's k best videos (indices and costs, best first).
    * ``shortlist``: score only each query's top-K videos by cosine of the text and
      the frame mean; every other cost is ``+inf``.  None (default) is exact.

    The model is moved to ``device`` ("auto": CUDA when available) and run in eval
    mode; its training flag is restored.  Emits "start" / "advance" / "end" events
    for task "score".
    """
    from .errors import ConfigError

    if dtype not in SCORE_DTYPES:
        raise ConfigError(f"dtype={dtype!r} is invalid; valid: {' | '.join(SCORE_DTYPES)}")
    if topk is not None and topk < 1:
        raise ConfigError(f"topk must be a positive integer, got {topk}")
    if shortlist is not None and shortlist < 1:
        raise ConfigError(f"shortlist must be a positive integer, got {shortlist}")
    if memory_budget is not None and memory_budget < 1:
        raise ConfigError(f"memory_budget must be a positive number of bytes, got {memory_budget}")
    progress = progress or null_progress
    text_t, frames_t, mask_t, gt_t = _prepare_inputs(model, text, frames, mask, gt, text_chunk, video_chunk)
    dev = resolve_device(device)
    mm_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32

    cfg = model.cfg
    n_q, n_v, n_f = text_t.shape[0], frames_t.shape[0], frames_t.shape[1]
    budget = int(memory_budget) if memory_budget is not None else default_memory_budget(dev)
    per_pair = pair_bytes(cfg, n_f, dtype)
    per_video = _video_bytes(cfg, n_f)
    p_max = max(1, budget // per_pair)
    # one video chunk's bases take at most half the budget
    v_cap = max(1, min(n_v, (budget // 2) // per_video))
    if text_chunk is None and video_chunk is None:
        tc, vc = _inner_tiles(max(n_q, 1), max(n_v, 1), p_max, video_cap=max(v_cap, 1))
    else:
        vc = video_chunk if video_chunk is not None else v_cap
        tc = text_chunk if text_chunk is not None else max(1, min(max(n_q, 1), p_max // max(1, min(vc, n_v))))
    info: dict = {"engine": "fast", "dtype": dtype, "device": str(dev), "memory_budget": budget,
                  "pair_bytes": per_pair, "text_chunk": tc, "video_chunk": vc, "sub_blocks": 0}

    was_training = model.training
    model.eval()
    model.to(dev)
    try:
        with torch.no_grad():
            eng = _Engine(model, dev, mm_dtype, batch_hint=min(p_max, max(1, n_q * n_v)))
            if eng.onednn is not None and eng.kernels is not None:
                info["products"] = "onednn"
                info["kernels"] = eng.kernels.name if eng.kernels.fused else f"eager ({eng.kernels.reason})"
            else:  # ATen's products in mm_dtype (on a CPU without native bf16, bf16 ones are emulated: slow)
                info["products"] = f"aten {dtype}" if dev.type == "cpu" else f"{dev.type} {dtype}"
            ts = eng.texts(text_t.to(dev))
            if shortlist is not None:
                cost = np.full((n_q, n_v), np.inf, dtype=np.float32)
                k_sl = min(shortlist, n_v)
                info["shortlist"] = k_sl
                cand = _shortlist(text_t, frames_t, mask_t, k_sl, dev, p_max) if n_q and n_v else np.empty((n_q, 0), np.int64)
                _score_shortlist(eng, ts, frames_t, mask_t, cand, cost, dev, vc, budget, cfg, n_f, dtype, progress, info)
            else:
                cost = np.empty((n_q, n_v), dtype=np.float32)
                _score_grid(eng, ts, frames_t, mask_t, cost, dev, tc, vc, p_max, progress, info)
            result = ScoreResult(cost=cost, shortlist=info.get("shortlist"), info=info)
            if gt_t is not None and cfg.probabilistic:
                _diagnostics(eng, ts, frames_t, mask_t, gt_t, dev, budget, cfg, n_f, dtype, result)
        if topk is not None:
            result.topk_indices, result.topk_costs = topk_smallest(cost, topk)
        return result
    finally:
        model.train(was_training)


def _score_grid(eng: _Engine, ts: _Texts, frames: Tensor, mask: Tensor, cost: np.ndarray, dev: torch.device,
                tc: int, vc: int, p_max: int, progress: ProgressCallback, info: dict) -> None:
    n_q, n_v = cost.shape
    n_tc, n_vc = -(-n_q // tc), -(-n_v // vc)
    progress(Event("start", task="score", total=n_tc * n_vc))
    sink = _Sink(cost, dev)
    for v0 in range(0, n_v, vc):
        v1 = min(v0 + vc, n_v)
        vs = eng.videos(_to_device(frames[v0:v1], dev), _to_device(mask[v0:v1], dev))
        tq, tv = _inner_tiles(min(tc, n_q), v1 - v0, p_max)
        for q0 in range(0, n_q, tc):
            q1 = min(q0 + tc, n_q)
            for a in range(q0, q1, tq):
                b = min(a + tq, q1)
                tsb = ts.take((None, slice(a, b)))  # (1, tq, ...): the same texts for every video
                for j in range(0, v1 - v0, tv):
                    block, _, _ = eng.pairs(tsb, vs.take(slice(j, j + tv)))  # (tv, tq)
                    sink.put(block.T, slice(a, b), slice(v0 + j, v0 + j + block.shape[0]))
                    info["sub_blocks"] += 1
            progress(Event("advance", task="score", n=1))
        sink.flush()
    progress(Event("end", task="score"))


def _score_shortlist(eng: _Engine, ts: _Texts, frames: Tensor, mask: Tensor, cand: np.ndarray, cost: np.ndarray,
                     dev: torch.device, vc: int, budget: int, cfg: ModelConfig, n_f: int, dtype: str,
                     progress: ProgressCallback, info: dict) -> None:
    """Score the (query, candidate) pairs, video chunk by video chunk.

    A chunk's pairs are sorted by video and packed into rows of at most M texts
    per video (M ~ the mean candidates per video), so each video's bases serve a
    whole row and are gathered once a row, not once a pair; the padding of short
    rows is dropped before the bridge.
    """
    n_q, n_v = cost.shape
    q_idx = np.repeat(np.arange(n_q), cand.shape[1])  # (Q*K,)
    v_idx = cand.reshape(-1)
    order = np.argsort(v_idx, kind="stable")
    q_idx, v_idx = q_idx[order], v_idx[order]
    bounds = np.searchsorted(v_idx, np.arange(0, n_v + vc, vc))
    per_pair = pair_bytes(cfg, n_f, dtype)
    per_row_video = _video_bytes(cfg, n_f, transient=False)
    n_vc = -(-n_v // vc)
    progress(Event("start", task="score", total=n_vc))
    sink = _Sink(cost, dev)
    for c, v0 in enumerate(range(0, n_v, vc)):
        lo, hi = int(bounds[c]), int(bounds[c + 1])
        if hi > lo:
            v1 = min(v0 + vc, n_v)
            vs = eng.videos(_to_device(frames[v0:v1], dev), _to_device(mask[v0:v1], dev))
            qs, vl = q_idx[lo:hi], v_idx[lo:hi] - v0  # sorted by vl
            counts = np.bincount(vl, minlength=v1 - v0)  # (vc,)
            width = max(1, int(math.ceil(counts[counts > 0].mean())))  # M
            n_rows = -(-counts // width)  # rows per video
            row_start = np.concatenate([[0], np.cumsum(n_rows)])[:-1]
            first_pair = np.concatenate([[0], np.cumsum(counts)])[:-1]
            pos = np.arange(len(vl)) - first_pair[vl]  # rank of each pair within its video
            row = row_start[vl] + pos // width  # (P,)
            slot = row * width + pos % width  # (P,) flat slot in the (rows, M) grid
            row_video = np.repeat(np.arange(v1 - v0), n_rows)  # (rows,)
            grid_q = np.zeros(int(n_rows.sum()) * width, np.int64)
            grid_q[slot] = qs  # padding slots point at text 0 and are dropped
            grid_q = grid_q.reshape(-1, width)
            rows_per_block = max(1, budget // (width * per_pair + per_row_video))
            for r0 in range(0, len(row_video), rows_per_block):
                r1 = min(r0 + rows_per_block, len(row_video))
                sel = (row >= r0) & (row < r1)  # this block's pairs (contiguous: rows follow the sort)
                keep = torch.from_numpy(slot[sel] - r0 * width).to(dev)
                block, _, _ = eng.pairs(ts.take(torch.from_numpy(grid_q[r0:r1]).to(dev)),
                                        vs.take(torch.from_numpy(row_video[r0:r1]).to(dev)), keep=keep)  # (P,)
                sink.put(block, qs[sel], vl[sel] + v0)
                info["sub_blocks"] += 1
            sink.flush()
        progress(Event("advance", task="score", n=1))
    progress(Event("end", task="score"))


def _diagnostics(eng: _Engine, ts: _Texts, frames: Tensor, mask: Tensor, gt: Tensor, dev: torch.device,
                 budget: int, cfg: ModelConfig, n_f: int, dtype: str, result: ScoreResult) -> None:
    """Mean sigma^2 of text, bridged text and video for the Q ground-truth pairs only (aligned, never the grid)."""
    assert ts.logvar is not None
    n_q = len(gt)
    result.text_var = ts.logvar.exp().mean(dim=-1).float().cpu().numpy()
    step = max(1, budget // (pair_bytes(cfg, n_f, dtype) + _video_bytes(cfg, n_f)))
    bridged, video = [], []
    for q0 in range(0, n_q, step):
        g = gt[q0: q0 + step]
        vs = eng.videos(_to_device(frames[g], dev), _to_device(mask[g], dev))  # this chunk's ground-truth videos
        _, bv, vv = eng.pairs(ts.take((slice(q0, q0 + step), None)), vs, want_var=True)  # text p with video p
        assert bv is not None and vv is not None
        bridged.append(bv[:, 0].float().cpu().numpy())
        video.append(vv[:, 0].float().cpu().numpy())
    empty = np.empty(0, np.float32)
    result.bridged_var = np.concatenate(bridged) if bridged else empty
    result.video_var = np.concatenate(video) if video else empty
