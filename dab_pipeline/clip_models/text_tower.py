"""CLIP's text tower alone, built and loaded without open_clip's package: a search's query encoder.

A query needs the text tower and the tokenizer only; open_clip's package ``__init__`` imports torchvision (with
``torch._dynamo``) and timm, about 1.5 s of CPU before the first query. :class:`TextTower` is open_clip's
``CLIP`` text path (``token_embedding``, ``positional_embedding``, residual attention blocks under the causal mask,
``ln_final``, ``text_projection``, pooled at EOT), with the same attribute and state-dict names, so that
:func:`~dab_pipeline.clip_models.encode.encode_queries_short` runs on it as on a CLIP. :func:`load_text_clip`
builds it from the store's manifest where the model is a plain CLIP text transformer (dab's models, OpenAI's and
open_clip's ViT and ResNet CLIPs) and the weights file is found without open_clip; anything else returns None, and
the caller loads the whole model with :func:`~dab_pipeline.clip_models.load.load_clip`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from ..core.errors import ConfigError
from ..core.fsutil import sha256_file
from .bundle import MODEL_CONFIG_DIR, OUR_MODELS, TINY_MODEL, ClipBundle
from .tokenizer import bpe_tokenizer
from .weight_files import builtin_weights, openai_path_hint, read_weights, tiny_weights_path

__all__ = ["TextTower", "TextTowerConfig", "load_text_clip", "model_config"]


def model_config(name: str) -> Optional[dict]:
    """The JSON model config of ``name``: dab's (``model_configs/``), else open_clip's file, read without importing
    open_clip (dab's are registered over open_clip's: the same order). None where neither has it."""
    folders = [MODEL_CONFIG_DIR]
    spec = importlib.util.find_spec("open_clip")  # a top-level package's spec: found, not executed
    if spec is not None and spec.submodule_search_locations:
        folders.append(Path(list(spec.submodule_search_locations)[0]) / "model_configs")
    for folder in folders:
        path = folder / f"{name}.json"
        if path.is_file():
            return json.loads(path.read_text())
    return None


# text_cfg entries a plain tower may carry, with open_clip's defaults; any other entry or value (a Hugging Face
# tower, layer scale, custom blocks, an extra class token, no causal mask...) leaves the model to open_clip
_TEXT_DEFAULTS: dict[str, Any] = {
    "context_length": 77,
    "vocab_size": 49408,
    "width": 512,
    "heads": 8,
    "layers": 12,
    "mlp_ratio": 4.0,
    "pool_type": "argmax",
    "eos_id": 2,
    "proj_bias": False,
}
_TEXT_INERT: dict[str, Any] = {
    "pad_id": 0,
    "ls_init_value": None,
    "embed_cls": False,
    "no_causal_mask": False,
    "final_ln_after_pool": False,
    "proj_type": "linear",
    "output_tokens": False,
}


def _inert(key: str, value: Any) -> bool:
    return key in _TEXT_INERT and _TEXT_INERT[key] == value


@dataclass(frozen=True)
class TextTowerConfig:
    """The shape of a plain CLIP text tower (open_clip's ``text_cfg`` with its model's ``embed_dim``)."""

    embed_dim: int  # D
    context_length: int
    vocab_size: int
    width: int  # W_t
    heads: int
    layers: int
    mlp_ratio: float
    quick_gelu: bool
    pool_type: str  # "argmax" (EOT has CLIP's largest id) or "eos"
    eos_id: int
    proj_bias: bool  # the projection is an nn.Linear with a bias, not a (W, D) matrix

    @classmethod
    def plain(cls, cfg: Optional[dict]) -> Optional["TextTowerConfig"]:
        """The config of ``cfg``'s text tower, or None where it is not open_clip's plain CLIP text transformer."""
        if not cfg or set(cfg) - {"embed_dim", "vision_cfg", "text_cfg", "quick_gelu", "custom_text"}:
            return None
        text = cfg.get("text_cfg") or {}
        if cfg.get("custom_text") or any(k not in _TEXT_DEFAULTS and not _inert(k, v) for k, v in text.items()):
            return None
        t = {**_TEXT_DEFAULTS, **{k: v for k, v in text.items() if k in _TEXT_DEFAULTS}}
        if t["pool_type"] not in ("argmax", "eos"):
            return None
        return cls(
            embed_dim=int(cfg["embed_dim"]),
            quick_gelu=bool(cfg.get("quick_gelu", False)),
            **{k: type(_TEXT_DEFAULTS[k])(v) for k, v in t.items()},
        )


class QuickGELU(nn.Module):
    """OpenAI's activation (what their weights were trained with): x * sigmoid(1.702 x)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


