"""load_clip: choose the architecture and activation, build it, load and check the weights."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
from open_clip import pretrained as oc_pretrained
from open_clip.convert import convert_state_dict as oc_convert_state_dict
from open_clip.model import CLIP, convert_to_custom_text_state_dict, resize_pos_embed, resize_text_pos_embed
from open_clip.transform import PreprocessCfg, image_transform_v2
from open_clip.transformer import QuickGELU, VisionTransformer
from torch import Tensor, nn

from ..core.errors import ConfigError, UnknownNameError, WeightsError
from ..core.fsutil import sha256_file
from .bundle import DTYPES, OUR_MODELS, TINY_MODEL, ClipBundle, first_line, open_clip_with_our_models, quiet_open_clip
from .weight_files import builtin_weights, read_weights
from .weights import (
    default_tiny_weights,
    fetch_tag,
    looks_like_path,
    model_has_quickgelu,
    normalise_name,
    openai_hint,
    pretrained_tag_config,
    quickgelu_sibling,
)

open_clip = open_clip_with_our_models()  # dab's configs registered before a model is named


def _resolve_dtype(dtype: Union[str, torch.dtype], device: torch.device) -> str:
    if isinstance(dtype, torch.dtype):
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
        if dtype not in names:
            raise ConfigError(f"unsupported CLIP dtype {dtype}; expected one of {', '.join(DTYPES)}")
        dtype = names[dtype]
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    dtype = aliases.get(str(dtype), str(dtype))
    if dtype not in DTYPES:
        raise ConfigError(f"unknown CLIP dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if dtype in ("float16", "autocast-bf16") and device.type != "cuda":
        raise ConfigError(
            f"CLIP dtype {dtype!r} needs a CUDA device (got {device}); on CPU use 'bfloat16' or 'float32'"
        )
    return dtype


def _fit_state_dict(model: nn.Module, state: dict[str, Tensor], path: Path, name: str) -> None:
    """open_clip's load_checkpoint massaging, on a state dict we already hold, then a strict load."""
    state = oc_convert_state_dict(model, state)
    if "positional_embedding" in state and not hasattr(model, "positional_embedding"):
        state = convert_to_custom_text_state_dict(state)
    for key in ("logit_scale", "logit_bias"):
        own = getattr(model, key, None)
        if key in state and own is not None and own.ndim != state[key].ndim:
            state[key] = state[key].reshape(own.shape)
    if "logit_bias" not in state and getattr(model, "logit_bias", None) is not None:
        state["logit_bias"] = torch.zeros_like(model.logit_bias)
    try:
        resize_pos_embed(state, model)
        resize_text_pos_embed(state, model)
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches
        raise WeightsError(f"weights file {path} does not fit architecture {name}: {first_line(exc, 300)}") from None
    if result.missing_keys or result.unexpected_keys:
        missing = ", ".join(result.missing_keys[:4]) + (" ..." if len(result.missing_keys) > 4 else "")
        extra = ", ".join(result.unexpected_keys[:4]) + (" ..." if len(result.unexpected_keys) > 4 else "")
        raise WeightsError(
            f"weights file {path} does not fit architecture {name}: "
            f"{len(result.missing_keys)} missing keys [{missing}], "
            f"{len(result.unexpected_keys)} unexpected keys [{extra}]"
        )


def load_clip(
    model: str,
    pretrained: Optional[str],
    device: Union[str, torch.device] = "cpu",
    dtype: Union[str, torch.dtype] = "float32",
    *,
    quick_gelu: Optional[bool] = None,
    cache_dir: Optional[str] = None,
) -> ClipBundle:
    """Build an open_clip model with its weights, preprocessing and tokenizer.

    ``pretrained`` is an open_clip tag ("openai", "laion2b_s34b_b79k"...) looked up
    in open_clip's cache before any download, or a local weights file (torch state
    dict, open_clip checkpoint, safetensors, or OpenAI's TorchScript ``.pt``).
    ``None`` is only valid for dab's own models: ``dab-tiny`` (deterministic random
    weights, generated into the cache) and ``dab-world`` (pretrained on the procedural
    world, shipped in ``weights/`` and checked against its recorded sha256).

    OpenAI weights need QuickGELU; when the weights are OpenAI's and ``model`` is a
    GELU architecture, the ``-quickgelu`` variant is built instead and the switch is
    recorded in ``bundle.warnings``.  ``quick_gelu=True/False`` overrides detection.
    """
    name = normalise_name(model)
    device = torch.device(device)
    dtype_name = _resolve_dtype(dtype, device)
    src = _locate_weights(name, pretrained, cache_dir)
    sha = sha256_file(src.path)
    state, format_reason = read_weights(src.path)
    act = _choose_activation(name, src, sha, format_reason, quick_gelu)
    clip = _build(act.name, dtype_name, src.tag_cfg, act.force_quick)
    _fit_state_dict(clip, state, src.path, act.name)
    del state
    clip.to(device)
    clip.eval()
    clip.requires_grad_(False)
    return _bundle(clip, act, src, sha, dtype_name, device, requested=model)


