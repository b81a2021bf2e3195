"""The trainable tails of both towers (the last K blocks, final LayerNorm, projection)."""

from __future__ import annotations

import copy
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from ..core.errors import ConfigError
from .bundle import ClipBundle
from .encode import check_text_blocks, check_vision_blocks, pool_vision, project, run_blocks


def _fresh_copy(module: Any) -> Any:
    """A float32, trainable deep copy (the loaded model may be bf16/fp16 and frozen)."""
    if module is None:
        return None
    m = copy.deepcopy(module)
    if isinstance(m, nn.Parameter):
        return nn.Parameter(m.detach().float().clone(), requires_grad=True)
    m.float()
    m.requires_grad_(True)
    return m


class VisionHead(nn.Module):
    """The last K vision blocks + ``ln_post`` + projection, trainable, fed with stored states."""

    def __init__(
        self,
        blocks: list[nn.Module],
        ln_post: nn.Module,
        proj: Optional[nn.Parameter],
        pool_type: str = "tok",
        final_ln_after_pool: bool = False,
        batch_first: bool = True,
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.ln_post = ln_post
        self.proj = proj
        self.pool_type = pool_type
        self.final_ln_after_pool = final_ln_after_pool
        self.batch_first = batch_first

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @classmethod
    def from_bundle(cls, bundle: ClipBundle, trainable_blocks: int) -> "VisionHead":
        v = check_vision_blocks(bundle, trainable_blocks)
        resblocks = list(v.transformer.resblocks)
        chosen = resblocks[len(resblocks) - trainable_blocks :] if trainable_blocks else []
        head = cls(
            blocks=[_fresh_copy(b) for b in chosen],
            ln_post=_fresh_copy(v.ln_post),
            proj=_fresh_copy(v.proj),
            pool_type=v.pool_type,
            final_ln_after_pool=bool(v.final_ln_after_pool),
            batch_first=getattr(v.transformer, "batch_first", False),
        )
        return head.to(bundle.device)

    def forward(self, states: Tensor) -> Tensor:
        """states (B, W) for K=0 or (B, L, W) for K>0 -> features (B, D)."""
        dtype = self.ln_post.weight.dtype
        if self.num_blocks == 0:
            if states.dim() != 2:
                raise ConfigError(f"VisionHead with 0 blocks expects states (B, W), got {tuple(states.shape)}")
            return project(self.ln_post(states.to(dtype)), self.proj)  # (B, D)
        if states.dim() != 3:
            raise ConfigError(
                f"VisionHead with {self.num_blocks} blocks expects states (B, L, W), got {tuple(states.shape)}"
            )
        x = run_blocks(self.blocks, states.to(dtype), self.batch_first)  # (B, L, W)
        pooled = pool_vision(x, self.pool_type, self.final_ln_after_pool, self.ln_post)  # (B, W)
        return project(pooled, self.proj)  # (B, D)


class TextHead(nn.Module):
    """The last K text blocks + ``ln_final`` + text projection, trainable, fed with stored states."""

    def __init__(
        self,
        blocks: list[nn.Module],
        ln_final: nn.Module,
        proj: Union[None, nn.Parameter, nn.Module],
        attn_mask: Optional[Tensor],
        batch_first: bool = True,
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.ln_final = ln_final
        self.text_projection = proj
        self.batch_first = batch_first
        self.register_buffer("attn_mask", attn_mask, persistent=False)  # (ctx, ctx) causal

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @classmethod
    def from_bundle(cls, bundle: ClipBundle, trainable_blocks: int) -> "TextHead":
        clip = check_text_blocks(bundle, trainable_blocks)
        resblocks = list(clip.transformer.resblocks)
        chosen = resblocks[len(resblocks) - trainable_blocks :] if trainable_blocks else []
        mask = clip.attn_mask.detach().float().clone() if clip.attn_mask is not None else None
        head = cls(
            blocks=[_fresh_copy(b) for b in chosen],
            ln_final=_fresh_copy(clip.ln_final),
            proj=_fresh_copy(clip.text_projection),
            attn_mask=mask,
            batch_first=getattr(clip.transformer, "batch_first", False),
        )
        return head.to(bundle.device)

    def forward(self, states: Tensor, lengths: Optional[Tensor] = None) -> Tensor:
        """states (B, W) for K=0, or padded (B, T, W) with lengths (B,) (EOT index + 1) -> (B, D)."""
        dtype = self.ln_final.weight.dtype
        if self.num_blocks == 0 and states.dim() == 2:
            return project(self.ln_final(states.to(dtype)), self.text_projection)  # (B, D)
        if states.dim() != 3 or lengths is None:
            raise ConfigError(
                f"TextHead with {self.num_blocks} blocks expects padded states (B, T, W) and lengths (B,), "
                f"got {tuple(states.shape)} and lengths={'None' if lengths is None else tuple(lengths.shape)}"
            )
        T = states.shape[1]
        mask = self.attn_mask[:T, :T] if self.attn_mask is not None else None  # (T, T) causal
        x = run_blocks(self.blocks, states.to(dtype), self.batch_first, mask)  # (B, T, W)
        rows = torch.arange(x.shape[0], device=x.device)
        eot = x[rows, lengths.to(x.device).long() - 1]  # (B, W)
        return project(self.ln_final(eot), self.text_projection)  # (B, D)