class LayerNorm(nn.LayerNorm):
    """LayerNorm whose output has its input's dtype, as open_clip's."""

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps).to(x.dtype)


class ResidualBlock(nn.Module):
    """open_clip's ``ResidualAttentionBlock`` without layer scale, batch first: (B, L, W) -> (B, L, W)."""

    def __init__(self, width: int, heads: int, mlp_ratio: float, quick_gelu: bool) -> None:
        super().__init__()
        hidden = int(width * mlp_ratio)
        self.ln_1 = LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_2 = LayerNorm(width)
        act = QuickGELU() if quick_gelu else nn.GELU()
        self.mlp = nn.Sequential(
            OrderedDict([("c_fc", nn.Linear(width, hidden)), ("gelu", act), ("c_proj", nn.Linear(hidden, width))])
        )

    def forward(self, x: Tensor, attn_mask: Optional[Tensor] = None) -> Tensor:
        mask = attn_mask.to(x.dtype) if attn_mask is not None else None
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False, attn_mask=mask)[0]
        return x + self.mlp(self.ln_2(x))


class Blocks(nn.Module):
    """The residual blocks (``transformer.resblocks``), batch first, as open_clip's ``Transformer``."""

    batch_first = True

    def __init__(self, cfg: TextTowerConfig) -> None:
        super().__init__()
        self.width, self.layers = cfg.width, cfg.layers
        self.resblocks = nn.ModuleList(
            ResidualBlock(cfg.width, cfg.heads, cfg.mlp_ratio, cfg.quick_gelu) for _ in range(cfg.layers)
        )

    def get_cast_dtype(self) -> torch.dtype:
        return self.resblocks[0].mlp.c_fc.weight.dtype

    def forward(self, x: Tensor, attn_mask: Optional[Tensor] = None) -> Tensor:
        for block in self.resblocks:
            x = block(x, attn_mask=attn_mask)
        return x


def causal_mask(n: int) -> Tensor:
    """(n, n) additive mask: -inf above the diagonal (a token sees itself and the tokens before it)."""
    return torch.full((n, n), float("-inf")).triu_(1)


class TextTower(nn.Module):
    """open_clip's CLIP text path alone, its attributes and state-dict keys named as CLIP's (no ``visual``)."""

    def __init__(self, cfg: TextTowerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.context_length, self.vocab_size = cfg.context_length, cfg.vocab_size
        self.text_pool_type, self.text_eos_id = cfg.pool_type, cfg.eos_id
        table = torch.empty(cfg.vocab_size, cfg.width)  # given: no random init of a table about to be overwritten
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.width, _weight=table)
        self.positional_embedding = nn.Parameter(torch.empty(cfg.context_length, cfg.width))
        self.transformer = Blocks(cfg)
        self.ln_final = LayerNorm(cfg.width)
        self.text_projection: Union[nn.Parameter, nn.Linear] = (
            nn.Linear(cfg.width, cfg.embed_dim)
            if cfg.proj_bias
            else nn.Parameter(torch.empty(cfg.width, cfg.embed_dim))
        )
        self.logit_scale = nn.Parameter(torch.empty(()))
        self.register_buffer("attn_mask", causal_mask(cfg.context_length), persistent=False)

    def encode_text(self, text: Tensor, normalize: bool = False) -> Tensor:
        """Tokens (M, context_length) -> features (M, D), as ``CLIP.encode_text``."""
        cast_dtype = self.transformer.get_cast_dtype()
        x = self.token_embedding(text).to(cast_dtype) + self.positional_embedding.to(cast_dtype)  # (M, ctx, W)
        x = self.ln_final(self.transformer(x, attn_mask=self.attn_mask))
        if self.text_pool_type == "eos":
            eot = (text == self.text_eos_id).int().argmax(dim=-1)
        else:
            eot = text.argmax(dim=-1)  # EOT has the largest id in CLIP's vocabulary
        x = x[torch.arange(x.shape[0], device=x.device), eot]  # (M, W)
        x = self.text_projection(x) if isinstance(self.text_projection, nn.Linear) else x @ self.text_projection
        return nn.functional.normalize(x, dim=-1) if normalize else x


