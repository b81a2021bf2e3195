"""DABModel and its ablation variants, with the text / video / pair states the scorer reuses."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import ConfigError
from .bridge import ConstantShift, DistributionBridge
from .config import ModelConfig, resolve_tau
from .costs import COSTS, kl_diag_gaussian, neg_cosine
from .covariance import kl_lowrank_gaussian, mixture_moments, soft_min_kl
from .pooling import TextConditionedPooling, float32_math
from .probabilistic import MixtureHead, ProbabilisticEncoder, TokenUncertainty


@dataclass
class TextState:
    """Everything that depends only on the texts (Q of them)."""

    feat: Tensor  # (Q, D) raw CLIP text feature
    q: Tensor  # (Q, H, Dh) pooling queries
    mu: Optional[Tensor] = None  # (Q, D) text Gaussian (prob/dab)
    logvar: Optional[Tensor] = None  # (Q, D)
    point: Optional[Tensor] = None  # (Q, D) L2-normalised text (point bridge)
    factor: Optional[Tensor] = None  # (Q, D, R) text U of Sigma = diag + U U^T (covariance lowrank:R)
    # covariance mixture:K: the components (mu and logvar above are then the mixture's moments)
    mix_mu: Optional[Tensor] = None  # (Q, K, D)
    mix_logvar: Optional[Tensor] = None  # (Q, K, D)
    mix_logits: Optional[Tensor] = None  # (Q, K) component weights before the softmax

    def __len__(self) -> int:
        return self.feat.shape[0]

    def select(self, idx: Tensor | slice) -> "TextState":
        fields = (self.feat, self.q, self.mu, self.logvar, self.point, self.factor)
        return TextState(
            *(None if t is None else t[idx] for t in (*fields, self.mix_mu, self.mix_logvar, self.mix_logits))
        )


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
        return VideoState(
            self.k[idx], self.v[idx], self.mask[idx], None if self.tok_logvar is None else self.tok_logvar[idx]
        )


@dataclass
class PairTerms:
    """Per-pair results, shaped (Q, V, ...) on a grid or (P, ...) for aligned pairs."""

    cost: Tensor  # (Q, V) | (P,)
    video_mu: Optional[Tensor] = None  # (Q, V, D) | (P, D)
    video_logvar: Optional[Tensor] = None
    bridged_mu: Optional[Tensor] = None  # text after the bridge (before it for "prob")
    bridged_logvar: Optional[Tensor] = None
    video_factor: Optional[Tensor] = None  # (Q, V, D, R) | (P, D, R): covariance lowrank:R
    text_factor: Optional[Tensor] = None  # (Q, 1, D, R) | (P, D, R), the text's U (the bridge leaves it)
    component: Optional[Tensor] = None  # (Q, V) | (P,) long: the text component that matches best (mixture:K)


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


class DABModel(nn.Module):
    """The DAB model and its ablation variants; only the modules a variant uses are built."""

    def __init__(self, cfg: ModelConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg if cfg is not None else ModelConfig()
        d = cfg.embed_dim
        self.pool = TextConditionedPooling(d, cfg.num_heads, cfg.dropout)
        self.prob: Optional[ProbabilisticEncoder] = None
        self.mixture: Optional[MixtureHead] = None
        self.token_unc: Optional[TokenUncertainty] = None
        self.bridge: Optional[DistributionBridge | ConstantShift] = None
        if cfg.gaussian:
            cov = cfg.covariance_spec
            self.prob = ProbabilisticEncoder(d, cfg.logvar_init, cfg.logvar_min, cfg.logvar_max, cov.rank)
            if cov.kind == "mixture":  # built only for mixture runs, so every other model's random draws are unchanged
                self.mixture = MixtureHead(d, cov.components, cfg.logvar_init, cfg.logvar_min, cfg.logvar_max)
            self.token_unc = TokenUncertainty(d, cfg.logvar_init)
            if cfg.variance == "fixed":
                self._fix_variances()
            tau = math.log(resolve_tau(cfg))
            if cfg.learn_tau:
                self.log_tau = nn.Parameter(torch.tensor(tau))
            else:
                self.register_buffer("log_tau", torch.tensor(tau))
        else:
            self.log_logit_scale = nn.Parameter(torch.tensor(math.log(cfg.logit_scale_init)))
        if cfg.uses_bridge:
            kind = ConstantShift if cfg.drift == "constant" else DistributionBridge
            self.bridge = kind(cfg, point=cfg.bridge_states == 1)
        self.cost_fn = COSTS.get(cfg.cost)

    def _fix_variances(self) -> None:
        """``variance="fixed"``: every text and video log-variance is logvar_init, and nothing trains it.

        The log-variance head and the token branch's output layers are zeroed to their
        biases (logvar_init, and logvar_init / 2 twice for the fused video term) and
        frozen with the token branch's attention, so the scoring engines, which read
        these weights, compute the same constant.
        """
        assert self.prob is not None and self.token_unc is not None
        lv, tok, init = self.prob.logvar_head, self.token_unc, self.cfg.logvar_init
        with torch.no_grad():
            lv.weight.zero_()
            lv.bias.fill_(init)
            for lin in (tok.w1, tok.w2):
                lin.weight.zero_()
                lin.bias.fill_(init / 2.0)
        for p in (*lv.parameters(), *tok.parameters()):
            p.requires_grad_(False)

    # ---- temperatures

    def tau(self) -> Tensor:
        """PAC temperature (prob/dab)."""
        if not self.cfg.gaussian:
            raise ConfigError(f"variant {self.cfg.variant!r} has no PAC temperature (it uses logit_scale)")
        return torch.exp(self.log_tau)

    def temperature(self) -> Tensor:
        """The temperature of the training loss's logits (``-cost / temperature``): PAC's tau (prob, dab), or the
        inverse of the learned logit scale (xpool, bridge: CLIP's ``logit_scale * cos``)."""
        return self.tau() if self.cfg.gaussian else torch.exp(-self.log_logit_scale)

    # ---- encoders

    def encode_text(self, text: Tensor) -> TextState:
        """text (Q, D) -> :class:`TextState`."""
        self._check_dim(text, "text")
        state = TextState(feat=text, q=self.pool.query(text))
        if self.prob is not None:
            state.mu, state.logvar, state.factor = self.prob.full(text)  # (Q, D) each; U (Q, D, R) or None
            if self.mixture is not None:
                comps = self.mixture(self.prob.hidden(text), state.mu, state.logvar)  # (Q, K, D) x 2, (Q, K)
                state.mix_mu, state.mix_logvar, state.mix_logits = comps
                state.mu, state.logvar = mixture_moments(*comps)  # (Q, D) each: what the diagnostics read
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
        if not self.cfg.gaussian:
            return self._cosine_terms(ts, v_c, t_)
        assert self.prob is not None and self.token_unc is not None
        assert ts.mu is not None and ts.logvar is not None and vs.tok_logvar is not None
        mu_v, lv_base, u_v = self.prob.full(v_c)  # (Q, V, D) each; U (Q, V, D, R) or None
        lv_tok = v_(vs.tok_logvar) + self.token_unc.pair_term(v_c)  # (Q, V, D)
        lv_v = (0.5 * (lv_base + lv_tok)).clamp(self.cfg.logvar_min, self.cfg.logvar_max)  # (Q, V, D)
        if ts.mix_mu is not None:
            return self._mixture_terms(mu_v, lv_v, ts, t_)
        mu_t, lv_t = t_(ts.mu), t_(ts.logvar)  # (Q, 1, D)
        if self.bridge is not None:
            # the bridge moves (mu, logvar) alone, as for diag; a low-rank text's U is carried unchanged
            mu_t, lv_t = self.bridge(mu_t, lv_t, mu_v, lv_v)  # (Q, V, D) each
        if u_v is not None:
            return self._lowrank_terms(mu_v, lv_v, u_v, mu_t, lv_t, t_(ts.factor))
        if self.bridge is None:
            # per-pair views (no copy) so callers can index pairs uniformly
            mu_t, lv_t = mu_t.expand_as(mu_v), lv_t.expand_as(lv_v)  # (Q, V, D)
        with float32_math(mu_v):  # a KL of D terms in bf16 loses several logits at tau 8 (issue 16)
            cost = self.cost_fn(mu_v.float(), lv_v.float(), mu_t.float(), lv_t.float())  # (Q, V): D(Q_v || P_hat_t)
        return PairTerms(cost=cost, video_mu=mu_v, video_logvar=lv_v, bridged_mu=mu_t, bridged_logvar=lv_t)

    def _lowrank_terms(self, mu_v: Tensor, lv_v: Tensor, u_v: Tensor, mu_t: Tensor, lv_t: Tensor, u_t) -> PairTerms:
        """``KL(Q_v || P_t)`` with ``Sigma = diag(e^logvar) + U U^T`` on both sides (covariance lowrank:R).

        ``prob``: the text side keeps its (Q, 1, ...) shape into the cost, so its Woodbury factors are computed
        once per text, not per pair (:func:`~dab_pipeline.model.covariance.kl_lowrank_gaussian`).  ``dab``:
        ``(mu_t, lv_t)`` are the bridged text's, one per pair, and ``u_t`` the text's own U (the bridge does
        not move it), so the factors are per pair.
        """
        assert u_t is not None, "a low-rank model's text state carries its factor"
        with float32_math(mu_v):
            cost = kl_lowrank_gaussian(
                mu_v.float(), lv_v.float(), u_v.float(), mu_t.float(), lv_t.float(), u_t.float()
            )  # (Q, V) | (P,)
        return PairTerms(
            cost=cost,
            video_mu=mu_v,
            video_logvar=lv_v,
            bridged_mu=mu_t.expand_as(mu_v),
            bridged_logvar=lv_t.expand_as(lv_v),
            video_factor=u_v,
            text_factor=u_t,
        )

    def _mixture_terms(self, mu_v: Tensor, lv_v: Tensor, ts: TextState, t_) -> PairTerms:
        """Variational ``KL(Q_v || sum_k pi_k P_tk)`` (Hershey and Olsen; covariance mixture:K): a soft minimum
        of the components' diagonal KLs (:func:`~dab_pipeline.model.covariance.kl_diag_to_mixture`).

        ``dab`` transports each component toward the video, K bridges per pair: the bridge is a map of one
        Gaussian, and bridging the mixture's moments instead would merge the modes the mixture is there to keep.
        The bridged (mu, logvar) reported are the bridged mixture's moments; ``component`` the best match.
        """
        assert ts.mix_mu is not None and ts.mix_logvar is not None and ts.mix_logits is not None
        mu_k, lv_k, logits = t_(ts.mix_mu), t_(ts.mix_logvar), t_(ts.mix_logits)  # (Q, 1, K, D) | (P, K, D)
        if self.bridge is not None:
            mu_k, lv_k = self.bridge(mu_k, lv_k, mu_v[..., None, :], lv_v[..., None, :])  # (Q, V, K, D) | (P, K, D)
        with float32_math(mu_v):
            q_mu, q_lv = mu_v.float()[..., None, :], lv_v.float()[..., None, :]  # (Q, V, 1, D) | (P, 1, D)
            kl_k = kl_diag_gaussian(q_mu, q_lv, mu_k.float(), lv_k.float())  # (Q, V, K) | (P, K)
            cost = soft_min_kl(kl_k, logits.float())  # (Q, V) | (P,)
        b_mu, b_lv = mixture_moments(mu_k, lv_k, logits)  # (Q, V | 1, D) | (P, D)
        return PairTerms(
            cost=cost,
            video_mu=mu_v,
            video_logvar=lv_v,
            bridged_mu=b_mu.expand_as(mu_v),
            bridged_logvar=b_lv.expand_as(lv_v),
            component=(torch.log_softmax(logits.float(), dim=-1) - kl_k).argmax(dim=-1),
        )

    def _cosine_terms(self, ts: TextState, v_c: Tensor, t_) -> PairTerms:
        """xpool: -cos(text, v_c); the point bridge: -cos(bridged unit text, v_c)."""
        if self.bridge is None:
            with float32_math(v_c):
                return PairTerms(cost=neg_cosine(t_(ts.feat).float(), v_c.float()))
        assert ts.point is not None
        x = self.bridge.forward_point(t_(ts.point), F.normalize(v_c, dim=-1))  # (Q, V, D) | (P, D)
        with float32_math(v_c):
            return PairTerms(cost=neg_cosine(x.float(), v_c.float()), video_mu=v_c, bridged_mu=x)

    def pair_costs(self, ts: TextState, vs: VideoState) -> Tensor:
        """Cost of every (text, video) pair, (Q, V); lower is better."""
        return self.pair_terms(ts, vs, grid=True).cost

    def pair_diagnostics(self, ts: TextState, vs: VideoState, gt: Optional[Tensor] = None) -> PairDiagnostics:
        """Mean sigma^2 over D of text, bridged text and video for the pairs (q, gt[q]).

        gt (Q,) indexes ``vs``; None pairs text i with video i.  Only those Q pairs
        are computed (aligned mode), never the grid.
        """
        if not self.cfg.gaussian:
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
