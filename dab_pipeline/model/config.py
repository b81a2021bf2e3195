"""ModelConfig, the PAC temperature rule, the bridge's beta schedule and step sizes, and its MAC count."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..core.choices import CHI_NORMS, DIST_COSTS, DRIFT_INPUTS, DRIFTS, VARIANCE_MODES, VARIANTS
from ..core.errors import ConfigError
from ..core.variants import VARIANT_SPECS, VariantSpec
from .covariance import CovarianceSpec, parse_covariance


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
    # Controls (docs/model.md): "fixed" keeps every text and video Gaussian at sigma^2 = e^logvar_init
    # (prob-fixvar, dab-fixvar); "constant" replaces the drift network by one learned shift
    # (Delta mu, Delta log sigma^2) for every pair (dab-const).
    variance: str = "learned"
    drift: str = "mlp"
    # The bridge's training study (docs/model.md). drift_init: std of the drift output layer's initial
    # weights (0: zero-initialised, the paper); drift_inputs "residual": mu_v - mu_t (x_v - x_t) as one
    # more input block of the drift; chi_norm "sum": step sizes proportional to the paper's, scaled to
    # sum to 1 (an Euler integration over unit time) instead of min-max onto [chi_min, chi_max].
    drift_init: float = 0.0
    drift_inputs: str = "paper"
    chi_norm: str = "minmax"
    # The covariance of every Gaussian (docs/model.md, issue 36): "diag" (the paper's) | "lowrank:R"
    # (diag(sigma^2) + U U^T, U (D, R) predicted by the Gaussian heads; prob and dab) | "mixture:K"
    # (the text as K diagonal components with learned weights; prob and dab).  Run folders written
    # before the option load as "diag".
    covariance: str = "diag"

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
            raise bad("beta_min" if not 0.0 < self.beta_min < 1.0 else "beta_max", "0 < beta_min <= beta_max < 1")
        if not 0.0 < self.chi_min <= self.chi_max <= 1.0:
            raise bad("chi_min" if not 0.0 < self.chi_min <= 1.0 else "chi_max", "0 < chi_min <= chi_max <= 1")
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
        for name, valid in (
            ("variance", VARIANCE_MODES),
            ("drift", DRIFTS),
            ("drift_inputs", DRIFT_INPUTS),
            ("chi_norm", CHI_NORMS),
        ):
            if getattr(self, name) not in valid:
                raise bad(name, " | ".join(valid))
        if not self.drift_init >= 0.0:
            raise bad("drift_init", "a float >= 0 (0: the zero-initialised output layer of the paper)")
        _check_covariance(self)

    @property
    def spec(self) -> VariantSpec:
        """What the variant is made of (:mod:`dab_pipeline.core.variants`)."""
        return VARIANT_SPECS.get(self.variant)

    @property
    def gaussian(self) -> bool:
        """Gaussian embeddings, a distributional cost and the PAC loss (prob, dab and their controls)."""
        return self.spec.gaussian

    @property
    def covariance_spec(self) -> CovarianceSpec:
        """``covariance`` as parsed when the config was built (config.json keeps the string the user wrote)."""
        return self._covariance_spec  # type: ignore[attr-defined]  # set by __post_init__ (_check_covariance)

    @property
    def uses_bridge(self) -> bool:
        return self.spec.bridge

    @property
    def runs_drift(self) -> bool:
        """Whether scoring runs the drift network for T' steps per pair (a bridge that is not constant)."""
        return self.spec.bridge and self.drift == "mlp"

    @property
    def bridge_states(self) -> int:
        """Blocks of D the bridge carries: 2 ([mu, sigma], dab), 1 ([x], the point bridge), 0 (none)."""
        return self.spec.bridge_states


