"""DAB: text-conditioned pooling, probabilistic encoder, distribution bridge (paper §3).

Inputs are cached CLIP features: text ``(Q, D)`` and frames ``(V, F, D)``
(projected, not L2-normalised) with a frame mask ``(V, F)`` (False = padding of a
short video; padded frames are excluded from attention and mean pooling).

Work is split by what it depends on, so all-pairs scoring never recomputes
per-text or per-video work for every pair:

* :meth:`DABModel.encode_text` -> :class:`TextState` (text only),
* :meth:`DABModel.encode_video` -> :class:`VideoState` (video only),
* :meth:`DABModel.pair_costs` -> ``(Q, V)`` (per pair: pooling, video Gaussian,
  bridge, cost).

Variants (paper Table 5a):

* ``xpool``  X-Pool baseline: ``C = -cos(t, v_c)``, InfoNCE with a learnable logit scale.
* ``prob``   probabilistic encoder, no bridge: ``C = D(Q_v || P_t)``.
* ``bridge`` point bridge: the L2-normalised text feature is refined toward the
  L2-normalised pooled video by the same truncated drift scheme without
  variances; ``C = -cos(bridged text, v_c)`` with X-Pool's loss.
* ``dab``    the full model: ``C = D(Q_v || P_hat_t)``, P_hat the bridged text Gaussian.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .choices import DIST_COSTS, VARIANTS
from .costs import COSTS, neg_cosine
from .errors import ConfigError

__all__ = [
    "VARIANTS",
    "DIST_COSTS",
    "ModelConfig",
    "TextState",
    "VideoState",
    "PairTerms",
    "ModelOutput",
    "PairDiagnostics",
    "DABModel",
    "TextConditionedPooling",
    "ProbabilisticEncoder",
    "TokenUncertainty",
    "DistributionBridge",
    "beta_schedule",
    "step_sizes",
    "sinusoidal_embedding",
    "bridge_macs_per_pair_step",
    "resolve_tau",
]

_PROB_VARIANTS = ("prob", "dab")
_BRIDGE_VARIANTS = ("bridge", "dab")


@dataclass(frozen=True)
class ModelConfig:
    """Everything that shapes a :class:`DABModel` (paper §3, §4.1 defaults)."""

    embed_dim: int = 512
    variant: str = "dab"  # "xpool" | "prob" | "bridge" | "dab"
    cost: str = "kl"  # distributional cost of prob/dab: "kl" | "w2"
    steps: int = 32  # T', truncated refinement steps
    total_steps: int = 1000  # N, length of the beta schedule
    beta_min: float = 1e-4
    beta_max: float = 2e-2
    chi_min: float = 0.2
    chi_max: float = 0.6
    time_embed_dim: int = 128
    drift_hidden: int = 1024
    drift_layers: int = 3  # number of Linear layers of the drift MLP
    dropout: float = 0.3  # pooling residual dropout (0.4 for MSVD in the paper)
    logvar_init: float = -2.0
    logvar_min: float = -6.0
    logvar_max: float = 2.0
    # PAC temperature.  None: embed_dim / 64 for "kl" (8.0 at D=512), embed_dim / 256
    # for "w2" (2.0 at D=512); see docs/model.md for the scale argument.
    tau: Optional[float] = None
    learn_tau: bool = False
    logit_scale_init: float = 100.0  # cosine variants: CLIP's trained multiplier, as X-Pool starts from it
    num_heads: int = 1  # pooling cross-attention heads (the paper and X-Pool use 1)

    def __post_init__(self) -> None:
        def bad(name: str, valid: str) -> ConfigError:
            return ConfigError(f"model.{name}={getattr(self, name)!r} is invalid; valid: {valid}")

        if self.variant not in VARIANTS:
            raise bad("variant", " | ".join(VARIANTS))
        if self.cost not in DIST_COSTS:
            raise bad("cost", " | ".join(DIST_COSTS))
        if not isinstance(self.embed_dim, int) or self.embed_dim < 1:
            raise bad("embed_dim", "a positive integer")
        if not isinstance(self.num_heads, int) or self.num_heads < 1 or self.embed_dim % self.num_heads:
            raise bad("num_heads", f"a positive divisor of embed_dim={self.embed_dim}")
        if not isinstance(self.total_steps, int) or self.total_steps < 1:
            raise bad("total_steps", "a positive integer")
        if not isinstance(self.steps, int) or not 1 <= self.steps <= self.total_steps:
            raise bad("steps", f"an integer in [1, total_steps={self.total_steps}]")
        if not 0.0 < self.beta_min <= self.beta_max < 1.0:
            raise bad("beta_min" if not 0.0 < self.beta_min < 1.0 else "beta_max",
                      "0 < beta_min <= beta_max < 1")
        if not 0.0 < self.chi_min <= self.chi_max <= 1.0:
            raise bad("chi_min" if not 0.0 < self.chi_min <= 1.0 else "chi_max",
                      "0 < chi_min <= chi_max <= 1")
        if not isinstance(self.time_embed_dim, int) or self.time_embed_dim < 2 or self.time_embed_dim % 2:
            raise bad("time_embed_dim", "an even integer >= 2")
        if not isinstance(self.drift_hidden, int) or self.drift_hidden < 1:
            raise bad("drift_hidden", "a positive integer")
        if not isinstance(self.drift_layers, int) or self.drift_layers < 2:
            raise bad("drift_layers", "an integer >= 2 (input and output layers)")
        if not 0.0 <= self.dropout < 1.0:
            raise bad("dropout", "a float in [0, 1)")
        if not self.logvar_min < self.logvar_max:
            raise bad("logvar_min", f"a float below logvar_max={self.logvar_max}")
        if not self.logvar_min <= self.logvar_init <= self.logvar_max:
            raise bad("logvar_init", f"a float in [logvar_min, logvar_max] = [{self.logvar_min}, {self.logvar_max}]")
        if self.tau is not None and not self.tau > 0.0:
            raise bad("tau", "a positive float, or None for the embed_dim-scaled default")
        if not self.logit_scale_init > 0.0:
            raise bad("logit_scale_init", "a positive float")

    @property
    def probabilistic(self) -> bool:
        return self.variant in _PROB_VARIANTS

    @property
    def uses_bridge(self) -> bool:
        return self.variant in _BRIDGE_VARIANTS


def resolve_tau(cfg: ModelConfig) -> float:
    """The PAC temperature of ``cfg`` (its explicit ``tau`` or the D-scaled default)."""
    if cfg.tau is not None:
        return float(cfg.tau)
    # Both costs are sums over D, so their pair-to-pair spread grows ~linearly in D;
    # scaling tau with D keeps the logits' spread independent of the width.
    return cfg.embed_dim / (64.0 if cfg.cost == "kl" else 256.0)


# --------------------------------------------------------------------------- schedule


def beta_schedule(total_steps: int, beta_min: float, beta_max: float) -> Tensor:
    """Linear betas, ``beta_s = beta_min + (beta_max - beta_min) * s / N`` for s = 1..N (paper §3.3)."""
    s = torch.arange(1, total_steps + 1, dtype=torch.float64)  # (N,)
    return beta_min + (beta_max - beta_min) * s / total_steps  # (N,)


def step_sizes(cfg: ModelConfig) -> Tensor:
    """Step sizes ``chi_s`` for s = 1..T' (float32, ascending in s).

    ``chi_s = Norm(sqrt(1 - prod_{r<=s}(1 - beta_r)))`` over the first T' timesteps
    of the N-step schedule -- the truncated part a DITS-style sampler traverses
    when it starts from the text feature at t = T' instead of from noise at t = N.
    ``Norm`` is a min-max map onto [chi_min, chi_max] over those T' values.  The
    bridge applies them from s = T' down to s = 1, so steps shrink from chi_max
    (coarse) to chi_min (fine).
    """
    betas = beta_schedule(cfg.total_steps, cfg.beta_min, cfg.beta_max)  # (N,)
    alpha_bar = torch.cumprod(1.0 - betas, dim=0)  # (N,)
    raw = torch.sqrt(1.0 - alpha_bar)[: cfg.steps]  # (T',)
    span = raw.max() - raw.min()
    if cfg.steps == 1 or span <= 0:
        # min-max of a single value is undefined; one step takes the largest size
        return torch.full((cfg.steps,), cfg.chi_max, dtype=torch.float32)
    unit = (raw - raw.min()) / span  # (T',) in [0, 1]
    return (cfg.chi_min + (cfg.chi_max - cfg.chi_min) * unit).to(torch.float32)


def sinusoidal_embedding(t: Tensor, dim: int) -> Tensor:
    """``[sin(t / 10000^(2k/d)), cos(t / 10000^(2k/d))]_{k<d/2}`` for integer or real steps ``t (T,)`` -> ``(T, dim)``."""
    half = dim // 2
    k = torch.arange(half, dtype=torch.float64, device=t.device)  # (d/2,)
    freqs = torch.exp(-math.log(10000.0) * 2.0 * k / dim)  # (d/2,)
    args = t.to(torch.float64)[:, None] * freqs[None, :]  # (T, d/2)
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1).to(torch.float32)  # (T, d)


def bridge_macs_per_pair_step(cfg: ModelConfig) -> int:
    """Multiply-adds of one bridge step for one text-video pair, counted as the paper's FLOPs do.

    Drift MLP ``[4D + d_t] -> H -> ... -> 2D`` (``drift_layers`` Linear layers) plus
    the time-embedding MLP ``d_t -> d_t -> d_t`` evaluated per pair.  Element-wise
    work (activations, the update) is left out.  Default config: 4,358,144
    (docs/model.md works through the match with Table 4).  0 for variants without a bridge.
    """
    if not cfg.uses_bridge:
        return 0
    d, h, dt = cfg.embed_dim, cfg.drift_hidden, cfg.time_embed_dim
    in_dim, out_dim = (4 * d + dt, 2 * d) if cfg.variant == "dab" else (2 * d + dt, d)
    drift = in_dim * h + (cfg.drift_layers - 2) * h * h + h * out_dim
    time_mlp = 2 * dt * dt
    return drift + time_mlp


# --------------------------------------------------------------------------- modules


def float32_math(like: Tensor):
    """A block whose ops run in float32 even inside ``torch.autocast``: the costs and the loss.

    Under bf16 autocast the products before the cost may run in bf16 (that is what pays), but a
    cost summed over D terms and a loss over B^2 logits must not; the inputs are cast with
    ``.float()`` inside the block.
    """
    return torch.autocast(device_type=like.device.type, enabled=False)


def masked_softmax(logits: Tensor, mask: Tensor, dim: int) -> Tensor:
    """Softmax with masked-out entries set to exactly zero weight.

    Filling with the dtype's minimum (not -inf) keeps an all-padded row finite
    (uniform weights) instead of NaN; with at least one real frame the padded
    weights underflow to exactly 0.
    """
    fill = torch.finfo(logits.dtype).min
    return torch.softmax(logits.masked_fill(~mask, fill), dim=dim)


class TextConditionedPooling(nn.Module):
    """X-Pool's text-conditioned frame pooling (one cross-attention block).

    Shared LayerNorm on text and frames; attention with the text as query and the
    frames as keys/values, logits scaled by sqrt(head_dim); output projection ->
    LayerNorm -> Linear -> dropout residual -> LayerNorm.  Every projection starts
    as the identity (zero bias), as in X-Pool, so at initialisation the block is a
    text-weighted average of LayerNorm-ed frames.
    """

    def __init__(self, dim: int, num_heads: int = 1, dropout: float = 0.3) -> None:
        super().__init__()
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.ln_in = nn.LayerNorm(dim)
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.ln_attn = nn.LayerNorm(dim)
        self.linear_proj = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)
        self.ln_out = nn.LayerNorm(dim)
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj, self.linear_proj):
            nn.init.eye_(lin.weight)
            nn.init.zeros_(lin.bias)

    def query(self, text: Tensor) -> Tensor:
        """text (Q, D) -> per-head queries (Q, H, Dh)."""
        q = self.q_proj(self.ln_in(text))  # (Q, D)
        return q.reshape(q.shape[0], self.num_heads, self.head_dim)  # (Q, H, Dh)

    def keys_values(self, frames: Tensor) -> tuple[Tensor, Tensor]:
        """frames (V, F, D) -> keys, values (V, F, H, Dh)."""
        x = self.ln_in(frames)  # (V, F, D)
        v_, f_ = x.shape[:2]
        k = self.k_proj(x).reshape(v_, f_, self.num_heads, self.head_dim)  # (V, F, H, Dh)
        v = self.v_proj(x).reshape(v_, f_, self.num_heads, self.head_dim)  # (V, F, H, Dh)
        return k, v

    def pool(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, grid: bool) -> Tensor:
        """Pooled videos: grid -> (Q, V, D) (video j for text i); aligned -> (P, D) (pair p)."""
        scale = 1.0 / math.sqrt(self.head_dim)
        if grid:
            logits = torch.einsum("qhd,vfhd->qvhf", q, k) * scale  # (Q, V, H, F)
            w = masked_softmax(logits, mask[None, :, None, :], dim=-1)  # (Q, V, H, F)
            attn = torch.einsum("qvhf,vfhd->qvhd", w, v)  # (Q, V, H, Dh)
        else:
            logits = torch.einsum("phd,pfhd->phf", q, k) * scale  # (P, H, F)
            w = masked_softmax(logits, mask[:, None, :], dim=-1)  # (P, H, F)
            attn = torch.einsum("phf,pfhd->phd", w, v)  # (P, H, Dh)
        attn = attn.reshape(*attn.shape[:-2], self.dim)  # (..., D)
        attn = self.ln_attn(self.out_proj(attn))  # (..., D)
        out = attn + self.dropout(self.linear_proj(attn))  # (..., D)
        return self.ln_out(out)  # (..., D)


class ProbabilisticEncoder(nn.Module):
    """Shared Gaussian head (paper §3.2): L2-normalise -> LayerNorm -> (mu, logvar).

    The logvar bias starts at ``logvar_init`` so every Gaussian starts at
    sigma^2 ~ e^-2; logvar is clamped to [logvar_min, logvar_max].
    """

    def __init__(self, dim: int, logvar_init: float, logvar_min: float, logvar_max: float) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.mu_head = nn.Linear(dim, dim)
        self.logvar_head = nn.Linear(dim, dim)
        nn.init.constant_(self.logvar_head.bias, logvar_init)
        self.logvar_min, self.logvar_max = logvar_min, logvar_max

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (..., D) -> mu (..., D), logvar (..., D)."""
        h = self.ln(F.normalize(x, dim=-1))  # (..., D)
        mu = self.mu_head(h)  # (..., D)
        logvar = self.logvar_head(h).clamp(self.logvar_min, self.logvar_max)  # (..., D)
        return mu, logvar


