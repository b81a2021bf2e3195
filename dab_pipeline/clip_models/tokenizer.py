"""CLIP's BPE tokenizer (open_clip's ``SimpleTokenizer``) without open_clip's package ``__init__``.

``import open_clip`` runs its package ``__init__``, which imports every model it has: torchvision (and through it
``torch._dynamo``) and timm, about 1.5 s of CPU that a search's query (a few tokens) does not need. The tokenizer
is one file of that package, ``open_clip/tokenizer.py``, which imports only ftfy, regex, numpy and torch: it is
loaded here from that file as a module of its own, so its tokens are open_clip's by construction (the same code,
the same vocabulary file beside it). Where open_clip is imported already, its own module is used.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ..core.errors import ConfigError

__all__ = ["bpe_tokenizer", "is_bpe_tokenizer"]

OPEN_CLIP_MODULE = "open_clip.tokenizer"
STANDALONE_MODULE = "dab_pipeline.clip_models.open_clip_tokenizer"  # the same file, loaded without its package


def tokenizer_module() -> ModuleType:
    """open_clip's tokenizer module: open_clip's own where it is imported, else the file loaded alone (once)."""
    for name in (OPEN_CLIP_MODULE, STANDALONE_MODULE):
        if name in sys.modules:
            return sys.modules[name]
    spec = importlib.util.find_spec("open_clip")  # a top-level package's spec: found, not executed
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("open_clip is not installed: it provides CLIP's tokenizer")
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer.py"
    file_spec = importlib.util.spec_from_file_location(STANDALONE_MODULE, path)
    if file_spec is None or file_spec.loader is None:
        raise ConfigError(f"cannot load open_clip's tokenizer from {path}")
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[STANDALONE_MODULE] = module
    try:
        file_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[STANDALONE_MODULE]
        raise
    return module


def bpe_tokenizer(context_length: int, **kwargs: Any) -> Any:
    """open_clip's ``SimpleTokenizer(context_length, **kwargs)``: list[str] -> (M, context_length) int64, as
    ``open_clip.get_tokenizer`` gives it for a model whose text config names no other tokenizer."""
    return tokenizer_module().SimpleTokenizer(context_length=context_length, **kwargs)


def is_bpe_tokenizer(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` is open_clip's ``SimpleTokenizer``, made by open_clip or by :func:`bpe_tokenizer`."""
    classes = tuple(sys.modules[n].SimpleTokenizer for n in (OPEN_CLIP_MODULE, STANDALONE_MODULE) if n in sys.modules)
    return bool(classes) and isinstance(tokenizer, classes)
