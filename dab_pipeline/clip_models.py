"""CLIP loading and encoding on top of open_clip.

What this module adds to open_clip:

* :func:`load_clip` resolves an architecture plus a pretrained tag or a local
  weights file, works offline from open_clip's cache, turns every failure into a
  typed :class:`~dab_pipeline.errors.DabError`, and picks the QuickGELU variant
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
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import logging
import math
import os
import pickle
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np
import open_clip
import torch
from open_clip import pretrained as oc_pretrained
from open_clip.constants import HF_WEIGHTS_NAME
from open_clip.convert import convert_state_dict as oc_convert_state_dict
from open_clip.factory import load_state_dict as oc_load_state_dict
from open_clip.model import CLIP, convert_to_custom_text_state_dict, resize_pos_embed, resize_text_pos_embed
from open_clip.transform import PreprocessCfg, image_transform_v2
from open_clip.transformer import QuickGELU, VisionTransformer
from torch import Tensor, nn

from .errors import ConfigError, UnknownNameError, WeightsError
from .fsutil import sha256_file

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
    "list_clip_models",
    "load_clip",
    "pad_text_states",
    "tokenize_lengths",
    "write_tiny_weights",
]

TINY_MODEL = "dab-tiny"
MODEL_CONFIG_DIR = Path(__file__).parent / "model_configs"
_OUR_MODELS = sorted(p.stem for p in MODEL_CONFIG_DIR.glob("*.json"))
if not all(name in open_clip.list_models() for name in _OUR_MODELS):
    open_clip.add_model_config(MODEL_CONFIG_DIR)

# Keys that only OpenAI's TorchScript release carries; open_clip's own checkpoints never do.
_OPENAI_EXTRA_KEYS = ("input_resolution", "context_length", "vocab_size")
_DTYPES = ("float32", "bfloat16", "float16", "autocast-bf16")
_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".npz", ".ckpt")


# --------------------------------------------------------------------------- bundle


@dataclass
class ClipBundle:
    """A loaded CLIP model with everything the pipeline needs to know about it."""

    model: nn.Module  # open_clip CLIP, eval mode, requires_grad False
    preprocess: Callable[[Any], Tensor]  # open_clip's eval transform: PIL image -> (3, S, S)
    tokenizer: Callable[..., Tensor]  # list[str] -> (M, context_length) int64
    model_name: str  # the architecture actually built (e.g. "ViT-B-32-quickgelu")
    pretrained: Optional[str]  # tag ("openai"), absolute path of the weights file, or None (the model's own)
    weights_path: Optional[Path]  # the local file the weights were read from (cache file for tags)
    weights_sha256: Optional[str]
    weights_format: str  # "openai" or "open_clip"
    image_size: int
    mean: tuple[float, ...]
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
            "open_clip_version": open_clip.__version__,
            "warnings": list(self.warnings),
        }


@dataclass
class TextEncoding:
    """Result of :func:`encode_texts`."""

    features: Tensor  # (M, D) projected, not normalised
    states: Union[None, Tensor, list[Tensor]]  # None | (M, W) | list of (T_i, W)
    lengths: Tensor  # (M,) int64: EOT index + 1
    tokens: Tensor  # (M, context_length) int64


# --------------------------------------------------------------------------- names and weights


def list_clip_models() -> list[str]:
    """Every architecture :func:`load_clip` accepts (open_clip's plus dab's own)."""
    return list(open_clip.list_models())


def _cache_dir() -> Path:
    env = os.environ.get("DAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dab"


def _tiny_tensor(key: str, shape: torch.Size, gen: torch.Generator) -> Tensor:
    # Own init (not open_clip's) so the file depends only on the seed and the shapes.
    if key == "logit_scale":
        return torch.full(shape, math.log(1 / 0.07))
    leaf = key.rsplit(".", 1)[-1]
    is_norm = ".ln_" in f".{key}" or key.startswith("ln_")
    if is_norm and leaf == "weight":
        return torch.ones(shape)
    if leaf.endswith("bias"):
        return torch.zeros(shape)
    if key == "token_embedding.weight":
        std = 0.02
    elif "positional_embedding" in key:
        std = 0.01
    else:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
        std = fan_in**-0.5
    return torch.randn(shape, generator=gen) * std


def write_tiny_weights(path: Union[str, Path], seed: int = 0, model: str = TINY_MODEL) -> Path:
    """Write deterministic random weights for ``dab-tiny`` to ``path`` (a torch state dict)."""
    path = Path(path).expanduser().absolute()
    with quiet_open_clip():
        shapes = {k: v.shape for k, v in open_clip.create_model(model).state_dict().items()}
    gen = torch.Generator().manual_seed(int(seed))
    state = {k: _tiny_tensor(k, shapes[k], gen) for k in sorted(shapes)}
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written then renamed (several processes, torchrun ranks, may create the default file at
    # once), and byte-identical for the same seed, so its sha256 is the same in every cache.
    from .fsutil import atomic_torch_save

    atomic_torch_save(state, path)
    return path


def default_tiny_weights() -> Path:
    """The cached ``dab-tiny`` weights file ($DAB_CACHE or ~/.cache/dab/), created when absent."""
    path = _cache_dir() / "dab-tiny-seed0.pt"
    if not path.is_file():
        write_tiny_weights(path, seed=0)
    return path


WEIGHTS_DIR = Path(__file__).parent / "weights"


def builtin_weights(name: str) -> Optional[Path]:
    """The weights file shipped with dab for ``name`` (dab-world), checked against its recorded sha256."""
    meta_path = WEIGHTS_DIR / f"{name}.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    path = WEIGHTS_DIR / meta["file"]
    if not path.is_file():
        raise WeightsError(f"the weights of {name} shipped with dab are missing ({path}); reinstall dab")
    sha = sha256_file(path)
    if sha != meta["sha256"]:
        raise WeightsError(f"the weights of {name} shipped with dab are damaged: {path} has sha256 {sha[:12]}..., "
                           f"{meta_path.name} records {meta['sha256'][:12]}... (a Git LFS pointer or a partial "
                           "copy?); reinstall dab")
    return path


def expand_compact_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Undo :func:`dab_pipeline.world.pretrain.compact_state`: a token embedding stored as a few rows.

    ``token_embedding.rows`` / ``.values`` / ``.vocab_size`` become the full
    ``token_embedding.weight``, zero for every token outside the stored rows.
    Any other state dict is returned as it is.
    """
    if "token_embedding.rows" not in state:
        return state
    rows = state.pop("token_embedding.rows").long()
    values = state.pop("token_embedding.values")
    vocab = int(state.pop("token_embedding.vocab_size"))
    table = torch.zeros((vocab, values.shape[1]), dtype=values.dtype)
    table[rows] = values
    state["token_embedding.weight"] = table
    return state


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        # torch.save archives hold data.pkl only; TorchScript ones add compiled code and constants.
        return any(n.endswith("/constants.pkl") or "/code/" in n for n in zf.namelist())


