"""Old names a user may still hold, in one table: :data:`DEPRECATIONS` maps each to its new name and the dab version
that removes it (the shape of timm's ``register_model_deprecations``: a registry, filled where it is declared).

A name is kept only where a user holds it outside dab's Python API: an option in a shell script, a key a client of
``dab serve`` reads. Python names (keywords, attributes) renamed before dab's first release (0.1.0 was never tagged)
were renamed without a shim (docs/decisions.md, issue 62).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEPRECATIONS", "Deprecation", "deprecation_line", "register_deprecations"]


@dataclass(frozen=True)
class Deprecation:
    new: str  # the name to use instead
    removed_in: str  # the dab version that no longer knows the old name
    held_in: str  # where a user holds the old name


DEPRECATIONS: dict[str, Deprecation] = {}


def register_deprecations(held_in: str, old_to_new: dict[str, str], removed_in: str) -> None:
    """Record each old name of ``old_to_new`` (a name is registered once)."""
    for old, new in old_to_new.items():
        if old in DEPRECATIONS:
            raise ValueError(f"{old} is already deprecated (for {DEPRECATIONS[old].new})")
        DEPRECATIONS[old] = Deprecation(new=new, removed_in=removed_in, held_in=held_in)


register_deprecations("scripts calling dab search or dab serve", {"--topk": "-k/--k"}, removed_in="0.2.0")
register_deprecations("clients reading dab serve's hits (JSON)", {"confidence": "margin"}, removed_in="0.2.0")


def deprecation_line(old: str) -> str:
    """One line: ``old`` is deprecated, what to use instead and the version that removes it."""
    d = DEPRECATIONS[old]
    return f"{old} is deprecated, use {d.new} ({old} goes in dab {d.removed_in})"
