"""The training loop `dab train` and `dab distill` share (:class:`Loop`), each a :class:`Task` over it (what a finished
run writes, its test cost file, is :func:`dab_pipeline.runs.costfile.run_costs`)."""

from .loop import Loop, LoopSettings, Position, Task

__all__ = ["Loop", "LoopSettings", "Position", "Task"]
