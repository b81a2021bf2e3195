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
  final LayerNorm and projection) from the stored states, trainable."""

from __future__ import annotations

from .bundle import MODEL_CONFIG_DIR, TINY_MODEL, ClipBundle, TextEncoding, quiet_open_clip  # noqa: F401
from .encode import (  # noqa: F401
    encode_images,
    encode_queries_short,
    encode_texts,
    pad_text_states,
    token_counts,
    tokenize_lengths,
)
from .heads import TextHead, VisionHead  # noqa: F401
from .load import check_store_weights, full_depth, load_clip  # noqa: F401
from .vocabulary import query_words, unknown_words, unknown_words_line  # noqa: F401
from .weights import (  # noqa: F401
    WEIGHTS_DIR,
    builtin_weights,
    default_tiny_weights,
    detect_openai_weights,
    expand_compact_state,
    offline_reason,
    read_torchscript_tensors,
    write_tiny_weights,
)

__all__ = [
    "TINY_MODEL",
    "ClipBundle",
    "TextEncoding",
    "TextHead",
    "VisionHead",
    "default_tiny_weights",
    "detect_openai_weights",
    "encode_images",
    "encode_texts",
    "encode_queries_short",
    "load_clip",
    "pad_text_states",
    "token_counts",
    "tokenize_lengths",
    "query_words",
    "unknown_words",
    "write_tiny_weights",
]