@dataclass(frozen=True)
class _WeightsSource:
    """Where the weights of one load come from."""

    path: Path
    pretrained: Optional[str]  # recorded in the bundle: the tag, the file, or None for dab's own models
    tag_cfg: dict  # open_clip's config of a pretrained tag ({} for a file)


@dataclass
class _Activation:
    """The architecture to build: ``name`` (maybe its -quickgelu sibling), and why."""

    name: str
    force_quick: bool
    openai_reason: Optional[str]
    notes: list[str]


def _locate_weights(name: str, pretrained: Optional[str], cache_dir: Optional[str]) -> _WeightsSource:
    """The weights file of (name, pretrained): dab's own, a local file, or an open_clip tag (cache first)."""
    if pretrained is None or str(pretrained).strip() == "":
        if name not in OUR_MODELS:
            tags = ", ".join(oc_pretrained.list_pretrained_tags_by_model(name)) or "(none)"
            raise WeightsError(
                f"no weights given for CLIP model {name}; pass a pretrained tag ({tags}) or a local weights file"
            )
        path = default_tiny_weights() if name.startswith(TINY_MODEL) else builtin_weights(name)
        if path is None:
            raise WeightsError(f"no default weights for {name}; pass a local weights file")
        # The model's own weights: recorded as None, not as the cache path, which differs
        # between machines and cache folders (the sha256 identifies the bytes).
        return _WeightsSource(path, None, {})
    if os.path.exists(os.path.expanduser(str(pretrained))):
        path = Path(os.path.expanduser(str(pretrained))).absolute()
        if not path.is_file():
            raise WeightsError(f"weights path {path} is not a file (expected a .pt/.bin/.safetensors file)")
        return _WeightsSource(path, str(path), {})
    tag = str(pretrained)
    found_under, tag_cfg = pretrained_tag_config(name, tag)
    if not tag_cfg:
        if looks_like_path(tag):
            raise WeightsError(
                f"weights file {Path(tag).expanduser().absolute()} does not exist "
                f"(pass an existing file or an open_clip tag for {name})"
            )
        tags = ", ".join(oc_pretrained.list_pretrained_tags_by_model(name)) or "(none)"
        raise UnknownNameError(
            f"unknown pretrained tag {tag!r} for CLIP model {name} and no file of that name; "
            f"valid tags: {tags}; or pass a local weights file"
        )
    return _WeightsSource(fetch_tag(found_under, tag, tag_cfg, cache_dir), tag, tag_cfg)


def _choose_activation(
    name: str, src: _WeightsSource, sha: str, format_reason: Optional[str], quick_gelu: Optional[bool]
) -> _Activation:
    """OpenAI weights were trained with QuickGELU: build the architecture their activation needs."""
    notes: list[str] = []
    openai_reason: Optional[str] = None
    if src.tag_cfg:
        wants_quick = bool(src.tag_cfg.get("quick_gelu", False))
        if wants_quick and src.pretrained == "openai":
            openai_reason = "pretrained tag 'openai'"
        source = f"pretrained tag {src.pretrained!r}"
    else:
        openai_reason = format_reason or openai_hint(src.path, sha)
        wants_quick = openai_reason is not None or model_has_quickgelu(name)
        source = f"weights file {src.path} ({openai_reason})" if openai_reason else ""
    if quick_gelu is not None and quick_gelu != wants_quick:
        if openai_reason or src.tag_cfg:
            notes.append(
                f"quick_gelu={quick_gelu} was requested although {source or name} implies "
                f"quick_gelu={wants_quick}; features will differ from the original model"
            )
        wants_quick = quick_gelu
    force_quick = False
    if wants_quick != model_has_quickgelu(name):
        sibling = quickgelu_sibling(name, wants_quick)
        if wants_quick:
            why = f"{source} needs QuickGELU" if source else "quick_gelu=True was requested"
            if sibling:
                notes.append(f"{why}: building {sibling} instead of {name}")
                name = sibling
            else:
                notes.append(f"{why}: building {name} with quick_gelu=True")
                force_quick = True
        elif sibling:  # a -quickgelu name with weights that were trained with GELU
            why = f"{source} uses GELU" if source else "quick_gelu=False was requested"
            notes.append(f"{why}: building {sibling} instead of {name}")
            name = sibling
    return _Activation(name, force_quick, openai_reason, notes)


