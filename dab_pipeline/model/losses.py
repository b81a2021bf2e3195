"""Contrastive losses over a (B, B) batch matrix whose diagonal holds the matched pairs.

Rows are texts and columns videos throughout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:  # imported for type hints only; dab.py imports this module
    from .dab import DABModel, ModelOutput

__all__ = ["pac_loss", "clip_infonce_loss", "model_loss"]


def _check_square(m: Tensor, what: str) -> None:
    if m.dim() != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"{what} must be a square (B, B) matrix, got shape {tuple(m.shape)}")


def pac_loss(cost: Tensor, tau: Tensor | float) -> Tensor:
    """Probabilistic Alignment Contrastive loss, exactly the paper's formula (§3.4).

    ``L = -1/B sum_i [log softmax_j(-C_ij/tau)[i] + log softmax_j(-C_ji/tau)[i]]``:
    text->video and video->text InfoNCE over logits ``-C/tau``, *summed* and
    averaged over the batch.  The paper writes no 1/2, so this is twice the value
    of an X-Pool/CLIP-style average of the two directions (same minimiser, the
    gradient is twice as large at a given learning rate).
    """
    _check_square(cost, "cost")
    logits = -cost / tau  # (B, B)
    t2v = -torch.diagonal(F.log_softmax(logits, dim=1)).mean()  # softmax over videos per text
    v2t = -torch.diagonal(F.log_softmax(logits, dim=0)).mean()  # softmax over texts per video
    return t2v + v2t


def clip_infonce_loss(sim: Tensor, log_logit_scale: Tensor | float) -> Tensor:
    """X-Pool's symmetric InfoNCE on cosine similarities (its ``CLIPLoss``).

    ``log_logit_scale`` is the log of the multiplier (CLIP stores it that way);
    the two directions are *averaged*, as X-Pool does.
    """
    _check_square(sim, "similarity")
    scale = torch.exp(torch.as_tensor(log_logit_scale, dtype=sim.dtype, device=sim.device))
    logits = sim * scale  # (B, B)
    t2v = -torch.diagonal(F.log_softmax(logits, dim=1)).mean()
    v2t = -torch.diagonal(F.log_softmax(logits, dim=0)).mean()
    return 0.5 * (t2v + v2t)


def model_loss(model: "DABModel", out: "ModelOutput") -> Tensor:
    """The training loss of ``model``'s variant for a forward output.

    Cosine variants (``xpool``, ``bridge``) keep X-Pool's loss and learnable logit
    scale, so the ``bridge`` ablation differs from the baseline only by the bridge;
    distributional variants (``prob``, ``dab``) use PAC over ``-C / tau``.
    """
    with torch.autocast(device_type=out.cost.device.type, enabled=False):  # the loss in float32 under amp
        cost = out.cost.float()
        if not model.cfg.probabilistic:
            # cost = -cos, so the similarity is its negation
            return clip_infonce_loss(-cost, model.log_logit_scale.float())
        return pac_loss(cost, model.tau().float())