def build_text_tower(cfg: TextTowerConfig, state: dict[str, Tensor]) -> Optional[TextTower]:
    """A :class:`TextTower` holding the text weights of a whole CLIP's ``state``, float32 on CPU, or None where a
    text weight is missing or has another shape (open_clip's loader then says what, or resizes it)."""
    tower = TextTower(cfg)  # (on the meta device torch's init functions import torch._dynamo: ~1 s of CPU)
    own = tower.state_dict()
    picked = {}
    for key, mine in own.items():
        theirs = state.get(key)
        if theirs is not None and key == "logit_scale" and theirs.numel() == 1:
            theirs = theirs.reshape(())  # a (1,) logit scale (open_clip's nonscalar_logit_scale) is the same number
        if theirs is None or theirs.shape != mine.shape:
            return None
        picked[key] = theirs
    tower.load_state_dict(picked, strict=True)  # copied into float32, as open_clip's float32 CLIP loads them
    return tower


def load_text_clip(manifest: dict, device: Union[str, torch.device] = "cpu") -> Optional[ClipBundle]:
    """The CLIP a store was built with (its manifest's model and weights), as its text tower alone in float32, or
    None where open_clip must load it: a tower other than a plain CLIP text transformer, a manifest without the
    weights' sha256, weights found only through open_clip's tag lookup, a file other than the one recorded.

    The bundle's ``weights_sha256`` is the manifest's (the file's is compared with it), so that
    :func:`~dab_pipeline.clip_models.bundle.check_store_weights` holds for it; its ``preprocess`` refuses images.
    """
    name = str(manifest.get("model") or "").strip().replace("/", "-")
    want_sha = manifest.get("weights_sha256")
    cfg = TextTowerConfig.plain(model_config(name)) if name else None
    if cfg is None or not want_sha or not _activation_agrees(cfg, manifest):
        return None
    path = _weights_file(name, manifest)
    if path is None or sha256_file(path) != want_sha:
        return None
    state, format_reason = read_weights(path)
    openai = format_reason or openai_path_hint(path)
    if openai and not cfg.quick_gelu:
        return None  # OpenAI's weights in a GELU model: load_clip builds the QuickGELU variant and says so
    tower = build_text_tower(cfg, state)
    if tower is None:
        return None
    tower.to(device).eval().requires_grad_(False)
    pretrained = manifest.get("pretrained")
    return ClipBundle(
        model=tower,
        preprocess=_no_images,
        tokenizer=bpe_tokenizer(cfg.context_length),
        model_name=name,
        pretrained=str(path) if pretrained and Path(os.path.expanduser(str(pretrained))).is_file() else pretrained,
        weights_path=path,
        weights_sha256=want_sha,
        weights_format="openai" if openai or _recorded(manifest, "weights_format") == "openai" else "open_clip",
        image_size=0,
        mean=(),
        std=(),
        embed_dim=cfg.embed_dim,
        vision_width=None,
        text_width=cfg.width,
        num_vision_layers=None,
        num_text_layers=cfg.layers,
        vision_tokens=None,
        context_length=cfg.context_length,
        quick_gelu=cfg.quick_gelu,
        dtype="float32",
        device=torch.device(device),
        requested_model=str(manifest.get("model")),
    )


def _recorded(manifest: dict, key: str) -> Any:
    """What the manifest records of its CLIP: the top level's entry, else its ``clip`` section's."""
    return manifest[key] if key in manifest else (manifest.get("clip") or {}).get(key)


def _activation_agrees(cfg: TextTowerConfig, manifest: dict) -> bool:
    """Whether the config's activation is the one the store was built with (where the manifest says): a model
    built with another one (``quick_gelu=`` forced at extraction) is left to load_clip."""
    quick = _recorded(manifest, "quick_gelu")
    if quick is not None and bool(quick) != cfg.quick_gelu:
        return False
    return cfg.quick_gelu or _recorded(manifest, "weights_format") != "openai"


def _weights_file(name: str, manifest: dict) -> Optional[Path]:
    """The weights file load_clip would read, found without open_clip, or None (then load_clip finds it)."""
    pretrained = manifest.get("pretrained")
    if pretrained is None or str(pretrained).strip() == "":
        if name not in OUR_MODELS:
            return None
        if name.startswith(TINY_MODEL):
            path = tiny_weights_path()
            return path if path.is_file() else None  # not generated yet: load_clip writes it
        return builtin_weights(name)
    given = Path(os.path.expanduser(str(pretrained)))
    if given.is_file():
        return given.absolute()
    # an open_clip tag: the file open_clip had found it in when the store was built, if it is still here (its
    # sha256 is compared with the manifest's next)
    recorded = (manifest.get("clip") or {}).get("weights_path")
    return Path(recorded) if recorded and Path(recorded).is_file() else None


def _no_images(_image: Any) -> Tensor:
    raise ConfigError("this CLIP holds its text tower alone (a search's query encoder): it encodes no image")