def _openai_release_hashes() -> dict[str, str]:
    """sha256 -> file name of OpenAI's released checkpoints, from open_clip's own table."""
    out = {}
    for model in open_clip.list_models():
        url = oc_pretrained.get_pretrained_url(model, "openai")
        if url and "openaipublic" in url:
            out[url.split("/")[-2]] = url.split("/")[-1]
    return out


class _ScriptedModule:
    """Stands in for a TorchScript class while reading its archive: keeps the attributes, runs nothing."""

    def __setstate__(self, state: Any) -> None:
        self.attrs = state if isinstance(state, dict) else {}


_STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "HalfStorage": torch.float16, "BFloat16Storage": torch.bfloat16,
    "DoubleStorage": torch.float64, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8, "BoolStorage": torch.bool,
}


class _TensorsOnly(pickle.Unpickler):
    """Unpickles a TorchScript archive's data.pkl into plain objects and tensors.

    Only TorchScript's module classes (``__torch__.*``, replaced by an inert
    holder), the tensor rebuilders and storage types are resolved; any other
    global is refused, and the archive's code is never compiled or run.
    """

    _ALLOWED = {
        ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
        ("torch._utils", "_rebuild_parameter"): torch._utils._rebuild_parameter,
        ("collections", "OrderedDict"): collections.OrderedDict,
    }

    def __init__(self, fh: Any, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(fh)
        self.archive, self.prefix = archive, prefix

    def find_class(self, module: str, name: str) -> Any:
        if module == "__torch__" or module.startswith("__torch__."):
            return _ScriptedModule
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]  # the storage's dtype stands in for its legacy class
        found = self._ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a weights file")
        return found

    def persistent_load(self, pid: Any) -> Any:
        kind, storage_type, key, _location, _numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        raw = bytearray(self.archive.read(f"{self.prefix}/data/{key}"))
        untyped = torch.UntypedStorage.from_buffer(raw, dtype=torch.uint8) if raw else torch.UntypedStorage(0)
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=storage_type, _internal=True)