def _check_covariance(cfg: ModelConfig) -> None:
    """``cfg.covariance`` parses and fits the rest of ``cfg``; one line naming the conflict otherwise.

    ``variance="fixed"`` with a non-diagonal covariance is refused, not read as "fix the diagonal and
    learn U": the fixvar controls are the floor that measures what *learned* uncertainty is worth, and a
    learned U is learned uncertainty (a run that learns it would no longer be that floor).  The W2 cost is
    refused for low-rank covariances: its trace term ``tr((S_a^1/2 S_b S_a^1/2)^1/2)`` needs an O(D^3) matrix square
    root per pair, since ``diag(s_a) + U_a U_a^T`` and ``diag(s_b) + U_b U_b^T`` do not commute.
    """
    cov = parse_covariance(cfg.covariance)
    object.__setattr__(cfg, "_covariance_spec", cov)  # parsed once, here: every reader takes covariance_spec
    if cov.kind == "diag":
        return
    if cov.rank > cfg.embed_dim:
        raise ConfigError(
            f"model.covariance={cfg.covariance}: the rank R must be at most the feature width embed_dim={cfg.embed_dim}"
        )
    if cov.kind not in cfg.spec.covariances:
        accepted = [n for n in VARIANT_SPECS if cov.kind in VARIANT_SPECS.get(n).covariances]
        raise ConfigError(
            f"model.covariance={cfg.covariance} is not available for variant {cfg.variant!r} "
            f"({cfg.spec.summary}); variants that take it: {', '.join(accepted) or 'none yet'}"
        )
    if cfg.variance == "fixed":
        raise ConfigError(
            f"model.covariance={cfg.covariance} with model.variance=fixed: the fixed-variance control fixes every "
            "covariance (a learned U is learned uncertainty); use model.covariance=diag for the fixvar controls"
        )
    if cfg.cost != "kl":
        why = (
            "W2 between low-rank covariances needs a D x D matrix square root per pair"
            if cov.kind == "lowrank"
            else "the mixture's cost is the variational KL of Hershey and Olsen, built on the KL of its components"
        )
        raise ConfigError(f"model.covariance={cfg.covariance} with model.cost={cfg.cost}: {why}; use model.cost=kl")


def resolve_tau(cfg: ModelConfig) -> float:
    """The PAC temperature of ``cfg`` (its explicit ``tau`` or the D-scaled default)."""
    if cfg.tau is not None:
        return float(cfg.tau)
    # Both costs are sums over D, so their pair-to-pair spread grows ~linearly in D;
    # scaling tau with D keeps the logits' spread independent of the width.
    return cfg.embed_dim / (64.0 if cfg.cost == "kl" else 256.0)


def beta_schedule(total_steps: int, beta_min: float, beta_max: float) -> Tensor:
    """Linear betas, ``beta_s = beta_min + (beta_max - beta_min) * s / N`` for s = 1..N (paper §3.3)."""
    s = torch.arange(1, total_steps + 1, dtype=torch.float64)  # (N,)
    return beta_min + (beta_max - beta_min) * s / total_steps  # (N,)


def step_sizes(cfg: ModelConfig) -> Tensor:
    """Step sizes ``chi_s`` for s = 1..T' (float32, ascending in s).

    ``chi_s = Norm(sqrt(1 - prod_{r<=s}(1 - beta_r)))`` over the first T' timesteps
    of the N-step schedule -- the truncated part a DITS-style sampler traverses
    when it starts from the text feature at t = T' instead of from noise at t = N.
    ``Norm`` is a min-max map onto [chi_min, chi_max] over those T' values
    (``chi_norm="minmax"``, the paper's range), or a scaling that makes them sum to
    1 (``"sum"``: the T' steps integrate the drift over unit time).  The bridge
    applies them from s = T' down to s = 1, so steps shrink from the largest
    (coarse) to the smallest (fine).
    """
    betas = beta_schedule(cfg.total_steps, cfg.beta_min, cfg.beta_max)  # (N,)
    alpha_bar = torch.cumprod(1.0 - betas, dim=0)  # (N,)
    raw = torch.sqrt(1.0 - alpha_bar)[: cfg.steps]  # (T',)
    if cfg.chi_norm == "sum":
        return (raw / raw.sum()).to(torch.float32)
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
    if not cfg.runs_drift:
        return 0
    d, h, dt = cfg.embed_dim, cfg.drift_hidden, cfg.time_embed_dim
    n = cfg.bridge_states  # [mu, sigma] | [x] per side
    in_dim, out_dim = 2 * n * d + dt, n * d
    drift = in_dim * h + (cfg.drift_layers - 2) * h * h + h * out_dim
    time_mlp = 2 * dt * dt
    return drift + time_mlp