class TokenUncertainty(nn.Module):
    """Video token-based uncertainty (paper §3.2).

    ``H = SelfAttn(frames)``, ``h_bar = mean over real frames``,
    ``logvar_tok = W1 h_bar + b1 + W2 v_c + b2``.  The W1 term depends only on the
    video (:meth:`video_term`, cached in :class:`VideoState`); the W2 term on the
    pooled pair (:meth:`pair_term`).  Tokens are LayerNorm-ed before attention
    (pre-LN) because raw CLIP frame features are not normalised.  b1 = b2 =
    logvar_init / 2 so the fused logvar starts near logvar_init.
    """

    def __init__(self, dim: int, logvar_init: float) -> None:
        super().__init__()
        self.dim = dim
        self.ln = nn.LayerNorm(dim)
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.w1 = nn.Linear(dim, dim)
        self.w2 = nn.Linear(dim, dim)
        nn.init.constant_(self.w1.bias, logvar_init / 2.0)
        nn.init.constant_(self.w2.bias, logvar_init / 2.0)

    def video_term(self, frames: Tensor, mask: Tensor) -> Tensor:
        """frames (V, F, D), mask (V, F) -> W1 h_bar + b1 (V, D)."""
        x = self.ln(frames)  # (V, F, D)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (V, F, D) each
        logits = torch.einsum("vid,vjd->vij", q, k) / math.sqrt(self.dim)  # (V, F, F)
        w = masked_softmax(logits, mask[:, None, :], dim=-1)  # (V, F, F): padded keys get 0
        h = self.out_proj(torch.einsum("vij,vjd->vid", w, v))  # (V, F, D)
        m = mask.to(h.dtype)[..., None]  # (V, F, 1)
        # padded queries are excluded from the mean, so garbage frames cannot leak in
        h_bar = (h * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)  # (V, D)
        return self.w1(h_bar)  # (V, D)

    def pair_term(self, v_c: Tensor) -> Tensor:
        """v_c (..., D) -> W2 v_c + b2 (..., D)."""
        return self.w2(v_c)


