"""Run folders and what they hold: the folder layout (:class:`RunFolder`), weights-only checkpoints and the cost file
that `dab train` writes and `dab evaluate` reads; the config a run records (``config``: TrainConfig) and loading a
run into a model (``load``: load_run), with what a run's model reads (``inputs``) and how its epochs are scheduled
(``schedule``). Those four are imported from their modules: this package's own import stays free of the model and
CLIP code that loading needs."""

from .run_folder import COST_SUFFIXES, RunFolder  # noqa: F401

__all__ = ["RunFolder", "COST_SUFFIXES"]
