"""The model's layers: text-conditioned pooling, the Gaussian heads, token uncertainty and the distribution bridge."""

from __future__ import annotations

import math
from typing import Callable, Optional
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig, sinusoidal_embedding, step_sizes


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
    output layer is zero-initialised (``drift_init`` = 0), so the bridge starts as
    the identity.  ``drift_inputs="residual"`` adds ``mu_v - mu_t`` (``x_v - x_t``)
    as one more input block, before the time embedding; being linear in the state
    and the target it folds into their blocks of the first layer
    (:meth:`first_blocks`), so it changes how the drift is parametrised and
    initialised, not what it can compute or what scoring costs.

    The state is carried in float32 along the T' steps, also under autocast, where
    only the drift's products run in bf16 (as the scoring engine does them).
    """

    def __init__(self, cfg: ModelConfig, point: bool = False) -> None:
        super().__init__()
        d, h, dt = cfg.embed_dim, cfg.drift_hidden, cfg.time_embed_dim
        self.dim, self.time_dim, self.point = d, dt, point
        self.logvar_min, self.logvar_max = cfg.logvar_min, cfg.logvar_max
        self.n_state = 1 if point else 2  # blocks per side: (x) or (mu, sigma)
        self.residual = cfg.drift_inputs == "residual"
        self.time_mlp = nn.Sequential(nn.Linear(dt, dt), nn.SiLU(), nn.Linear(dt, dt))
        in_dim = 2 * self.n_state * d + (d if self.residual else 0) + dt
        layers: list[nn.Module] = [nn.Linear(in_dim, h), nn.SiLU()]
        for _ in range(cfg.drift_layers - 2):
            layers += [nn.Linear(h, h), nn.SiLU()]
        layers.append(nn.Linear(h, self.n_state * d))
        self.drift = nn.Sequential(*layers)
        if cfg.drift_init > 0:
            nn.init.normal_(self.drift[-1].weight, std=cfg.drift_init)
        else:
            nn.init.zeros_(self.drift[-1].weight)
        nn.init.zeros_(self.drift[-1].bias)
        chi = step_sizes(cfg)  # (T',) ascending in s
        # application order s = T', T'-1, ..., 1
        self.register_buffer("timesteps", torch.arange(cfg.steps, 0, -1, dtype=torch.float32), persistent=False)
        self.register_buffer("chi", torch.flip(chi, dims=[0]).clone(), persistent=False)

    def first_blocks(self) -> tuple[Tensor, Tensor]:
        """The first drift layer's weight on the state and on the target (video) side, (H, n*D) each.

        With ``drift_inputs="residual"`` the residual block W_r is folded in:
        ``W_r (mu_v - mu_t) = W_r mu_v - W_r mu_t``.
        """
        first: nn.Linear = self.drift[0]  # type: ignore[assignment]
        width = self.n_state * self.dim
        w_state, w_target = first.weight[:, :width], first.weight[:, width: 2 * width]  # (H, n*D) each
        if not self.residual:
            return w_state, w_target
        w_res = first.weight[:, 2 * width: 2 * width + self.dim]  # (H, D): on mu_v - mu_t | x_v - x_t
        pad = w_res.new_zeros(w_res.shape[0], width - self.dim)  # the sigma block takes no residual
        w_fold = torch.cat([w_res, pad], dim=1)  # (H, n*D)
        return w_state - w_fold, w_target + w_fold

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
        w_state, w_target = self.first_blocks()  # (H, n*D) each
        target_feat = torch.cat(target, dim=-1) @ w_target.T  # (..., H)
        time_feat = self.time_features()  # (T', H)
        rest = self.drift[1:]
        for k in range(self.chi.shape[0]):
            h = torch.cat(state[: self.n_state], dim=-1) @ w_state.T + target_feat + time_feat[k]  # (..., H)
            state = update(state, rest(h).float(), self.chi[k])  # rest(h): (..., n*D), bf16 under autocast
        return state

    def forward(self, mu_t: Tensor, logvar_t: Tensor, mu_v: Tensor, logvar_v: Tensor) -> tuple[Tensor, Tensor]:
        """Bridge the text Gaussian toward the video Gaussian; inputs broadcast -> (mu, logvar) (..., D), float32."""
        if self.point:
            raise RuntimeError("a point bridge has no variances; call forward_point")
        d, lo, hi = self.dim, self.logvar_min, self.logvar_max

        def update(state: list[Tensor], delta: Tensor, chi: Tensor) -> list[Tensor]:
            mu = state[0] - chi * delta[..., :d]  # (..., D)
            logvar = (state[2] - chi * delta[..., d:]).clamp(lo, hi)  # (..., D)
            return [mu, torch.exp(0.5 * logvar), logvar]

        # the drift sees sigma, the update acts on logvar: carry both, in float32
        mu_t, logvar_t = mu_t.float(), logvar_t.float()
        state = [mu_t, torch.exp(0.5 * logvar_t), logvar_t]
        out = self._trajectory(state, [mu_v, torch.exp(0.5 * logvar_v.float())], update)
        return out[0], out[2]

    def forward_point(self, x_t: Tensor, x_v: Tensor) -> Tensor:
        """Point bridge: refine x_t toward x_v (both (..., D), broadcast) -> (..., D), float32."""
        if not self.point:
            raise RuntimeError("a distribution bridge needs variances; call forward")

        def update(state: list[Tensor], delta: Tensor, chi: Tensor) -> list[Tensor]:
            return [state[0] - chi * delta]  # (..., D)

        return self._trajectory([x_t.float()], [x_v], update)[0]


class ConstantShift(DistributionBridge):
    """The ``drift="constant"`` control (``dab-const``): one learned shift for every pair.

    The bridged text is ``(mu_t + Delta mu, clamp(logvar_t + Delta logvar))`` (the point
    bridge: ``x_t + Delta x``) whatever the video, with ``Delta = -sum_k chi_k d_k`` and
    ``d_k`` the drift network's output at step k for an input of zeros: the same network,
    initialisation and schedule as the real drift, which sees only its time embedding.
    So the control learns its constant at the rate the real drift learns its mean (a raw
    (D,) parameter at the same lr moved the log-variance shift about 10x less in 620 steps
    on the world, docs/model.md), and differs from it only in seeing no pair. Only the
    first layer's time block and bias, and the layers above it, get gradients; its state
    and video blocks multiply zeros. The clamp applies once, to the shifted log-variance.
    """

    def total_shift(self) -> Tensor:
        """Delta (n*D,): [Delta mu, Delta logvar] (the point bridge: [Delta x]), float32."""
        pre = self.time_features()  # (T', H): the first layer on [0, ..., 0, e_k], with its bias
        delta = self.drift[1:](pre).float()  # (T', n*D)
        return -(self.chi[:, None] * delta).sum(dim=0)  # (n*D,)

    @property
    def shift_mu(self) -> Tensor:
        return self.total_shift()[: self.dim]  # (D,)

    @property
    def shift_logvar(self) -> Optional[Tensor]:
        return None if self.point else self.total_shift()[self.dim:]  # (D,)

    def set_shift(self, shift_mu: Tensor, shift_logvar: Optional[Tensor]) -> None:
        """Make the shift exactly ``(shift_mu, shift_logvar)``: the output layer's weight zeroed, its bias set."""
        last: nn.Linear = self.drift[-1]  # type: ignore[assignment]
        parts = [shift_mu] if self.point else [shift_mu, shift_logvar]
        if any(p is None for p in parts):
            raise ValueError("a Gaussian bridge's constant shift needs a log-variance shift")
        with torch.no_grad():
            last.weight.zero_()
            last.bias.copy_(-torch.cat([torch.as_tensor(p, dtype=torch.float32) for p in parts]) / self.chi.sum())

    def forward(self, mu_t: Tensor, logvar_t: Tensor, mu_v: Tensor, logvar_v: Tensor) -> tuple[Tensor, Tensor]:
        """Inputs broadcast as :meth:`DistributionBridge.forward`'s -> (mu, logvar) of the broadcast shape."""
        if self.point:
            raise RuntimeError("a point shift has no variances; call forward_point")
        shift = self.total_shift()
        shape = torch.broadcast_shapes(mu_t.shape, mu_v.shape)
        mu = (mu_t.float() + shift[: self.dim]).expand(shape)
        logvar = (logvar_t.float() + shift[self.dim:]).clamp(self.logvar_min, self.logvar_max).expand(shape)
        return mu, logvar

    def forward_point(self, x_t: Tensor, x_v: Tensor) -> Tensor:
        if not self.point:
            raise RuntimeError("a distribution bridge needs variances; call forward")
        return (x_t.float() + self.total_shift()).expand(torch.broadcast_shapes(x_t.shape, x_v.shape))
