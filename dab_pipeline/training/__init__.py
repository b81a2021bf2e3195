"""The training loop `dab train` and `dab distill` share (:class:`Loop`), each a :class:`Task` over it, and what a
finished run writes (:func:`run_costs`)."""

from .finish import run_costs
from .loop import Loop, LoopSettings, Position, Task

__all__ = ["Loop", "LoopSettings", "Position", "Task", "run_costs"]