class DistributionBridge(nn.Module):
    """Deterministic truncated bridge (paper §3.3).

    ``point=False`` (DAB): the drift sees ``[mu_t, sigma_t, mu_v, sigma_v, e_t]``
    (4D + d_t) and predicts ``(d_mu, d_logvar)`` (2D); ``point=True`` (the
    ``bridge`` ablation) sees ``[x_t, x_v, e_t]`` and predicts ``d_x`` (D).  The
    output layer is zero-initialised, so the bridge starts as the identity.
    """

    def __init__(self, cfg: ModelConfig, point: bool = False) -> None:
        super().__init__()
        d, h, dt = cfg.embed_dim, cfg.drift_hidden, cfg.time_embed_dim
        self.dim, self.time_dim, self.point = d, dt, point
        self.logvar_min, self.logvar_max = cfg.logvar_min, cfg.logvar_max
        self.n_state = 1 if point else 2  # blocks per side: (x) or (mu, sigma)
        self.time_mlp = nn.Sequential(nn.Linear(dt, dt), nn.SiLU(), nn.Linear(dt, dt))
        in_dim = 2 * self.n_state * d + dt
        layers: list[nn.Module] = [nn.Linear(in_dim, h), nn.SiLU()]
        for _ in range(cfg.drift_layers - 2):
            layers += [nn.Linear(h, h), nn.SiLU()]
        layers.append(nn.Linear(h, self.n_state * d))
        self.drift = nn.Sequential(*layers)
        nn.init.zeros_(self.drift[-1].weight)
        nn.init.zeros_(self.drift[-1].bias)
        chi = step_sizes(cfg)  # (T',) ascending in s
        # application order s = T', T'-1, ..., 1
        self.register_buffer("timesteps", torch.arange(cfg.steps, 0, -1, dtype=torch.float32), persistent=False)
        self.register_buffer("chi", torch.flip(chi, dims=[0]).clone(), persistent=False)

    def time_features(self) -> Tensor:
        """Time-embedding contribution (plus bias) to the first drift layer, per step (T', H)."""
        e = self.time_mlp(sinusoidal_embedding(self.timesteps, self.time_dim).to(self.chi.dtype))  # (T', d_t)
        first: nn.Linear = self.drift[0]  # type: ignore[assignment]
        return e @ first.weight[:, -self.time_dim:].T + first.bias  # (T', H)

    def _trajectory(self, state: list[Tensor], target: list[Tensor], update: Callable) -> list[Tensor]:
        """Run the T' steps; ``state[:n_state]`` and ``target`` feed the drift, ``update`` applies it."""
        # The first Linear acts on a concatenation; splitting its weight by input
        # block is exact and lets the target (video) block, constant over the
        # trajectory, be projected once instead of at every step.
        first: nn.Linear = self.drift[0]  # type: ignore[assignment]
        width = self.n_state * self.dim
        w_state = first.weight[:, :width]  # (H, n*D)
        w_target = first.weight[:, width: 2 * width]  # (H, n*D)
        target_feat = torch.cat(target, dim=-1) @ w_target.T  # (..., H)
        time_feat = self.time_features()  # (T', H)
        rest = self.drift[1:]
        for k in range(self.chi.shape[0]):
            h = torch.cat(state[: self.n_state], dim=-1) @ w_state.T + target_feat + time_feat[k]  # (..., H)
            state = update(state, rest(h), self.chi[k])  # rest(h): (..., n*D)
        return state

    def forward(self, mu_t: Tensor, logvar_t: Tensor, mu_v: Tensor, logvar_v: Tensor) -> tuple[Tensor, Tensor]:
        """Bridge the text Gaussian toward the video Gaussian; inputs broadcast -> (mu, logvar) (..., D)."""
        if self.point:
            raise RuntimeError("a point bridge has no variances; call forward_point")
        d, lo, hi = self.dim, self.logvar_min, self.logvar_max

        def update(state: list[Tensor], delta: Tensor, chi: Tensor) -> list[Tensor]:
            mu = state[0] - chi * delta[..., :d]  # (..., D)
            logvar = (state[2] - chi * delta[..., d:]).clamp(lo, hi)  # (..., D)
            return [mu, torch.exp(0.5 * logvar), logvar]

        # the drift sees sigma, the update acts on logvar: carry both
        state = [mu_t, torch.exp(0.5 * logvar_t), logvar_t]
        out = self._trajectory(state, [mu_v, torch.exp(0.5 * logvar_v)], update)
        return out[0], out[2]

    def forward_point(self, x_t: Tensor, x_v: Tensor) -> Tensor:
        """Point bridge: refine x_t toward x_v (both (..., D), broadcast) -> (..., D)."""
        if not self.point:
            raise RuntimeError("a distribution bridge needs variances; call forward")

        def update(state: list[Tensor], delta: Tensor, chi: Tensor) -> list[Tensor]:
            return [state[0] - chi * delta]  # (..., D)

        return self._trajectory([x_t], [x_v], update)[0]