def read_torchscript_tensors(path: Path) -> dict[str, Tensor]:
    """The parameters and buffers of a TorchScript archive (OpenAI's CLIP release format), by name.

    A TorchScript file is a program; ``torch.jit.load`` would compile the code it
    carries. Only the tensors are needed, so its ``data.pkl`` is read with
    :class:`_TensorsOnly` instead: a file that is not plain TorchScript module
    state is refused with a :class:`WeightsError`, and nothing in it runs.
    """
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if not names:
            raise WeightsError(f"{path}: a TorchScript archive without data.pkl")
        prefix = names[0].split("/", 1)[0]
        with zf.open(names[0]) as fh:
            root = _TensorsOnly(fh, zf, prefix).load()
    out: dict[str, Tensor] = {}

    def walk(obj: Any, name: str) -> None:
        for key, value in getattr(obj, "attrs", {}).items():
            if isinstance(value, Tensor):
                out[f"{name}{key}"] = value
            elif isinstance(value, _ScriptedModule):
                walk(value, f"{name}{key}.")

    walk(root, "")
    return out


def _read_weights(path: Path) -> tuple[dict[str, Tensor], Optional[str]]:
    """Load a weights file -> (state dict, why its format says OpenAI or None)."""
    torchscript = _is_torchscript(path)
    try:
        if torchscript:
            state = read_torchscript_tensors(path)
        else:
            state = dict(oc_load_state_dict(str(path), device="cpu", weights_only=True))
    except WeightsError:
        raise
    except Exception as exc:  # pickle, zip or safetensors errors all mean the same thing here
        raise WeightsError(f"cannot read weights file {path}: {type(exc).__name__}: {_first_line(exc)}") from None
    state = expand_compact_state(state)
    has_openai_keys = any(k in state for k in _OPENAI_EXTRA_KEYS)
    for k in _OPENAI_EXTRA_KEYS:
        state.pop(k, None)
    if torchscript:
        return state, "it is a TorchScript archive (OpenAI's release format)"
    if has_openai_keys:
        return state, "its state dict holds OpenAI's input_resolution/context_length/vocab_size entries"
    return state, None


def detect_openai_weights(path: Union[str, Path], sha256: Optional[str] = None) -> Optional[str]:
    """Why ``path`` holds OpenAI-trained (QuickGELU) weights, or None when nothing says so.

    OpenAI's state-dict key layout is the same as open_clip's CLIP, so the layout
    alone cannot tell them apart (a LAION ViT-B-32 has identical keys but GELU).
    The evidence used: OpenAI ships TorchScript archives whose state dict carries
    ``input_resolution`` / ``context_length`` / ``vocab_size``; the file's sha256
    matches one of OpenAI's releases; or the path names OpenAI (the Hugging Face
    copies live in ``timm/*.openai`` repos).
    """
    path = Path(path)
    _, reason = _read_weights(path)
    return reason or _openai_hint(path, sha256 or sha256_file(path))


def _openai_hint(path: Path, sha256: str) -> Optional[str]:
    release = _openai_release_hashes().get(sha256)
    if release:
        return f"its sha256 matches OpenAI's release {release}"
    # Only names that describe the weights themselves: the file, its folder, a Hugging Face
    # cache repo folder (models--timm--vit_base_patch32_clip_224.openai); not any ancestor.
    names = [path.name, path.parent.name, *(p for p in path.parts if p.startswith("models--"))]
    if any("openai" in n.lower() for n in names):
        return "its path names OpenAI"
    return None


