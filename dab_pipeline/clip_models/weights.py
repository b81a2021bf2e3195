"""Where weights come from: dab-tiny, shipped files, pretrained tags (offline-aware), TorchScript read without running it."""

from __future__ import annotations

import collections
import json
import math
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import open_clip
import torch
from open_clip import pretrained as oc_pretrained
from open_clip.constants import HF_WEIGHTS_NAME
from open_clip.factory import load_state_dict as oc_load_state_dict
from torch import Tensor

from ..core.errors import UnknownNameError, WeightsError
from ..core.fsutil import atomic_torch_save, sha256_file
from .bundle import OPENAI_EXTRA_KEYS, TINY_MODEL, WEIGHT_SUFFIXES, dab_cache_dir, first_line, quiet_open_clip


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
    path = dab_cache_dir() / "dab-tiny-seed0.pt"
    if not path.is_file():
        write_tiny_weights(path, seed=0)
    return path


WEIGHTS_DIR = Path(__file__).parents[1] / "weights"


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
        raise WeightsError(
            f"the weights of {name} shipped with dab are damaged: {path} has sha256 {sha[:12]}..., "
            f"{meta_path.name} records {meta['sha256'][:12]}... (a Git LFS pointer or a partial "
            "copy?); reinstall dab"
        )
    return path


def expand_compact_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Undo ``compact_state`` (scripts/pretrain_dab_world.py): a token embedding stored as a few rows.

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
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "DoubleStorage": torch.float64,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
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


def read_weights(path: Path) -> tuple[dict[str, Tensor], Optional[str]]:
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
        raise WeightsError(f"cannot read weights file {path}: {type(exc).__name__}: {first_line(exc)}") from None
    state = expand_compact_state(state)
    has_openai_keys = any(k in state for k in OPENAI_EXTRA_KEYS)
    for k in OPENAI_EXTRA_KEYS:
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
    _, reason = read_weights(path)
    return reason or openai_hint(path, sha256 or sha256_file(path))


def openai_hint(path: Path, sha256: str) -> Optional[str]:
    release = _openai_release_hashes().get(sha256)
    if release:
        return f"its sha256 matches OpenAI's release {release}"
    # Only names that describe the weights themselves: the file, its folder, a Hugging Face
    # cache repo folder (models--timm--vit_base_patch32_clip_224.openai); not any ancestor.
    names = [path.name, path.parent.name, *(p for p in path.parts if p.startswith("models--"))]
    if any("openai" in n.lower() for n in names):
        return "its path names OpenAI"
    return None


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
