"""Device names from the command line (cpu, cuda, cuda:N, auto) -> torch devices."""

from __future__ import annotations

import torch

from ..core.errors import ConfigError


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` picks CUDA when present; asking for CUDA where there is none is a ConfigError."""
    if isinstance(device, torch.device):
        dev = device
    elif device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise ConfigError(f"device {device!r} is not a torch device (cpu, cuda, cuda:1, auto)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {str(device)!r} requested but CUDA is not available here")
    return dev