def _first_line(exc: BaseException, limit: int = 200) -> str:
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


def _normalise_name(model: str) -> str:
    name = model.strip().replace("/", "-")  # OpenAI spells it ViT-B/32
    if name not in open_clip.list_models():
        valid = ", ".join(open_clip.list_models())
        raise UnknownNameError(f"unknown CLIP model {model!r}; valid: {valid}")
    return name


def _quickgelu_sibling(name: str, want: bool) -> Optional[str]:
    """The registered variant of ``name`` with (want=True) or without QuickGELU."""
    base = name[: -len("-quickgelu")] if name.endswith("-quickgelu") else name
    cand = f"{base}-quickgelu" if want else base
    return cand if cand in open_clip.list_models() else None


def _model_has_quickgelu(name: str) -> bool:
    cfg = open_clip.get_model_config(name) or {}
    return bool(cfg.get("quick_gelu", False))


def _tag_cfg(name: str, tag: str) -> tuple[str, dict]:
    """Pretrained config of ``tag`` for ``name`` or its QuickGELU sibling -> (name it was found under, cfg)."""
    cfg = oc_pretrained.get_pretrained_cfg(name, tag)
    if cfg:
        return name, cfg
    for want in (True, False):
        sib = _quickgelu_sibling(name, want)
        if sib and sib != name:
            cfg = oc_pretrained.get_pretrained_cfg(sib, tag)
            if cfg:
                return sib, cfg
    return name, {}


def _cached_tag_file(cfg: dict, cache_dir: Optional[str]) -> Optional[str]:
    """The tag's weights if open_clip already downloaded them (HF hub cache or ~/.cache/clip)."""
    hub = cfg.get("hf_hub", "")
    if hub and oc_pretrained.has_hf_hub():
        from huggingface_hub import try_to_load_from_cache

        repo, filename = os.path.split(hub)
        filename = filename or HF_WEIGHTS_NAME
        for fn in [*oc_pretrained._get_safe_alternatives(filename), filename]:
            try:
                hit = try_to_load_from_cache(repo, fn, cache_dir=cache_dir)
            except Exception:  # a malformed cache is the same as no cache
                hit = None
            if isinstance(hit, str) and os.path.isfile(hit):
                return hit
    url = cfg.get("url", "")
    if url:
        target = Path(cache_dir or Path.home() / ".cache" / "clip") / os.path.basename(url)
        if target.is_file():
            expected = url.split("/")[-2] if "openaipublic" in url else ""
            if not expected or sha256_file(target).startswith(expected):
                return str(target)
    return None


def _offline_reason(cfg: dict) -> Optional[str]:
    """Why a download of the tag's weights cannot work from here, found in a few ms; None if it may.

    Without this, an offline machine spends about a minute in huggingface_hub's
    retries before the same answer. A proxy in the environment is trusted (the
    host itself is then not reachable directly, and need not be).
    """
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on") and cfg.get("hf_hub"):
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co") if cfg.get("hf_hub") else cfg.get("url", "")
    host = urlparse(url).hostname
    if not host:
        return None
    try:
        with socket.create_connection((host, urlparse(url).port or 443), timeout=3):
            return None
    except OSError as exc:
        return f"{host} is not reachable ({exc.strerror or type(exc).__name__})"


def _fetch_tag(name: str, tag: str, cfg: dict, cache_dir: Optional[str]) -> Path:
    cached = _cached_tag_file(cfg, cache_dir)
    if cached:
        return Path(cached).absolute()
    offline = _offline_reason(cfg)
    if offline:
        raise WeightsError(
            f"the CLIP weights {name} pretrained={tag!r} are not in the local cache and cannot be downloaded: "
            f"{offline}. Pass a local weights file instead, e.g. --pretrained /path/to/{name.replace('-quickgelu', '')}.pt"
        )
    try:
        got = oc_pretrained.download_pretrained(cfg, cache_dir=cache_dir)
    except Exception as exc:
        got, reason = None, f"{type(exc).__name__}: {_first_line(exc)}"
    else:
        reason = "the download returned no file"
    if not got or not os.path.isfile(got):
        raise WeightsError(
            f"could not fetch the CLIP weights {name} pretrained={tag!r}: not in the local cache and the download "
            f"failed ({reason}); without internet, pass a local weights file instead, "
            f"e.g. --pretrained /path/to/{name.replace('-quickgelu', '')}.pt"
        )
    return Path(got).absolute()