# --------------------------------------------------------------------------- states & outputs


@dataclass
class TextState:
    """Everything that depends only on the texts (Q of them)."""

    feat: Tensor  # (Q, D) raw CLIP text feature
    q: Tensor  # (Q, H, Dh) pooling queries
    mu: Optional[Tensor] = None  # (Q, D) text Gaussian (prob/dab)
    logvar: Optional[Tensor] = None  # (Q, D)
    point: Optional[Tensor] = None  # (Q, D) L2-normalised text (point bridge)

    def __len__(self) -> int:
        return self.feat.shape[0]

    def select(self, idx: Tensor | slice) -> "TextState":
        return TextState(*(None if t is None else t[idx] for t in (self.feat, self.q, self.mu, self.logvar, self.point)))


@dataclass
class VideoState:
    """Everything that depends only on the videos (V of them)."""

    k: Tensor  # (V, F, H, Dh) pooling keys
    v: Tensor  # (V, F, H, Dh) pooling values
    mask: Tensor  # (V, F) bool, True = real frame
    tok_logvar: Optional[Tensor] = None  # (V, D) W1 h_bar + b1 (prob/dab)

    def __len__(self) -> int:
        return self.k.shape[0]

    def select(self, idx: Tensor | slice) -> "VideoState":
        return VideoState(self.k[idx], self.v[idx], self.mask[idx],
                          None if self.tok_logvar is None else self.tok_logvar[idx])


