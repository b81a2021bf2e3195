"""Where weights come from: dab-tiny, pretrained tags (offline-aware), OpenAI's; the files are read by :mod:`.weight_files`."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from open_clip import pretrained as oc_pretrained
from open_clip.constants import HF_WEIGHTS_NAME
from torch import Tensor

from ..core.errors import UnknownNameError, WeightsError
from ..core.fsutil import atomic_torch_save, sha256_file
from .bundle import TINY_MODEL, WEIGHT_SUFFIXES, first_line, open_clip_with_our_models, quiet_open_clip
from .weight_files import openai_path_hint, read_weights, tiny_weights_path

open_clip = open_clip_with_our_models()  # dab's configs registered before a model is named


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
    atomic_torch_save(state, path)
    return path


def default_tiny_weights() -> Path:
    """The cached ``dab-tiny`` weights file ($DAB_CACHE or ~/.cache/dab/), created when absent."""
    path = tiny_weights_path()
    if not path.is_file():
        write_tiny_weights(path, seed=0)
    return path


def _openai_release_hashes() -> dict[str, str]:
    """sha256 -> file name of OpenAI's released checkpoints, from open_clip's own table."""
    out = {}
    for model in open_clip.list_models():
        url = oc_pretrained.get_pretrained_url(model, "openai")
        if url and "openaipublic" in url:
            out[url.split("/")[-2]] = url.split("/")[-1]
    return out


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
    _, reason = read_weights(path)
    return reason or openai_hint(path, sha256 or sha256_file(path))


def openai_hint(path: Path, sha256: str) -> Optional[str]:
    release = _openai_release_hashes().get(sha256)
    if release:
        return f"its sha256 matches OpenAI's release {release}"
    return openai_path_hint(path)


def normalise_name(model: str) -> str:
    name = model.strip().replace("/", "-")  # OpenAI spells it ViT-B/32
    if name not in open_clip.list_models():
        valid = ", ".join(open_clip.list_models())
        raise UnknownNameError(f"unknown CLIP model {model!r}; valid: {valid}")
    return name


def quickgelu_sibling(name: str, want: bool) -> Optional[str]:
    """The registered variant of ``name`` with (want=True) or without QuickGELU."""
    base = name[: -len("-quickgelu")] if name.endswith("-quickgelu") else name
    cand = f"{base}-quickgelu" if want else base
    return cand if cand in open_clip.list_models() else None


def model_has_quickgelu(name: str) -> bool:
    cfg = open_clip.get_model_config(name) or {}
    return bool(cfg.get("quick_gelu", False))


def pretrained_tag_config(name: str, tag: str) -> tuple[str, dict]:
    """Pretrained config of ``tag`` for ``name`` or its QuickGELU sibling -> (name it was found under, cfg)."""
    cfg = oc_pretrained.get_pretrained_cfg(name, tag)
    if cfg:
        return name, cfg
    for want in (True, False):
        sib = quickgelu_sibling(name, want)
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


def offline_reason(cfg: dict) -> Optional[str]:
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


def fetch_tag(name: str, tag: str, cfg: dict, cache_dir: Optional[str]) -> Path:
    cached = _cached_tag_file(cfg, cache_dir)
    if cached:
        return Path(cached).absolute()
    offline = offline_reason(cfg)
    if offline:
        raise WeightsError(
            f"the CLIP weights {name} pretrained={tag!r} are not in the local cache and cannot be downloaded: "
            f"{offline}. Pass a local weights file instead, e.g. --pretrained /path/to/{name.replace('-quickgelu', '')}.pt"
        )
    try:
        got = oc_pretrained.download_pretrained(cfg, cache_dir=cache_dir)
    except Exception as exc:
        got, reason = None, f"{type(exc).__name__}: {first_line(exc)}"
    else:
        reason = "the download returned no file"
    if not got or not os.path.isfile(got):
        raise WeightsError(
            f"could not fetch the CLIP weights {name} pretrained={tag!r}: not in the local cache and the download "
            f"failed ({reason}); without internet, pass a local weights file instead, "
            f"e.g. --pretrained /path/to/{name.replace('-quickgelu', '')}.pt"
        )
    return Path(got).absolute()


def looks_like_path(value: str) -> bool:
    return os.sep in value or "/" in value or value.startswith(("~", ".")) or value.lower().endswith(WEIGHT_SUFFIXES)