def _looks_like_path(value: str) -> bool:
    return os.sep in value or "/" in value or value.startswith(("~", ".")) or value.lower().endswith(_WEIGHT_SUFFIXES)


# --------------------------------------------------------------------------- load_clip


def _resolve_dtype(dtype: Union[str, torch.dtype], device: torch.device) -> str:
    if isinstance(dtype, torch.dtype):
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
        if dtype not in names:
            raise ConfigError(f"unsupported CLIP dtype {dtype}; expected one of {', '.join(_DTYPES)}")
        dtype = names[dtype]
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    dtype = aliases.get(str(dtype), str(dtype))
    if dtype not in _DTYPES:
        raise ConfigError(f"unknown CLIP dtype {dtype!r}; expected one of {', '.join(_DTYPES)}")
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
        raise WeightsError(
            f"weights file {path} does not fit architecture {name}: {_first_line(exc, 300)}"
        ) from None
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
    requested = model
    name = _normalise_name(model)
    device = torch.device(device)
    dtype_name = _resolve_dtype(dtype, device)
    notes: list[str] = []

    # ---- where the weights come from
    tag_cfg: dict = {}
    openai_reason: Optional[str] = None
    if pretrained is None or str(pretrained).strip() == "":
        if name not in _OUR_MODELS:
            tags = ", ".join(oc_pretrained.list_pretrained_tags_by_model(name)) or "(none)"
            raise WeightsError(
                f"no weights given for CLIP model {name}; pass a pretrained tag ({tags}) or a local weights file"
            )
        weights_path = default_tiny_weights() if name.startswith(TINY_MODEL) else builtin_weights(name)
        if weights_path is None:
            raise WeightsError(f"no default weights for {name}; pass a local weights file")
        # The model's own weights: recorded as None, not as the cache path, which differs
        # between machines and cache folders (the sha256 identifies the bytes).
        pretrained_str = None
    elif os.path.exists(os.path.expanduser(str(pretrained))):
        weights_path = Path(os.path.expanduser(str(pretrained))).absolute()
        if not weights_path.is_file():
            raise WeightsError(f"weights path {weights_path} is not a file (expected a .pt/.bin/.safetensors file)")
        pretrained_str = str(weights_path)
    else:
        tag = str(pretrained)
        found_under, tag_cfg = _tag_cfg(name, tag)
        if not tag_cfg:
            if _looks_like_path(tag):
                raise WeightsError(
                    f"weights file {Path(tag).expanduser().absolute()} does not exist "
                    f"(pass an existing file or an open_clip tag for {name})"
                )
            tags = ", ".join(oc_pretrained.list_pretrained_tags_by_model(name)) or "(none)"
            raise UnknownNameError(
                f"unknown pretrained tag {tag!r} for CLIP model {name} and no file of that name; "
                f"valid tags: {tags}; or pass a local weights file"
            )
        weights_path = _fetch_tag(found_under, tag, tag_cfg, cache_dir)
        pretrained_str = tag

    sha = sha256_file(weights_path)
    state, format_reason = _read_weights(weights_path)

    # ---- activation: OpenAI weights were trained with QuickGELU
    if tag_cfg:
        wants_quick = bool(tag_cfg.get("quick_gelu", False))
        if wants_quick and pretrained_str == "openai":
            openai_reason = "pretrained tag 'openai'"
        source = f"pretrained tag {pretrained_str!r}"
    else:
        openai_reason = format_reason or _openai_hint(weights_path, sha)
        wants_quick = openai_reason is not None or _model_has_quickgelu(name)
        source = f"weights file {weights_path} ({openai_reason})" if openai_reason else ""
    if quick_gelu is not None and quick_gelu != wants_quick:
        if openai_reason or tag_cfg:
            notes.append(
                f"quick_gelu={quick_gelu} was requested although {source or name} implies "
                f"quick_gelu={wants_quick}; features will differ from the original model"
            )
        wants_quick = quick_gelu
    force_quick = False
    if wants_quick != _model_has_quickgelu(name):
        sibling = _quickgelu_sibling(name, wants_quick)
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

    # ---- build and load
    precision = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype_name, "fp32")
    pp_override = {k: tag_cfg[k] for k in ("mean", "std", "interpolation", "resize_mode") if k in tag_cfg}
    try:
        with quiet_open_clip():
            clip = open_clip.create_model(
                name,
                pretrained=None,
                precision=precision,
                device="cpu",
                force_quick_gelu=force_quick,
                force_preprocess_cfg=pp_override or None,
            )
    except Exception as exc:  # e.g. a timm/hf tower whose backbone config needs the network
        raise WeightsError(f"cannot build CLIP model {name}: {type(exc).__name__}: {_first_line(exc)}") from None
    _fit_state_dict(clip, state, weights_path, name)
    del state
    clip.to(device)
    clip.eval()
    clip.requires_grad_(False)

    pp_cfg = PreprocessCfg(**clip.visual.preprocess_cfg)
    preprocess = image_transform_v2(pp_cfg, is_train=False)
    tokenizer = open_clip.get_tokenizer(name)
    return ClipBundle(
        model=clip,
        preprocess=preprocess,
        tokenizer=tokenizer,
        model_name=name,
        pretrained=pretrained_str,
        weights_path=weights_path,
        weights_sha256=sha,
        weights_format="openai" if openai_reason else "open_clip",
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
        warnings=notes,
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


# --------------------------------------------------------------------------- encoding


def _check_blocks(k: Optional[int], layers: Optional[int], tower: str) -> None:
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, int) or k < 0 or (layers is not None and k > layers):
        raise ConfigError(f"trainable_blocks={k!r} is invalid for the {tower} tower; expected 0..{layers}")


