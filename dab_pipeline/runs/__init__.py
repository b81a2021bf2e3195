"""Run folders and what they hold: the folder layout (:class:`RunFolder`), weights-only checkpoints and the cost file
that `dab train` writes and `dab evaluate` reads."""

from .run_folder import COST_SUFFIXES, RunFolder  # noqa: F401

__all__ = ["RunFolder", "COST_SUFFIXES"]
