"""A tiny name -> object registry whose misses list the valid names."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from .errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects (classes, factories, functions).

    ``registry.get("nope")`` raises :class:`UnknownNameError` naming the kind of
    thing looked up and every valid name, so a typo on the command line gets an
    answer instead of a traceback.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; usable as a decorator when ``obj`` is omitted."""

        def _add(o: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = o
            return o

        return _add(obj) if obj is not None else _add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            valid = ", ".join(sorted(self._items)) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid: {valid}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