def _check_vision(bundle: ClipBundle, k: int) -> VisionTransformer:
    v = bundle.model.visual
    _check_blocks(k, len(v.transformer.resblocks) if isinstance(v, VisionTransformer) else None, "vision")
    if not isinstance(v, VisionTransformer):
        raise ConfigError(
            f"trainable_blocks needs a ViT image tower; {bundle.model_name} uses {type(v).__name__}"
        )
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


def _check_text(bundle: ClipBundle, k: int) -> CLIP:
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


def _run_blocks(blocks: Any, x: Tensor, batch_first: bool, attn_mask: Optional[Tensor] = None) -> Tensor:
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


def _pool_vision(x: Tensor, pool_type: str, final_ln_after_pool: bool, ln_post: nn.Module) -> Tensor:
    """(B, L, W) tokens after the last block -> (B, W) pooled and normalised, as open_clip does."""
    if final_ln_after_pool or pool_type == "tok":
        # LayerNorm acts per token, so for 'tok' normalising the class token alone is the same thing.
        pooled = x[:, 0] if pool_type == "tok" else x[:, 1:].mean(dim=1)
        return ln_post(pooled)
    return ln_post(x)[:, 1:].mean(dim=1)


def _project(x: Tensor, proj: Union[None, nn.Parameter, nn.Module]) -> Tensor:
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
        v = _check_vision(bundle, k)
        batch_first = getattr(v.transformer, "batch_first", False)
        blocks = list(v.transformer.resblocks)
        x = _vision_embed(v, images)  # (B, L, W)
        x = _run_blocks(blocks[: len(blocks) - k], x, batch_first)
        states = x  # (B, L, W) entering the last K blocks
        x = _run_blocks(blocks[len(blocks) - k :], x, batch_first)
        if k == 0:
            states = x[:, 0] if v.pool_type == "tok" else x[:, 1:].mean(dim=1)  # (B, W) before ln_post
        pooled = _pool_vision(x, v.pool_type, v.final_ln_after_pool, v.ln_post)  # (B, W)
        feats = _project(pooled, v.proj)  # (B, D)
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
        _check_text(bundle, k)
        cast_dtype = clip.transformer.get_cast_dtype()
        x = clip.token_embedding(tokens).to(cast_dtype)  # (M, ctx, W)
        x = x + clip.positional_embedding.to(cast_dtype)
        batch_first = getattr(clip.transformer, "batch_first", False)
        blocks = list(clip.transformer.resblocks)
        x = _run_blocks(blocks[: len(blocks) - k], x, batch_first, clip.attn_mask)
        entering = x  # (M, ctx, W)
        x = _run_blocks(blocks[len(blocks) - k :], x, batch_first, clip.attn_mask)
        rows = torch.arange(x.shape[0], device=x.device)
        last = x[rows, eot]  # (M, W) EOT token before ln_final
        feats = _project(clip.ln_final(last), clip.text_projection).float()  # (M, D)
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


