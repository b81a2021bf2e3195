"""Contrastive losses over a (B, B) cost matrix whose diagonal holds the matched pairs.

Rows are texts and columns videos throughout. Every loss takes what it needs, the costs and
a temperature (logits = -cost / temperature), as open_clip's ``ClipLoss`` takes features and a
scale, and knows nothing of the model; :func:`loss_of` picks the one a variant trains with
from its spec (:mod:`dab_pipeline.core.variants`), and the model gives the temperature
(:meth:`~dab_pipeline.model.DABModel.temperature`). :func:`distill_loss` is `dab distill`'s: a student's costs
and bridged states against its teacher's, at the teacher's temperature.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.registry import Registry
from ..core.variants import VariantSpec

__all__ = ["LossFn", "LOSSES", "pac_loss", "infonce_loss", "loss_of", "contrastive_loss", "distill_loss"]

LossFn = Callable[[Tensor, Tensor], Tensor]  # (cost (B, B), temperature) -> loss


def _check_square(m: Tensor, what: str) -> None:
    if m.dim() != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"{what} must be a square (B, B) matrix, got shape {tuple(m.shape)}")


def _directions(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Text->video (softmax over videos per text) and video->text cross-entropies of the diagonal."""
    t2v = -torch.diagonal(F.log_softmax(logits, dim=1)).mean()
    v2t = -torch.diagonal(F.log_softmax(logits, dim=0)).mean()
    return t2v, v2t


def pac_loss(cost: Tensor, tau: Tensor | float) -> Tensor:
    """Probabilistic Alignment Contrastive loss, exactly the paper's formula (§3.4).

    ``L = -1/B sum_i [log softmax_j(-C_ij/tau)[i] + log softmax_j(-C_ji/tau)[i]]``:
    text->video and video->text InfoNCE over logits ``-C/tau``, *summed* and
    averaged over the batch.  The paper writes no 1/2, so this is twice the value
    of an X-Pool/CLIP-style average of the two directions (same minimiser, the
    gradient is twice as large at a given learning rate).
    """
    _check_square(cost, "cost")
    t2v, v2t = _directions(-cost / tau)  # (B, B) logits
    return t2v + v2t


def infonce_loss(cost: Tensor, temperature: Tensor | float) -> Tensor:
    """X-Pool's symmetric InfoNCE (its ``CLIPLoss``) on cosine costs: logits ``-cost / temperature``, the two
    directions *averaged*, as X-Pool does. With ``cost = -cos`` and ``temperature = 1 / logit_scale`` the logits
    are CLIP's ``logit_scale * cos``."""
    _check_square(cost, "cost")
    t2v, v2t = _directions(-cost / temperature)  # (B, B) logits
    return 0.5 * (t2v + v2t)


LOSSES: Registry[LossFn] = Registry("loss")
LOSSES.register("gaussian", pac_loss)  # prob, dab: PAC over the distributional cost
LOSSES.register(
    "cosine", infonce_loss
)  # xpool, bridge: X-Pool's InfoNCE, so bridge differs from xpool by the bridge alone


def loss_of(spec: VariantSpec) -> LossFn:
    """The loss a variant trains with (by its cost family)."""
    return LOSSES.get(spec.cost_family)


def contrastive_loss(loss: LossFn, cost: Tensor, temperature: Tensor) -> Tensor:
    """``loss(cost, temperature)`` in float32, also under autocast: a softmax over B^2 logits is never bf16."""
    with torch.autocast(device_type=cost.device.type, enabled=False):
        return loss(cost.float(), temperature.float())


def distill_loss(
    student_cost: Tensor,
    student_state: list[Tensor],
    teacher_cost: Tensor,
    teacher_state: list[Tensor],
    temperature: Tensor,
    state_weight: float,
    rank_weight: float,
) -> tuple[Tensor, dict[str, float]]:
    """`dab distill`'s loss: state matching + row/column ranking KL; costs (B, B), states [(B, B, D), ...].

    ``state``: the mean squared error of each bridged state (mu and logvar, or the point bridge's x) of the
    student against the teacher's; ``rank``: ``KL(softmax(-C_teacher / t) || softmax(-C_student / t))`` over each
    row and each column, averaged. Returns the weighted sum and both parts as floats.
    """
    state = sum(F.mse_loss(s, t) for s, t in zip(student_state, teacher_state)) / len(student_state)
    t_logits, s_logits = -teacher_cost / temperature, -student_cost / temperature  # (B, B)
    rank = 0.5 * (
        F.kl_div(F.log_softmax(s_logits, 1), F.log_softmax(t_logits, 1), log_target=True, reduction="batchmean")
        + F.kl_div(F.log_softmax(s_logits, 0).T, F.log_softmax(t_logits, 0).T, log_target=True, reduction="batchmean")
    )
    loss = state_weight * state + rank_weight * rank
    return loss, {"state": float(state.detach()), "rank": float(rank.detach())}
