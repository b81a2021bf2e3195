"""ClipBundle (a loaded CLIP with its preprocessing), dab's model configs and small helpers.

open_clip is not imported here: its package imports torchvision and timm (about 1.5 s of CPU), which a search's
query encoder (:mod:`.text_tower`) does without; :func:`open_clip_with_our_models` imports it where a module needs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import torch
from torch import Tensor, nn

from ..core.errors import WeightsError

TINY_MODEL = "dab-tiny"


MODEL_CONFIG_DIR = Path(__file__).parents[1] / "model_configs"


OUR_MODELS = sorted(p.stem for p in MODEL_CONFIG_DIR.glob("*.json"))


def open_clip_with_our_models() -> Any:
    """The open_clip package with dab's model configs (``model_configs/``) registered in it."""
    import open_clip

    if not all(name in open_clip.list_models() for name in OUR_MODELS):
        open_clip.add_model_config(MODEL_CONFIG_DIR)
    return open_clip


# Keys that only OpenAI's TorchScript release carries; open_clip's own checkpoints never do.
OPENAI_EXTRA_KEYS = ("input_resolution", "context_length", "vocab_size")


DTYPES = ("float32", "bfloat16", "float16", "autocast-bf16")


WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".npz", ".ckpt")


@dataclass
class ClipBundle:
    """A loaded CLIP model with everything the pipeline needs to know about it."""

    model: nn.Module  # open_clip CLIP (or dab's TextTower: a search's query encoder), eval mode, requires_grad False
    preprocess: Callable[[Any], Tensor]  # open_clip's eval transform: PIL image -> (3, S, S); a TextTower's refuses
    tokenizer: Callable[..., Tensor]  # list[str] -> (M, context_length) int64
    model_name: str  # the architecture actually built (e.g. "ViT-B-32-quickgelu")
    pretrained: Optional[str]  # tag ("openai"), absolute path of the weights file, or None (the model's own)
    weights_path: Optional[Path]  # the local file the weights were read from (cache file for tags)
    weights_sha256: Optional[str]
    weights_format: str  # "openai" or "open_clip"
    image_size: int  # 0 for a text tower alone
    mean: tuple[float, ...]  # () for a text tower alone
    std: tuple[float, ...]
    embed_dim: int  # D
    vision_width: Optional[int]  # W_v (None for non-ViT towers)
    text_width: Optional[int]  # W_t
    num_vision_layers: Optional[int]
    num_text_layers: Optional[int]
    vision_tokens: Optional[int]  # L = grid cells + class token
    context_length: int
    quick_gelu: bool
    dtype: str  # "float32" | "bfloat16" | "float16" | "autocast-bf16"
    device: torch.device
    requested_model: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def input_dtype(self) -> torch.dtype:
        """dtype the images must have when they enter the vision tower."""
        return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(self.dtype, torch.float32)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast context for ``dtype="autocast-bf16"``; a no-op otherwise."""
        if self.dtype == "autocast-bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def logit_scale(self) -> Optional[float]:
        """CLIP's learned multiplier of cosine similarities (100 for OpenAI's weights), if the model has one."""
        scale = getattr(self.model, "logit_scale", None)
        return None if scale is None else float(torch.as_tensor(scale).detach().float().exp())

    @cached_property
    def known_tokens(self) -> Optional[Tensor]:
        """(vocab,) bool: the token ids whose embedding is not all zero, or None where every token is known (the
        usual whole table) or the model has no token table to look at (a Hugging Face text tower). Computed on
        first use (:func:`~dab_pipeline.clip_models.vocabulary.unknown_words` reads it)."""
        table = getattr(getattr(self.model, "token_embedding", None), "weight", None)  # (vocab, W)
        known = None if table is None else table.detach().ne(0).any(dim=1).cpu()
        return None if known is not None and bool(known.all()) else known

    def describe(self) -> dict[str, Any]:
        """JSON-able description for the store manifest."""
        return {
            "model": self.model_name,
            "requested_model": self.requested_model or self.model_name,
            "pretrained": self.pretrained,
            "weights_path": str(self.weights_path) if self.weights_path is not None else None,
            "weights_sha256": self.weights_sha256,
            "weights_format": self.weights_format,
            "quick_gelu": bool(self.quick_gelu),
            "dtype": self.dtype,
            "image_size": int(self.image_size),
            "mean": [float(x) for x in self.mean],
            "std": [float(x) for x in self.std],
            "embed_dim": int(self.embed_dim),
            "vision_width": self.vision_width,
            "text_width": self.text_width,
            "num_vision_layers": self.num_vision_layers,
            "num_text_layers": self.num_text_layers,
            "vision_tokens": self.vision_tokens,
            "context_length": int(self.context_length),
            "logit_scale": self.logit_scale,
            "open_clip_version": open_clip_version(),
            "warnings": list(self.warnings),
        }


@dataclass
class TextEncoding:
    """Result of :func:`encode_texts`."""

    features: Tensor  # (M, D) projected, not normalised
    states: Union[None, Tensor, list[Tensor]]  # None | (M, W) | list of (T_i, W)
    lengths: Tensor  # (M,) int64: EOT index + 1
    tokens: Tensor  # (M, context_length) int64


def open_clip_version() -> str:
    """The installed open_clip's version, read without importing it."""
    from importlib.metadata import version

    return version("open_clip_torch")


def check_store_weights(bundle: ClipBundle, manifest: dict, why: str) -> None:
    """WeightsError unless ``bundle`` holds the CLIP weights the store's manifest records (when both say).

    ``why`` ends the message: what would go wrong with other weights.
    """
    want = manifest.get("weights_sha256")
    if want and bundle.weights_sha256 and bundle.weights_sha256 != want:
        raise WeightsError(
            f"the CLIP weights found for {bundle.model_name} (sha256 {bundle.weights_sha256[:12]}...) differ from "
            f"the ones the store was built with ({want[:12]}...); {why}"
        )


def dab_cache_dir() -> Path:
    env = os.environ.get("DAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dab"


def first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


@contextlib.contextmanager
def quiet_open_clip() -> Iterator[None]:
    """Hide open_clip's "initialised randomly" notice: we load the weights ourselves right after."""

    def _drop(record: logging.LogRecord) -> bool:
        return "No pretrained weights loaded" not in record.getMessage()

    root = logging.getLogger()
    root.addFilter(_drop)
    try:
        yield
    finally:
        root.removeFilter(_drop)
