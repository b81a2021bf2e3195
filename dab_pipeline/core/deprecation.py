"""Old names kept working for one release: a keyword argument renamed, with a DeprecationWarning naming the new one."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """One DeprecationWarning: ``old`` is now called ``new`` (the old name goes in a later release)."""
    warnings.warn(
        f"{old} is deprecated: it is now {new} (the old name will be removed in a later release)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed_keywords(**old_to_new: str) -> Callable[[F], F]:
    """Let a function (or a dataclass's ``__init__``) still take its keywords' old names, with a warning;
    giving a keyword under both names is a TypeError."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__qualname__}() got both {new}= and its old name {old}=")
                    warn_renamed(f"{fn.__qualname__}({old}=)", f"{new}=")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap
