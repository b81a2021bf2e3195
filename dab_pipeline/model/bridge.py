"""The distribution bridge (paper §3.3) and the constant shift that replaces it in the dab-const control."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from .config import ModelConfig, sinusoidal_embedding, step_sizes


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
        w_state, w_target = first.weight[:, :width], first.weight[:, width : 2 * width]  # (H, n*D) each
        if not self.residual:
            return w_state, w_target
        w_res = first.weight[:, 2 * width : 2 * width + self.dim]  # (H, D): on mu_v - mu_t | x_v - x_t
        pad = w_res.new_zeros(w_res.shape[0], width - self.dim)  # the sigma block takes no residual
        w_fold = torch.cat([w_res, pad], dim=1)  # (H, n*D)
        return w_state - w_fold, w_target + w_fold

    def time_features(self) -> Tensor:
        """Time-embedding contribution (plus bias) to the first drift layer, per step (T', H)."""
        e = self.time_mlp(sinusoidal_embedding(self.timesteps, self.time_dim).to(self.chi.dtype))  # (T', d_t)
        first: nn.Linear = self.drift[0]  # type: ignore[assignment]
        return e @ first.weight[:, -self.time_dim :].T + first.bias  # (T', H)

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
        return None if self.point else self.total_shift()[self.dim :]  # (D,)

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
        logvar = (logvar_t.float() + shift[self.dim :]).clamp(self.logvar_min, self.logvar_max).expand(shape)
        return mu, logvar

    def forward_point(self, x_t: Tensor, x_v: Tensor) -> Tensor:
        if not self.point:
            raise RuntimeError("a distribution bridge needs variances; call forward")
        return (x_t.float() + self.total_shift()).expand(torch.broadcast_shapes(x_t.shape, x_v.shape))