@dataclass
class PairTerms:
    """Per-pair results, shaped (Q, V, ...) on a grid or (P, ...) for aligned pairs."""

    cost: Tensor  # (Q, V) | (P,)
    video_mu: Optional[Tensor] = None  # (Q, V, D) | (P, D)
    video_logvar: Optional[Tensor] = None
    bridged_mu: Optional[Tensor] = None  # text after the bridge (before it for "prob")
    bridged_logvar: Optional[Tensor] = None


@dataclass
class ModelOutput:
    """Training forward output on a batch of B matched pairs."""

    cost: Tensor  # (B, B), lower is better; diagonal = matched pairs
    text_mu: Optional[Tensor] = None  # (B, D)
    text_logvar: Optional[Tensor] = None  # (B, D)
    video_mu_diag: Optional[Tensor] = None  # (B, D) video i pooled for text i
    video_logvar_diag: Optional[Tensor] = None  # (B, D)
    bridged_mu_diag: Optional[Tensor] = None  # (B, D)
    bridged_logvar_diag: Optional[Tensor] = None  # (B, D)


@dataclass
class PairDiagnostics:
    """Mean sigma^2 over D for given (text, video) pairs (paper Table 6); None for cosine variants."""

    text_var: Optional[Tensor] = None  # (P,)
    bridged_var: Optional[Tensor] = None  # (P,)
    video_var: Optional[Tensor] = None  # (P,)


