"""Frozen config dataclasses: ``--set key=value`` overrides and JSON round trips.

Each stage has one frozen dataclass config (possibly nesting others, e.g.
``TrainConfig.model``).  It is resolved once at the CLI edge and written next
to every artifact, so a result can be traced and rebuilt from that file alone.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar, Union

from .errors import ConfigError
from .fsutil import atomic_write_text
from .location import StoreURL, location

C = TypeVar("C")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def parse_value(raw: str, tp: Any, key: str) -> Any:
    """Parse the string ``raw`` as a value of type ``tp`` (used for ``--set``)."""
    inner, optional = _strip_optional(tp)
    if optional and raw.strip().lower() in {"none", "null"}:
        return None
    origin = typing.get_origin(inner)
    try:
        if inner is bool:
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(raw)
        if inner is int:
            return int(raw)
        if inner is float:
            return float(raw)
        if inner is str or inner is Any:
            return raw
        if inner is Path:
            return location(raw)
        if origin in (tuple, list):
            args = typing.get_args(inner)
            elem = args[0] if args else str
            parts = [p for p in raw.strip("()[] ").split(",") if p.strip()]
            vals = [parse_value(p.strip(), elem, key) for p in parts]
            return tuple(vals) if origin is tuple else vals
        if origin is typing.Literal:
            choices = typing.get_args(inner)
            if raw not in choices:
                raise ValueError(raw)
            return raw
    except ValueError:
        raise ConfigError(f"--set {key}={raw}: expected a value of type {_type_name(tp)}") from None
    raise ConfigError(f"--set {key}: fields of type {_type_name(tp)} cannot be set from the command line")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def apply_overrides(cfg: C, overrides: Iterable[str]) -> C:
    """Return a copy of ``cfg`` with ``key=value`` strings applied.

    Nested configs use dots (``model.dropout=0.4``).  Unknown keys raise
    :class:`ConfigError` listing the valid ones, so typos never pass silently.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        cfg = _set_value(cfg, key.strip().split("."), raw.strip(), key.strip(), "--set", parse=True)
    return cfg


def replace_values(cfg: C, values: Mapping[str, Any], source: str = "--set") -> C:
    """Return a copy of ``cfg`` with typed values applied (``{"model.dropout": 0.4, "epochs": 5}``).

    What a recipe or a Python caller hands over: no round trip through strings. A string for a
    field of another type is parsed as ``--set`` parses it (``"none"`` for an optional field, ``"all"``
    stays a string for the caller to resolve); ``source`` names where the values came from in errors.
    """
    for key, value in values.items():
        cfg = _set_value(cfg, key.split("."), value, key, source)
    return cfg


def _set_value(cfg: Any, parts: list[str], value: Any, full_key: str, source: str, parse: bool = False) -> Any:
    """``cfg`` with the (dotted) field ``parts`` set to ``value``; ``parse``: value is a --set string, read by
    the field's type (so ``none`` is None for an optional string too)."""
    if not dataclasses.is_dataclass(cfg):
        raise ConfigError(f"{source} {full_key}: {'.'.join(parts)} is not a config section")
    names = [f.name for f in dataclasses.fields(cfg)]
    head = parts[0]
    if head not in names:
        raise ConfigError(f"{source} {full_key}: unknown key {head!r}; valid: {', '.join(names)}")
    current = getattr(cfg, head)
    if len(parts) > 1:
        return dataclasses.replace(cfg, **{head: _set_value(current, parts[1:], value, full_key, source, parse)})
    if dataclasses.is_dataclass(current):
        raise ConfigError(f"{source} {full_key}: {head} is a section; set one of its keys ({head}.KEY=VALUE)")
    tp = _field_types(type(cfg))[head]
    inner, _ = _strip_optional(tp)
    if parse or (isinstance(value, str) and inner is not str and inner is not Any):
        value = parse_value(value, tp, full_key)
    elif inner is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif inner is Path and isinstance(value, str):
        value = Path(value)
    try:
        return dataclasses.replace(cfg, **{head: value})
    except (ValueError, TypeError) as exc:  # __post_init__ validation
        raise ConfigError(f"{source} {full_key}={value if parse else repr(value)}: {exc}") from None


def flat_values(config: Any, prefix: str = "") -> dict[str, Any]:
    """A config (dataclass) or nested dict as ``{"dotted.key": value}``, each value after a JSON round trip
    (a tuple and the list a JSON file gives back compare equal)."""
    d = to_dict(config) if dataclasses.is_dataclass(config) else config
    items: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            items.update(flat_values(v, f"{prefix}{k}."))
        else:
            items[f"{prefix}{k}"] = json.loads(json.dumps(v, sort_keys=True, default=str))
    return items


def changed_keys(saved: Any, asked: Any, keys: Iterable[str] | None = None, ignore: Iterable[str] = ()) -> list[str]:
    """The (dotted) keys whose values differ between two configs or dicts, a key on one side only included.

    With ``keys``, only those are compared, each with everything under it (``"decoder"`` covers
    ``"decoder.backend"``), and they are returned as given. The one resume check of dab: `dab train
    --resume` and `dab distill --resume` compare their saved configuration with the one asked for,
    `dab extract` a store's manifest with the new run's (through :func:`differences` or this).
    """
    a, b, skip = flat_values(saved), flat_values(asked), set(ignore)
    changed = [k for k in sorted(set(a) | set(b)) if k not in skip and (k not in a or k not in b or a[k] != b[k])]
    if keys is None:
        return changed
    return [k for k in keys if any(c == k or c.startswith(k + ".") for c in changed)]


def differences(saved: Any, asked: Any, ignore: Iterable[str] = ()) -> list[str]:
    """``"key (saved X, given Y)"`` for every key :func:`changed_keys` reports: what a refused resume prints."""
    a, b = flat_values(saved), flat_values(asked)
    return [f"{k} (saved {a.get(k)!r}, given {b.get(k)!r})" for k in changed_keys(saved, asked, ignore=ignore)]


def to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-able dict of a (nested) config dataclass."""

    def conv(v: Any) -> Any:
        if isinstance(v, StoreURL):  # a dataclass too, written as the URL it is
            return str(v)
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (Path, StoreURL)):
            return str(v)
        if isinstance(v, (tuple, list)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {str(k): conv(x) for k, x in v.items()}
        return v

    return conv(cfg)


def from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Rebuild a config dataclass from :func:`to_dict` output (unknown keys are an error)."""
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints = _field_types(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} keys {unknown}; valid: {', '.join(sorted(names))}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        tp, _ = _strip_optional(hints[name])
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            kwargs[name] = from_dict(tp, value)
        elif dataclasses.is_dataclass(tp) and value is not None and not dataclasses.is_dataclass(value):
            # config.json's "model": "dab" would reach the code as a str where a ModelConfig is read
            raise ConfigError(f"{cls.__name__}.{name} must be a mapping of {tp.__name__} fields, got {value!r}")
        elif value is not None and tp is Path:
            kwargs[name] = location(value)  # a store may be a URL (core/location.py)
        elif value is not None and typing.get_origin(tp) is tuple:
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid {cls.__name__}: {exc}") from None


def save_config(cfg: Any, path: Path) -> None:
    atomic_write_text(Path(path), json.dumps(to_dict(cfg), indent=2, sort_keys=True) + "\n")


def load_config(cls: type[C], path: Path) -> C:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from None
    return from_dict(cls, data)
