"""CLIP loading and encoding on top of open_clip.

What this module adds to open_clip:

* :func:`load_clip` resolves an architecture plus a pretrained tag or a local
  weights file, works offline from open_clip's cache, turns every failure into a
  typed :class:`~dab_pipeline.core.errors.DabError`, and picks the QuickGELU variant
  whenever the weights are OpenAI's (loading them into a GELU model raises no
  error but silently gives wrong features).
* ``dab-tiny``: a tiny architecture (config in ``model_configs/``) with
  deterministic random weights, so tests and speed benchmarks run on CPU
  without downloading anything; ``dab-world``: a small CLIP pretrained on the
  procedural world (``dab_pipeline.world``), its weights shipped in ``weights/``,
  for the demo and the quality benchmark.
* :func:`encode_images` / :func:`encode_texts` return the projected features and,
  for partial fine-tuning, the token states entering the last K transformer
  blocks; :class:`VisionHead` / :class:`TextHead` replay those K blocks (plus the
  final LayerNorm and projection) from the stored states, trainable.
* :func:`load_text_clip`: a store's CLIP as its text tower alone (:class:`TextTower`), built and loaded without
  importing open_clip, for a search's query; None where the model needs open_clip.

The names are loaded on first use (as ``dab_pipeline``'s): ``import dab_pipeline.clip_models`` and the query
path (:mod:`.text_tower`, :mod:`.tokenizer`, :mod:`.encode`, :mod:`.vocabulary`) leave open_clip unimported, whose
package imports torchvision (with ``torch._dynamo``) and timm, about 1.5 s of CPU; :func:`load_clip` imports it."""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module of this package that defines it
_NAMES = {
    **dict.fromkeys(
        [
            "MODEL_CONFIG_DIR",
            "TINY_MODEL",
            "ClipBundle",
            "TextEncoding",
            "check_store_weights",
            "open_clip_with_our_models",
            "quiet_open_clip",
        ],
        "bundle",
    ),
    **dict.fromkeys(
        [
            "encode_images",
            "encode_queries_short",
            "encode_texts",
            "pad_text_states",
            "token_counts",
            "tokenize_lengths",
        ],
        "encode",
    ),
    **dict.fromkeys(["TextHead", "VisionHead"], "heads"),
    **dict.fromkeys(["full_depth", "load_clip"], "load"),
    **dict.fromkeys(["TextTower", "load_text_clip"], "text_tower"),
    **dict.fromkeys(["query_words", "unknown_words", "unknown_words_line"], "vocabulary"),
    **dict.fromkeys(
        ["WEIGHTS_DIR", "builtin_weights", "expand_compact_state", "read_torchscript_tensors"], "weight_files"
    ),
    **dict.fromkeys(
        ["default_tiny_weights", "detect_openai_weights", "offline_reason", "write_tiny_weights"], "weights"
    ),
}
_MODULES = {"bundle", "encode", "heads", "load", "text_tower", "tokenizer", "vocabulary", "weight_files", "weights"}

__all__ = [
    "TINY_MODEL",
    "ClipBundle",
    "TextEncoding",
    "TextHead",
    "TextTower",
    "VisionHead",
    "default_tiny_weights",
    "detect_openai_weights",
    "encode_images",
    "encode_texts",
    "encode_queries_short",
    "load_clip",
    "load_text_clip",
    "pad_text_states",
    "token_counts",
    "tokenize_lengths",
    "query_words",
    "unknown_words",
    "write_tiny_weights",
]


def __getattr__(name: str) -> Any:
    if name in _MODULES:  # a submodule not imported yet (``clip_models.weights``)
        return importlib.import_module(f"{__name__}.{name}")
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES) | _MODULES)