def _build(name: str, dtype_name: str, tag_cfg: dict, force_quick: bool) -> nn.Module:
    """The open_clip architecture, on CPU, without weights (they are loaded strictly afterwards)."""
    precision = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype_name, "fp32")
    pp_override = {k: tag_cfg[k] for k in ("mean", "std", "interpolation", "resize_mode") if k in tag_cfg}
    try:
        with quiet_open_clip():
            return open_clip.create_model(
                name,
                pretrained=None,
                precision=precision,
                device="cpu",
                force_quick_gelu=force_quick,
                force_preprocess_cfg=pp_override or None,
            )
    except Exception as exc:  # e.g. a timm/hf tower whose backbone config needs the network
        raise WeightsError(f"cannot build CLIP model {name}: {type(exc).__name__}: {first_line(exc)}") from None


def _bundle(
    clip: nn.Module,
    act: _Activation,
    src: _WeightsSource,
    sha: str,
    dtype_name: str,
    device: torch.device,
    requested: str,
) -> ClipBundle:
    pp_cfg = PreprocessCfg(**clip.visual.preprocess_cfg)
    tokenizer = open_clip.get_tokenizer(act.name)
    return ClipBundle(
        model=clip,
        preprocess=image_transform_v2(pp_cfg, is_train=False),
        tokenizer=tokenizer,
        model_name=act.name,
        pretrained=src.pretrained,
        weights_path=src.path,
        weights_sha256=sha,
        weights_format="openai" if act.openai_reason else "open_clip",
        image_size=_square(pp_cfg.size),
        mean=tuple(float(x) for x in pp_cfg.mean),
        std=tuple(float(x) for x in pp_cfg.std),
        embed_dim=_embed_dim(clip),
        vision_width=_vision_width(clip),
        text_width=_text_width(clip),
        num_vision_layers=_vision_layers(clip),
        num_text_layers=_text_layers(clip),
        vision_tokens=_vision_tokens(clip),
        context_length=int(getattr(clip, "context_length", 0) or getattr(tokenizer, "context_length", 77)),
        quick_gelu=_uses_quickgelu(clip),
        dtype=dtype_name,
        device=device,
        requested_model=requested,
        warnings=act.notes,
    )


def _square(size: Any) -> int:
    if isinstance(size, (tuple, list)):
        if len(set(size)) != 1:
            raise ConfigError(f"non-square CLIP image size {tuple(size)} is not supported; expected H == W")
        return int(size[0])
    return int(size)


def _embed_dim(clip: nn.Module) -> int:
    if getattr(clip.visual, "output_dim", None):
        return int(clip.visual.output_dim)
    proj = getattr(clip, "text_projection", None)
    if isinstance(proj, nn.Parameter):
        return int(proj.shape[1])
    if isinstance(proj, nn.Linear):
        return int(proj.out_features)
    raise ConfigError(f"cannot tell the embedding size of {type(clip).__name__}")


def _vision_width(clip: nn.Module) -> Optional[int]:
    v = clip.visual
    return int(v.transformer.width) if isinstance(v, VisionTransformer) else None


def _vision_layers(clip: nn.Module) -> Optional[int]:
    v = clip.visual
    return len(v.transformer.resblocks) if isinstance(v, VisionTransformer) else None


def _vision_tokens(clip: nn.Module) -> Optional[int]:
    v = clip.visual
    return int(v.positional_embedding.shape[0]) if isinstance(v, VisionTransformer) else None


def _text_tower(clip: nn.Module) -> Optional[nn.Module]:
    return clip.transformer if isinstance(clip, CLIP) else getattr(getattr(clip, "text", None), "transformer", None)


def _text_width(clip: nn.Module) -> Optional[int]:
    t = _text_tower(clip)
    return int(t.width) if t is not None and hasattr(t, "width") else None


def _text_layers(clip: nn.Module) -> Optional[int]:
    t = _text_tower(clip)
    return len(t.resblocks) if t is not None and hasattr(t, "resblocks") else None


def _uses_quickgelu(clip: nn.Module) -> bool:
    return any(isinstance(m, QuickGELU) for m in clip.modules())


def full_depth(model_name: str) -> int:
    """The number of transformer blocks of both towers of ``model_name`` (``--trainable-blocks all``).

    Read from open_clip's model config (no weights loaded). The stored states are those entering
    the last K blocks of *both* towers, so "all" needs towers of equal depth (ViT-B/32, B/16: 12).
    """
    name = model_name.replace("-quickgelu", "") if open_clip.get_model_config(model_name) is None else model_name
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        raise UnknownNameError(
            f"unknown CLIP model {model_name!r}; see `python -c 'import open_clip; print(open_clip.list_models())'`"
        )
    vision, text = cfg.get("vision_cfg", {}).get("layers"), cfg.get("text_cfg", {}).get("layers")
    if not isinstance(vision, int) or not isinstance(text, int):
        raise ConfigError(f"{model_name}: trainable_blocks=all needs a ViT image tower and a transformer text tower")
    if vision != text:
        raise ConfigError(
            f"{model_name}: its towers have {vision} (image) and {text} (text) blocks; trainable_blocks "
            f"is one K for both, so 'all' is not defined here: pass a number up to {min(vision, text)}"
        )
    return vision
