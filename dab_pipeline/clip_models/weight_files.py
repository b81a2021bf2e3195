"""Reading CLIP weight files without importing open_clip: state dicts, safetensors, OpenAI's TorchScript archives
(read without running them), dab's shipped and cached weights. :mod:`.weights` adds what needs open_clip (its
pretrained tags, its model names); a search's query encoder (:mod:`.text_tower`) uses this module alone."""

from __future__ import annotations

import collections
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

from ..core.errors import WeightsError
from ..core.fsutil import sha256_file
from .bundle import OPENAI_EXTRA_KEYS, dab_cache_dir, first_line


def tiny_weights_path() -> Path:
    """Where ``dab-tiny``'s generated weights are cached ($DAB_CACHE or ~/.cache/dab/); maybe not written yet."""
    return dab_cache_dir() / "dab-tiny-seed0.pt"


def openai_path_hint(path: Path) -> Optional[str]:
    """ "its path names OpenAI" where the file, its folder or a Hugging Face cache repo folder does, else None."""
    # Only names that describe the weights themselves: the file, its folder, a Hugging Face
    # cache repo folder (models--timm--vit_base_patch32_clip_224.openai); not any ancestor.
    names = [path.name, path.parent.name, *(p for p in path.parts if p.startswith("models--"))]
    if any("openai" in n.lower() for n in names):
        return "its path names OpenAI"
    return None


def load_state_dict(path: Path) -> dict[str, Tensor]:
    """A state dict from a safetensors file or a ``torch.save`` file (tensors only), as open_clip's
    ``factory.load_state_dict`` reads it (3.3.0): a checkpoint's ``state_dict`` entry, a ``module.`` prefix cut."""
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        checkpoint = load_file(str(path), device="cpu")
    else:
        checkpoint = torch.load(str(path), map_location="cpu", weights_only=True)
    state = checkpoint["state_dict"] if isinstance(checkpoint, dict) and "state_dict" in checkpoint else checkpoint
    if not isinstance(state, dict) or not state:  # next(iter(...)) below would say only "StopIteration"
        raise WeightsError(f"weights file {path} holds no tensors (an empty or non-dict state dict)")
    if next(iter(state)).startswith("module"):
        state = {k[7:]: v for k, v in state.items()}
    return dict(state)


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
            state = load_state_dict(path)
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
