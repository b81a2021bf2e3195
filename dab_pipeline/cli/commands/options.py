"""The options the commands share: path types, which options the user typed, and how long a rank of a distributed
extraction may wait."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any, Mapping

import click
from click.core import ParameterSource

from ...core.deprecation import deprecation_line
from ...core.errors import ConfigError
from ...core.location import StoreURL, is_url, location

PATH = click.Path(path_type=Path)
EXISTING = click.Path(path_type=Path, exists=True)


class StoreLocation(click.ParamType):
    """A feature store: an existing local path, or an fsspec URL (``s3://bucket/store.zarr``: docs/stores.md)
    checked when the store is opened (one line for an unknown protocol, a missing package or bucket)."""

    name = "path|url"

    def __init__(self, exists: bool = True) -> None:
        self.exists = exists

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str) or not is_url(value):
            checked = (EXISTING if self.exists else PATH).convert(value, param, ctx)
            return location(checked)
        try:
            loc = location(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)
        if not self.exists and isinstance(loc, StoreURL) and loc.protocol == "memory":
            # a store in this process's memory is gone when the command ends: all the encoding for nobody to read
            self.fail(
                f"{loc}: a memory:// store lives only as long as its process, and this one ends with the command, "
                "before anyone can read it: write to a path or an object store (s3://...); memory:// is for the "
                "Python API (run_extract), in one process",
                param,
                ctx,
            )
        return loc


STORE = StoreLocation()  # a store to read
NEW_STORE = StoreLocation(exists=False)  # dab extract --out


class FiniteFloat(click.ParamType):
    """A float that is a number: ``nan`` and ``inf`` are refused when the options are parsed."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        import math

        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return x


FINITE_FLOAT = FiniteFloat()


# How long a rank of `dab extract --distributed` waits in a collective: a rank that
# finished its share waits for the slowest one and for rank 0's HDF5 merge.
EXTRACT_TIMEOUT = _dt.timedelta(hours=6)

# Where a value the user chose comes from; click's own default (and a prompt) is not a choice, so a resume
# never reads it as a change (`dab distill --resume` once refused "epochs (saved 1, given 5)").
_CHOSEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.DEFAULT_MAP)


def typed(ctx: click.Context, name: str) -> bool:
    """Whether the parameter ``name`` (its Python name, e.g. ``batch_size``) was given, not click's default."""
    return ctx.get_parameter_source(name) in _CHOSEN


def typed_values(ctx: click.Context, keys: Mapping[str, str]) -> dict[str, Any]:
    """``{config key: value}`` of the typed parameters among ``keys`` (config key -> parameter name)."""
    return {key: ctx.params[name] for key, name in keys.items() if typed(ctx, name)}


def former_spelling(old: str, **attrs: Any):
    """A hidden option ``old`` (default None), the former spelling of another kept so scripts keep working; the
    command passes its value to :func:`one_spelling`. Its Python name is ``old`` without dashes, ``former_``
    in front (``--topk`` -> ``former_topk``)."""
    return click.option(old, "former_" + old.lstrip("-").replace("-", "_"), default=None, hidden=True, **attrs)


def k_option(help: str):
    """``-k/--k``, the videos a query returns (the HTTP API's ``k``), as ``dab search`` and ``dab serve`` both spell
    it, with ``--topk``, its former spelling, kept (:func:`former_spelling`)."""

    def add(command):
        command = former_spelling("--topk", type=int)(command)
        return click.option("-k", "--k", "k", type=int, default=10, show_default=True, help=help)(command)

    return add


def one_spelling(ctx: click.Context, name: str, spelling: str, old: str, former: Any) -> Any:
    """The value of the parameter ``name`` (spelt ``spelling``), taken from its former spelling ``old`` when that
    was given, with one deprecation line on stderr; both given is a usage error."""
    if former is None:
        return ctx.params[name]
    if typed(ctx, name):
        raise click.UsageError(f"{old} is the former spelling of {spelling}: give {spelling} only")
    click.echo(f"warning: {deprecation_line(old)}", err=True)  # the table's line: its new name and version
    return former
