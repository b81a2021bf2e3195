"""Progress reporting without a UI dependency.

Stages call ``progress(Event(...))``; the CLI turns events into a rich progress
bar, tests collect them in a list, and library code never imports rich or click.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class Event:
    """One progress notification.

    kind: "start" (a task begins; ``total`` set), "advance" (``n`` more units done),
    "end" (task finished), "info"/"warning" (a message for the user), or
    "metrics" (``data`` holds numbers such as loss, epoch, R@1).
    """

    kind: str
    task: str = ""
    total: Optional[int] = None
    n: int = 0
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)


ProgressCallback = Callable[[Event], None]


def null_progress(event: Event) -> None:
    """Default callback: ignore every event."""
    return None