# --------------------------------------------------------------------------- trainable heads


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

    def __init__(self, blocks: list[nn.Module], ln_post: nn.Module, proj: Optional[nn.Parameter],
                 pool_type: str = "tok", final_ln_after_pool: bool = False, batch_first: bool = True) -> None:
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
        v = _check_vision(bundle, trainable_blocks)
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
            return _project(self.ln_post(states.to(dtype)), self.proj)  # (B, D)
        if states.dim() != 3:
            raise ConfigError(
                f"VisionHead with {self.num_blocks} blocks expects states (B, L, W), got {tuple(states.shape)}"
            )
        x = _run_blocks(self.blocks, states.to(dtype), self.batch_first)  # (B, L, W)
        pooled = _pool_vision(x, self.pool_type, self.final_ln_after_pool, self.ln_post)  # (B, W)
        return _project(pooled, self.proj)  # (B, D)


class TextHead(nn.Module):
    """The last K text blocks + ``ln_final`` + text projection, trainable, fed with stored states."""

    def __init__(self, blocks: list[nn.Module], ln_final: nn.Module, proj: Union[None, nn.Parameter, nn.Module],
                 attn_mask: Optional[Tensor], batch_first: bool = True) -> None:
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
        clip = _check_text(bundle, trainable_blocks)
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
            return _project(self.ln_final(states.to(dtype)), self.text_projection)  # (B, D)
        if states.dim() != 3 or lengths is None:
            raise ConfigError(
                f"TextHead with {self.num_blocks} blocks expects padded states (B, T, W) and lengths (B,), "
                f"got {tuple(states.shape)} and lengths={'None' if lengths is None else tuple(lengths.shape)}"
            )
        T = states.shape[1]
        mask = self.attn_mask[:T, :T] if self.attn_mask is not None else None  # (T, T) causal
        x = _run_blocks(self.blocks, states.to(dtype), self.batch_first, mask)  # (B, T, W)
        rows = torch.arange(x.shape[0], device=x.device)
        eot = x[rows, lengths.to(x.device).long() - 1]  # (B, W)
        return _project(self.ln_final(eot), self.text_projection)  # (B, D)


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


def full_depth(model_name: str) -> int:
    """The number of transformer blocks of both towers of ``model_name`` (``--trainable-blocks all``).

    Read from open_clip's model config (no weights loaded). The stored states are those entering
    the last K blocks of *both* towers, so "all" needs towers of equal depth (ViT-B/32, B/16: 12).
    """
    name = model_name.replace("-quickgelu", "") if open_clip.get_model_config(model_name) is None else model_name
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        raise UnknownNameError(f"unknown CLIP model {model_name!r}; see `python -c 'import open_clip; "
                               f"print(open_clip.list_models())'`")
    vision, text = cfg.get("vision_cfg", {}).get("layers"), cfg.get("text_cfg", {}).get("layers")
    if not isinstance(vision, int) or not isinstance(text, int):
        raise ConfigError(f"{model_name}: trainable_blocks=all needs a ViT image tower and a transformer text tower")
    if vision != text:
        raise ConfigError(f"{model_name}: its towers have {vision} (image) and {text} (text) blocks; trainable_blocks "
                          f"is one K for both, so 'all' is not defined here: pass a number up to {min(vision, text)}")
    return vision
