"""The options the commands share: path types, --trainable-blocks K|all, the default --pretrained, and how long a
rank of a distributed extraction may wait."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Optional

import click

PATH = click.Path(path_type=Path)


EXISTING = click.Path(path_type=Path, exists=True)


# How long a rank of `dab extract --distributed` waits in a collective: a rank that
# finished its share waits for the slowest one and for rank 0's HDF5 merge.
EXTRACT_TIMEOUT = _dt.timedelta(hours=6)


# Models whose weights come with dab (dab-tiny generated, dab-world shipped): no --pretrained needed.
OWN_WEIGHTS = ("dab-tiny", "dab-tiny-quickgelu", "dab-world")


def blocks_option(raw: Optional[str], depth) -> Optional[int]:
    """``--trainable-blocks K|all`` -> K; ``depth()`` gives the number of blocks "all" means."""
    if raw is None:
        return None
    if str(raw).strip().lower() == "all":
        return depth()
    try:
        return int(raw)
    except ValueError:
        raise click.BadParameter(f"expected a number of blocks or 'all', got {raw!r}",
                                 param_hint="--trainable-blocks") from None


def resolve_pretrained(model: str, pretrained: Optional[str]) -> Optional[str]:
    if pretrained is None:
        return None if model in OWN_WEIGHTS else "openai"
    return None if pretrained.lower() in ("none", "") else pretrained