def _diag(x: Optional[Tensor]) -> Optional[Tensor]:
    """(B, B, D) -> (B, D) diagonal over the two pair axes."""
    return None if x is None else torch.diagonal(x, dim1=0, dim2=1).T


# --------------------------------------------------------------------------- model


class DABModel(nn.Module):
    """The DAB model and its ablation variants; only the modules a variant uses are built."""

    def __init__(self, cfg: ModelConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg if cfg is not None else ModelConfig()
        d = cfg.embed_dim
        self.pool = TextConditionedPooling(d, cfg.num_heads, cfg.dropout)
        self.prob: Optional[ProbabilisticEncoder] = None
        self.token_unc: Optional[TokenUncertainty] = None
        self.bridge: Optional[DistributionBridge] = None
        if cfg.probabilistic:
            self.prob = ProbabilisticEncoder(d, cfg.logvar_init, cfg.logvar_min, cfg.logvar_max)
            self.token_unc = TokenUncertainty(d, cfg.logvar_init)
            tau = math.log(resolve_tau(cfg))
            if cfg.learn_tau:
                self.log_tau = nn.Parameter(torch.tensor(tau))
            else:
                self.register_buffer("log_tau", torch.tensor(tau))
        else:
            self.log_logit_scale = nn.Parameter(torch.tensor(math.log(cfg.logit_scale_init)))
        if cfg.uses_bridge:
            self.bridge = DistributionBridge(cfg, point=cfg.variant == "bridge")
        self._cost_fn = COSTS.get(cfg.cost)

    # ---- temperatures

    def tau(self) -> Tensor:
        """PAC temperature (prob/dab)."""
        if not self.cfg.probabilistic:
            raise ConfigError(f"variant {self.cfg.variant!r} has no PAC temperature (it uses logit_scale)")
        return torch.exp(self.log_tau)

    # ---- encoders

    def encode_text(self, text: Tensor) -> TextState:
        """text (Q, D) -> :class:`TextState`."""
        self._check_dim(text, "text")
        state = TextState(feat=text, q=self.pool.query(text))
        if self.prob is not None:
            state.mu, state.logvar = self.prob(text)  # (Q, D) each
        elif self.bridge is not None:
            state.point = F.normalize(text, dim=-1)  # (Q, D)
        return state

    def encode_video(self, frames: Tensor, mask: Tensor) -> VideoState:
        """frames (V, F, D), mask (V, F) bool -> :class:`VideoState`."""
        self._check_dim(frames, "frames")
        if mask.shape != frames.shape[:2]:
            raise ValueError(f"mask shape {tuple(mask.shape)} does not match frames {tuple(frames.shape[:2])}")
        mask = mask.to(torch.bool)
        k, v = self.pool.keys_values(frames)
        state = VideoState(k=k, v=v, mask=mask)
        if self.token_unc is not None:
            state.tok_logvar = self.token_unc.video_term(frames, mask)  # (V, D)
        return state

    def _check_dim(self, x: Tensor, name: str) -> None:
        if x.shape[-1] != self.cfg.embed_dim:
            raise ValueError(f"{name} has feature size {x.shape[-1]}, the model expects embed_dim={self.cfg.embed_dim}")

    # ---- per pair

    def pair_terms(self, ts: TextState, vs: VideoState, grid: bool = True) -> PairTerms:
        """Per-pair pooling, video Gaussian, bridge and cost.

        grid=True: every text with every video -> (Q, V, ...).  grid=False: text p
        with video p (Q == V == P) -> (P, ...).
        """
        if not grid and len(ts) != len(vs):
            raise ValueError(f"aligned pairs need as many texts as videos, got {len(ts)} and {len(vs)}")
        # text-side tensors broadcast over videos as (Q, 1, D) on a grid
        t_ = (lambda x: x[:, None]) if grid else (lambda x: x)
        v_ = (lambda x: x[None]) if grid else (lambda x: x)
        v_c = self.pool.pool(ts.q, vs.k, vs.v, vs.mask, grid)  # (Q, V, D) | (P, D)
        variant = self.cfg.variant
        if variant == "xpool":
            with float32_math(v_c):
                return PairTerms(cost=neg_cosine(t_(ts.feat).float(), v_c.float()))
        if variant == "bridge":
            assert self.bridge is not None and ts.point is not None
            x = self.bridge.forward_point(t_(ts.point), F.normalize(v_c, dim=-1))  # (Q, V, D) | (P, D)
            with float32_math(v_c):
                return PairTerms(cost=neg_cosine(x.float(), v_c.float()), video_mu=v_c, bridged_mu=x)
        assert self.prob is not None and self.token_unc is not None
        assert ts.mu is not None and ts.logvar is not None and vs.tok_logvar is not None
        mu_v, lv_base = self.prob(v_c)  # (Q, V, D) each
        lv_tok = v_(vs.tok_logvar) + self.token_unc.pair_term(v_c)  # (Q, V, D)
        lv_v = (0.5 * (lv_base + lv_tok)).clamp(self.cfg.logvar_min, self.cfg.logvar_max)  # (Q, V, D)
        mu_t, lv_t = t_(ts.mu), t_(ts.logvar)  # (Q, 1, D)
        if self.bridge is not None:
            mu_t, lv_t = self.bridge(mu_t, lv_t, mu_v, lv_v)  # (Q, V, D) each
        else:
            # per-pair views (no copy) so callers can index pairs uniformly
            mu_t, lv_t = mu_t.expand_as(mu_v), lv_t.expand_as(lv_v)  # (Q, V, D)
        with float32_math(mu_v):  # a KL of D terms in bf16 loses several logits at tau 8 (issue 16)
            cost = self._cost_fn(mu_v.float(), lv_v.float(), mu_t.float(), lv_t.float())  # (Q, V): D(Q_v || P_hat_t)
        return PairTerms(cost=cost, video_mu=mu_v, video_logvar=lv_v, bridged_mu=mu_t, bridged_logvar=lv_t)

    def pair_costs(self, ts: TextState, vs: VideoState) -> Tensor:
        """Cost of every (text, video) pair, (Q, V); lower is better."""
        return self.pair_terms(ts, vs, grid=True).cost

    def pair_diagnostics(self, ts: TextState, vs: VideoState, gt: Optional[Tensor] = None) -> PairDiagnostics:
        """Mean sigma^2 over D of text, bridged text and video for the pairs (q, gt[q]).

        gt (Q,) indexes ``vs``; None pairs text i with video i.  Only those Q pairs
        are computed (aligned mode), never the grid.
        """
        if not self.cfg.probabilistic:
            return PairDiagnostics()
        if gt is None:
            gt = torch.arange(len(ts), device=ts.feat.device)
        terms = self.pair_terms(ts, vs.select(gt.to(vs.k.device)), grid=False)
        assert ts.logvar is not None and terms.bridged_logvar is not None and terms.video_logvar is not None
        return PairDiagnostics(
            text_var=ts.logvar.exp().mean(dim=-1),  # (Q,)
            bridged_var=terms.bridged_logvar.exp().mean(dim=-1),  # (Q,)
            video_var=terms.video_logvar.exp().mean(dim=-1),  # (Q,)
        )

    def forward(self, text: Tensor, frames: Tensor, mask: Tensor) -> ModelOutput:
        """A batch of B matched pairs: text (B, D), frames (B, F, D), mask (B, F) -> :class:`ModelOutput`."""
        ts = self.encode_text(text)
        vs = self.encode_video(frames, mask)
        terms = self.pair_terms(ts, vs, grid=True)
        return ModelOutput(
            cost=terms.cost,  # (B, B)
            text_mu=ts.mu if ts.mu is not None else ts.point,
            text_logvar=ts.logvar,
            video_mu_diag=_diag(terms.video_mu),
            video_logvar_diag=_diag(terms.video_logvar),
            bridged_mu_diag=_diag(terms.bridged_mu),
            bridged_logvar_diag=_diag(terms.bridged_logvar),
        )

    def loss(self, out: ModelOutput) -> Tensor:
        """The variant's training loss (see :func:`dab_pipeline.losses.model_loss`)."""
        from .losses import model_loss

        return model_loss(self, out)

