"""What a trained bridge does per pair: its shift on a grid of pairs, and the constant-bridge control.

The bridge moves the text (Gaussian, or point) toward each video. If that move is nearly
the same for every pair, the bridge is a constant shift: a re-centring of the text and,
for the Gaussian bridge, a temperature of the KL. :func:`probe_bridge` measures the shift
on a grid of texts x videos and splits its sum of squares into the part the mean shift
explains and the parts that depend on the text, the video and the pair
(:func:`~dab_pipeline.metrics.shift_decomposition`); :func:`constant_bridge` builds the
control that keeps every other weight and replaces the bridge by that mean shift, so
its retrieval can be put beside the real bridge's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..metrics import shift_decomposition
from ..model import DABModel

PROBE_SIDE = 128  # texts and videos of the probe grid: every pair of a split up to 128 x 128


@dataclass
class BridgeProbe:
    """The bridge's shift on a grid of pairs, decomposed, and its mean (the constant control's shift)."""

    texts: np.ndarray  # (T,) indices of the probed texts
    videos: np.ndarray  # (V,) indices of the probed videos
    shares: dict[str, dict[str, float]]  # "mu" (the point bridge: x) and "logvar" -> shift_decomposition
    mean_shift_mu: np.ndarray  # (D,)
    mean_shift_logvar: Optional[np.ndarray]  # (D,); None for the point bridge

    @property
    def pair_dependent(self) -> dict[str, float]:
        return {k: v["pair_dependent"] for k, v in self.shares.items()}


def probe_grid(n_texts: int, n_videos: int, side: int = PROBE_SIDE, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sorted seeded samples of at most ``side`` texts and ``side`` videos (all of them when fewer)."""
    rng = np.random.default_rng(seed)
    pick = lambda n: np.arange(n) if n <= side else np.sort(rng.choice(n, side, replace=False))
    return pick(n_texts), pick(n_videos)


def bridge_shifts(
    model: DABModel, text: Tensor, frames: Tensor, mask: Tensor, chunk: int = 32
) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """The bridge's shift for every pair of these texts (T, D) and videos (V, F, D): (T, V, D) for mu (or x)
    and for logvar (None for the point bridge). Eval mode, no gradients, ``chunk`` texts at a time."""
    if model.bridge is None:
        raise ConfigError(f"a {model.cfg.variant!r} model has no bridge to probe")
    was_training = model.training
    model.eval()
    mus, lvs = [], []
    try:
        with torch.no_grad():
            vs = model.encode_video(frames, mask)
            for q0 in range(0, text.shape[0], chunk):
                ts = model.encode_text(text[q0 : q0 + chunk])
                terms = model.pair_terms(ts, vs, grid=True)
                start = ts.mu if ts.mu is not None else ts.point  # (t, D)
                assert start is not None and terms.bridged_mu is not None
                mus.append((terms.bridged_mu.float() - start.float()[:, None]).cpu().numpy())  # (t, V, D)
                if ts.logvar is not None and terms.bridged_logvar is not None:
                    lvs.append((terms.bridged_logvar.float() - ts.logvar.float()[:, None]).cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(mus), (np.concatenate(lvs) if lvs else None)


def probe_bridge(
    model: DABModel, text: Tensor, frames: Tensor, mask: Tensor, side: int = PROBE_SIDE, seed: int = 0
) -> BridgeProbe:
    """Probe the bridge on a seeded grid of at most ``side`` x ``side`` of these texts and videos."""
    t_idx, v_idx = probe_grid(text.shape[0], frames.shape[0], side, seed)
    it, iv = torch.as_tensor(t_idx), torch.as_tensor(v_idx)
    mu, lv = bridge_shifts(model, text[it], frames[iv], mask[iv])
    shares = {"mu": shift_decomposition(mu)}
    if lv is not None:
        shares["logvar"] = shift_decomposition(lv)
    return BridgeProbe(
        texts=t_idx,
        videos=v_idx,
        shares=shares,
        mean_shift_mu=mu.mean(axis=(0, 1)),
        mean_shift_logvar=None if lv is None else lv.mean(axis=(0, 1)),
    )


def constant_bridge(model: DABModel, shift_mu: np.ndarray, shift_logvar: Optional[np.ndarray]) -> DABModel:
    """The same model with its bridge replaced by a constant shift (``drift="constant"``), eval mode.

    Every other weight is copied, so the control differs from the model by the bridge alone.
    """
    if model.bridge is None:
        raise ConfigError(f"a {model.cfg.variant!r} model has no bridge to replace")
    control = DABModel(dataclasses.replace(model.cfg, drift="constant"))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("bridge.")}
    missing, unexpected = control.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("bridge.") for k in missing), (missing, unexpected)
    shift = control.bridge
    assert shift is not None
    if not shift.point and shift_logvar is None:
        raise ConfigError("a Gaussian bridge's control needs a log-variance shift")
    shift.set_shift(torch.as_tensor(shift_mu), None if shift_logvar is None else torch.as_tensor(shift_logvar))
    return control.to(next(model.parameters()).device).eval()
