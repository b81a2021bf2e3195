"""The options the commands share: path types, and how long a rank of a distributed extraction may wait."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import click

PATH = click.Path(path_type=Path)
EXISTING = click.Path(path_type=Path, exists=True)


# How long a rank of `dab extract --distributed` waits in a collective: a rank that
# finished its share waits for the slowest one and for rank 0's HDF5 merge.
EXTRACT_TIMEOUT = _dt.timedelta(hours=6)
