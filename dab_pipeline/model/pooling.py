"""X-Pool's text-conditioned frame pooling, the masked softmax it uses, and float32 blocks under autocast."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


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
