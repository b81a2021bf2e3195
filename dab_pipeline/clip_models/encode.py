"""Encoding frames and captions, optionally with the token states entering the last K blocks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np
import torch
from torch import Tensor, nn

from ..core.errors import ConfigError
from .bundle import ClipBundle, TextEncoding
from .text_tower import TextTower
from .tokenizer import is_bpe_tokenizer

if TYPE_CHECKING:
    from open_clip.model import CLIP
    from open_clip.transformer import VisionTransformer

# open_clip's classes are imported where a model of theirs is looked at: such a model was built by open_clip, which
# is imported already; a search's query encoder (a TextTower) never imports it (torchvision, timm: ~1.5 s of CPU)


def _check_blocks(k: Optional[int], layers: Optional[int], tower: str) -> None:
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, int) or k < 0 or (layers is not None and k > layers):
        raise ConfigError(f"trainable_blocks={k!r} is invalid for the {tower} tower; expected 0..{layers}")


def check_vision_blocks(bundle: ClipBundle, k: int) -> VisionTransformer:
    from open_clip.transformer import VisionTransformer

    v = bundle.model.visual
    _check_blocks(k, len(v.transformer.resblocks) if isinstance(v, VisionTransformer) else None, "vision")
    if not isinstance(v, VisionTransformer):
        raise ConfigError(f"trainable_blocks needs a ViT image tower; {bundle.model_name} uses {type(v).__name__}")
    if v.attn_pool is not None:
        raise ConfigError(f"{bundle.model_name}: attentional_pool is not supported with trainable_blocks")
    if v.pool_type not in ("tok", "avg"):
        raise ConfigError(
            f"{bundle.model_name}: vision pool_type={v.pool_type!r} is not supported with trainable_blocks "
            "(expected 'tok' or 'avg')"
        )
    if k == 0 and v.pool_type == "avg" and not v.final_ln_after_pool:
        # ln_post runs on every token before the mean, so no single pre-LN vector reproduces it.
        raise ConfigError(
            f"{bundle.model_name}: trainable_blocks=0 needs pool_type='tok' or final_ln_after_pool=True "
            "(avg pooling after ln_post); use trainable_blocks >= 1"
        )
    return v


def check_text_blocks(bundle: ClipBundle, k: int) -> CLIP:
    from open_clip.model import CLIP

    clip = bundle.model
    _check_blocks(k, len(clip.transformer.resblocks) if isinstance(clip, CLIP) else None, "text")
    if not isinstance(clip, CLIP):
        raise ConfigError(
            f"trainable_blocks needs open_clip's built-in text tower; {bundle.model_name} uses {type(clip).__name__}"
        )
    if clip.text_pool_type not in ("argmax", "eos"):
        raise ConfigError(
            f"{bundle.model_name}: text pool_type={clip.text_pool_type!r} is not supported with trainable_blocks "
            "(expected 'argmax' or 'eos')"
        )
    if k > 0 and clip.attn_mask is None:
        # Without the causal mask the EOT token sees the padding, so states cut at EOT are not enough.
        raise ConfigError(f"{bundle.model_name}: no_causal_mask=True is not supported with trainable_blocks > 0")
    return clip


def run_blocks(blocks: Any, x: Tensor, batch_first: bool, attn_mask: Optional[Tensor] = None) -> Tensor:
    """Run residual blocks on batch-first tokens (B, L, W), whatever layout they expect."""
    if not batch_first:
        x = x.transpose(0, 1).contiguous()  # (L, B, W)
    for blk in blocks:
        x = blk(x, attn_mask=attn_mask)
    if not batch_first:
        x = x.transpose(0, 1)  # (B, L, W)
    return x


def _vision_embed(v: VisionTransformer, images: Tensor) -> Tensor:
    # Same steps as VisionTransformer._embeds (private in open_clip), done here so we can stop early.
    x = v.conv1(images)  # (B, W, g, g)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)  # (B, g*g, W)
    cls = v.class_embedding.view(1, 1, -1).expand(x.shape[0], -1, -1).to(x.dtype)  # (B, 1, W)
    x = torch.cat([cls, x], dim=1) + v.positional_embedding.to(x.dtype)  # (B, L, W)
    x = v.patch_dropout(x)
    return v.ln_pre(x)


def pool_vision(x: Tensor, pool_type: str, final_ln_after_pool: bool, ln_post: nn.Module) -> Tensor:
    """(B, L, W) tokens after the last block -> (B, W) pooled and normalised, as open_clip does."""
    if final_ln_after_pool or pool_type == "tok":
        # LayerNorm acts per token, so for 'tok' normalising the class token alone is the same thing.
        pooled = x[:, 0] if pool_type == "tok" else x[:, 1:].mean(dim=1)
        return ln_post(pooled)
    return ln_post(x)[:, 1:].mean(dim=1)


def project(x: Tensor, proj: Union[None, nn.Parameter, nn.Module]) -> Tensor:
    if proj is None:
        return x
    if isinstance(proj, nn.Module):
        return proj(x)
    return x @ proj


@torch.no_grad()
def encode_images(
    bundle: ClipBundle, images: Tensor, trainable_blocks: Optional[int] = None
) -> tuple[Tensor, Optional[Tensor]]:
    """Encode preprocessed frames (B, 3, H, W) -> (features (B, D), states).

    Features are projected but not L2-normalised (DAB's LayerNorm needs the norms)
    and equal ``model.encode_image(images)``.  ``states`` is None for
    ``trainable_blocks=None``; for K=0 the pooled token before ``ln_post`` (B, W);
    for K>0 the tokens entering the last K blocks (B, L, W).  Returned in float32.
    """
    images = images.to(bundle.device, dtype=bundle.input_dtype)  # (B, 3, H, W)
    with bundle.autocast():
        if trainable_blocks is None:
            return bundle.model.encode_image(images).float(), None
        k = trainable_blocks
        v = check_vision_blocks(bundle, k)
        batch_first = getattr(v.transformer, "batch_first", False)
        blocks = list(v.transformer.resblocks)
        x = _vision_embed(v, images)  # (B, L, W)
        x = run_blocks(blocks[: len(blocks) - k], x, batch_first)
        states = x  # (B, L, W) entering the last K blocks
        x = run_blocks(blocks[len(blocks) - k :], x, batch_first)
        if k == 0:
            states = x[:, 0] if v.pool_type == "tok" else x[:, 1:].mean(dim=1)  # (B, W) before ln_post
        pooled = pool_vision(x, v.pool_type, v.final_ln_after_pool, v.ln_post)  # (B, W)
        feats = project(pooled, v.proj)  # (B, D)
    return feats.float(), states.float()


def _eot_index(clip: nn.Module, tokens: Tensor) -> Tensor:
    """Index of the pooled (EOT) token of each caption, as open_clip's text pooling picks it."""
    if getattr(clip, "text_pool_type", "argmax") == "eos":
        return (tokens == clip.text_eos_id).int().argmax(dim=-1)
    return tokens.argmax(dim=-1)  # EOT has the largest id in CLIP's vocabulary


def tokenize_lengths(bundle: ClipBundle, texts: list[str]) -> np.ndarray:
    """Tokens per caption up to and including EOT (M,), so stores can be preallocated."""
    tokens = bundle.tokenizer(list(texts))  # (M, ctx)
    return (_eot_index(bundle.model, tokens) + 1).cpu().numpy().astype(np.int64)


def token_counts(bundle: ClipBundle, texts: list[str]) -> Optional[np.ndarray]:
    """Tokens per caption before the context cuts it, start and end token included (M,), or None when the
    tokenizer cannot say (not open_clip's BPE tokenizer, or one with a reduction strategy).

    open_clip's tokenizer keeps the start token, the first ``context_length - 2`` tokens and the end token of a
    longer caption and drops the rest silently: a count above ``bundle.context_length`` is a cut caption.
    """
    tok = bundle.tokenizer
    if not is_bpe_tokenizer(tok) or getattr(tok, "reduction_fn", None) is not None:
        return None
    return np.array([len(tok.encode(t)) + 2 for t in texts], dtype=np.int64)


@torch.no_grad()
def encode_texts(bundle: ClipBundle, texts: list[str], trainable_blocks: Optional[int] = None) -> TextEncoding:
    """Encode captions -> :class:`TextEncoding`; features equal ``model.encode_text(tokenizer(texts))``.

    The text mask is causal, so only tokens up to and including EOT affect the
    feature: for K>0 ``states`` is a list with each caption's first ``T_i`` token
    states entering the last K blocks, (T_i, W); for K=0 it is the EOT token after
    the last block, before ``ln_final`` (M, W).  Returned in float32.
    """
    clip = bundle.model
    tokens = bundle.tokenizer(list(texts)).to(bundle.device)  # (M, ctx)
    eot = _eot_index(clip, tokens)  # (M,)
    lengths = (eot + 1).cpu()
    with bundle.autocast():
        if trainable_blocks is None:
            feats = clip.encode_text(tokens).float()
            return TextEncoding(features=feats, states=None, lengths=lengths, tokens=tokens.cpu())
        k = trainable_blocks
        check_text_blocks(bundle, k)
        cast_dtype = clip.transformer.get_cast_dtype()
        x = clip.token_embedding(tokens).to(cast_dtype)  # (M, ctx, W)
        x = x + clip.positional_embedding.to(cast_dtype)
        batch_first = getattr(clip.transformer, "batch_first", False)
        blocks = list(clip.transformer.resblocks)
        x = run_blocks(blocks[: len(blocks) - k], x, batch_first, clip.attn_mask)
        entering = x  # (M, ctx, W)
        x = run_blocks(blocks[len(blocks) - k :], x, batch_first, clip.attn_mask)
        rows = torch.arange(x.shape[0], device=x.device)
        last = x[rows, eot]  # (M, W) EOT token before ln_final
        feats = project(clip.ln_final(last), clip.text_projection).float()  # (M, D)
    if k == 0:
        states: Union[Tensor, list[Tensor]] = last.float()
    else:
        states = [entering[i, : int(n)].float().clone() for i, n in enumerate(lengths)]  # each (T_i, W)
    return TextEncoding(features=feats, states=states, lengths=lengths, tokens=tokens.cpu())


def pad_text_states(items: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Ragged caption states [(T_i, W)] -> zero-padded (B, T_max, W) and lengths (B,) int64.

    The padding sits after EOT, which the causal mask keeps out of every token that matters.
    """
    if not items:
        raise ConfigError("pad_text_states needs at least one caption state")
    items = [torch.as_tensor(t) for t in items]
    width = items[0].shape[-1]
    lengths = torch.tensor([t.shape[0] for t in items], dtype=torch.int64)  # (B,)
    out = items[0].new_zeros((len(items), int(lengths.max()), width))  # (B, T_max, W)
    for i, t in enumerate(items):
        out[i, : t.shape[0]] = t
    return out, lengths


PACK_TOKENS = 1024  # tokens a packed sequence of queries holds at most (its attention mask is N x N)


@torch.no_grad()
def encode_queries_short(bundle: ClipBundle, texts: list[str]) -> Tensor:
    """:func:`encode_texts`' features (M, D) float32, computed on the tokens up to each query's EOT only.

    The text mask is causal and the feature is the EOT token's, so the padding after it changes nothing:
    a search query of 8 tokens needs 9 of the 77 positions (ViT-B/32's text tower on 2 cores: 45 ms for
    the full context).  Several queries are packed into one sequence, each attending only to its own tokens
    (a block-diagonal causal mask, positions restarting at each query), so that a batch's products cost the sum of
    its queries' lengths, not the count times the longest (a server's batch of captions of 7 to 60 tokens); the
    attention's masked N x N scores grow with the square of a pack, which ``PACK_TOKENS`` bounds.
    Falls back to the full context for towers without a causal mask or an EOT pool.
    """
    clip = bundle.model
    tokens = bundle.tokenizer(list(texts)).to(bundle.device)  # (M, ctx)
    mask = getattr(clip, "attn_mask", None)
    pool = getattr(clip, "text_pool_type", "argmax")
    if not _has_clip_text_path(clip) or mask is None or pool not in ("argmax", "eos"):
        return encode_texts(bundle, texts).features
    eot = _eot_index(clip, tokens)  # (M,)
    out, group, size = [], [], 0
    for i, n in enumerate((eot + 1).tolist()):  # packs of up to PACK_TOKENS tokens: the mask is N x N
        if group and size + n > PACK_TOKENS:
            out.append(_encode_packed(bundle, tokens[group], eot[group], mask))
            group, size = [], 0
        group.append(i)
        size += n
    out.append(_encode_packed(bundle, tokens[group], eot[group], mask))
    return torch.cat(out)  # (M, D)


def _has_clip_text_path(model: nn.Module) -> bool:
    """Whether ``model`` is dab's TextTower or open_clip's CLIP (one that open_clip built: open_clip is imported)."""
    if isinstance(model, TextTower):
        return True
    from open_clip.model import CLIP

    return isinstance(model, CLIP)


def _encode_packed(bundle: ClipBundle, tokens: Tensor, eot: Tensor, mask: Tensor) -> Tensor:
    """Captions tokens (M, ctx) with their EOT indices (M,) as one packed sequence -> features (M, D) float32."""
    clip = bundle.model
    lengths = eot + 1  # (M,) tokens up to and including EOT
    seg = torch.repeat_interleave(torch.arange(len(tokens), device=tokens.device), lengths)  # (N,) each token's query
    starts = torch.cumsum(lengths, 0) - lengths  # (M,) where each query starts in the packed sequence
    pos = torch.arange(len(seg), device=tokens.device) - starts[seg]  # (N,) positions restart at each query
    with bundle.autocast():
        cast_dtype = clip.transformer.get_cast_dtype()
        x = clip.token_embedding(tokens[seg, pos][None]).to(cast_dtype)  # (1, N, W)
        x = x + clip.positional_embedding[pos].to(cast_dtype)
        # each token sees the earlier tokens of its own query: block-diagonal and causal, as mask[:n, :n] per query
        own = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])  # (N, N)
        packed_mask = torch.zeros(own.shape, dtype=mask.dtype, device=mask.device).masked_fill_(~own, float("-inf"))
        x = run_blocks(
            list(clip.transformer.resblocks), x, getattr(clip.transformer, "batch_first", False), packed_mask
        )
        last = x[0, starts + eot]  # (M, W) the EOT tokens
        return project(clip.ln_final(last), clip.text_projection).float()  # (M, D)
