"""Run checkpoints: written atomically, read without running anyone's code.

Run folders are passed between people (to reproduce a table, to search with a
trained model), so a checkpoint is untrusted input. It holds only tensors and
plain containers (the random states too: NumPy's as a tensor), and is read with
``torch.load(weights_only=True)``, which refuses every other object instead of
unpickling it. Checkpoints of dab before this rule held NumPy's random state as
an array; the few NumPy globals that rebuild a plain array are allowed so that
those still load (an array of Python objects would need more, and is refused).
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ..core.errors import CheckpointError
from ..core.fsutil import atomic_torch_save

__all__ = ["save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state"]


def save_checkpoint(path: Path, state: dict) -> None:
    """Write ``state`` to ``path`` atomically: a killed run leaves the previous file intact."""
    atomic_torch_save(state, Path(path))


def _legacy_numpy_globals() -> list:
    """What an older checkpoint's NumPy random state (a uint32 array) needs to be rebuilt."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _reconstruct
    names = [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    return names


def load_checkpoint(path: Path, map_location: Any = "cpu") -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` (or an older dab).

    Anything beyond tensors and plain containers is refused with a
    :class:`CheckpointError` before it is unpickled, so nothing in the file runs.
    """
    path = Path(path)
    if path.is_file() and path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): not a checkpoint (a copy or a write that did not finish?)")
    try:
        with torch.serialization.safe_globals(_legacy_numpy_globals()):
            state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).strip().splitlines()
        if not any("GLOBAL" in ln for ln in reason) and any("Unsupported operand" in ln for ln in reason):
            raise CheckpointError(f"{path} is not a PyTorch checkpoint (damaged, or another kind of file)") from None
        detail = next(
            (ln.strip() for ln in reason if "GLOBAL" in ln or "Unsupported" in ln), reason[0] if reason else ""
        )
        raise CheckpointError(
            f"refused to load {path}: it holds objects other than tensors and plain containers, and loading it "
            f"could run code ({detail[:160]}); only load checkpoints from people you trust with `torch.load` "
            "yourself"
        ) from None
    except (RuntimeError, EOFError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointError(f"cannot read checkpoint {path}: {first[:200]}") from None
    except (IndexError, KeyError, ValueError, TypeError, AttributeError):  # torch.load's own errors on stray bytes
        raise CheckpointError(f"{path} is not a PyTorch checkpoint (damaged, or another kind of file)") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a dab checkpoint (it holds a {type(state).__name__}, not a dict)")
    return state


def rng_state(device: Optional[torch.device] = None) -> dict:
    """Every RNG this process draws from, as tensors and plain values.

    ``device`` (distributed runs): only that GPU's CUDA state, so a rank never
    touches (and allocates a context on) the other ranks' GPUs.
    """
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    st: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(gauss),
        },
        "python": random.getstate(),
    }
    if device is not None:
        st["cuda"] = None
        st["cuda_device"] = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    else:
        st["cuda"] = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return st


def set_rng_state(st: dict, device: Optional[torch.device] = None) -> None:
    """Restore what :func:`rng_state` saved (also the array form of older checkpoints)."""
    torch.set_rng_state(st["torch"])
    npst = st["numpy"]
    if isinstance(npst, dict):
        keys = npst["keys"].numpy().astype(np.uint32)
        np.random.set_state((npst["name"], keys, npst["pos"], npst["has_gauss"], npst["cached_gaussian"]))
    else:
        np.random.set_state(npst)
    python = st["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    if st.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])
    if st.get("cuda_device") is not None and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(st["cuda_device"], device)
