"""RunFolder: the layout of a run folder and its small files, in one place.

``dab train`` and ``dab distill`` write a run folder; ``dab evaluate``,
``dab search``, ``dab compare`` and ``dab distill`` (its teacher) read one::

    <run>/
      config.json            the resolved TrainConfig (what --resume compares)
      precision.json         amp and score dtype as requested and as this device ran them
      store_manifest.json    the manifest of the store the run read
      status.json            running | complete | failed | interrupted (with the reason)
      metrics.jsonl          one line per epoch (train loss, validation metrics)
      checkpoints/last.pt    the latest state (weights only: no pickled code)
      checkpoints/best.pt    the state selected on the validation split
      costs_<split>.h5|.zarr test cost matrix, rankings, per-query variances
      metrics.json, report.md, examples.html   written by `dab evaluate`

Every write is atomic (a temporary sibling renamed into place), so a killed run
leaves each file either old or new, never half written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from .errors import ConfigError, StoreError
from .fsutil import atomic_write_text

COST_SUFFIXES = (".h5", ".zarr")


class RunFolder:
    """The files of one run folder (which need not exist yet)."""

    CONFIG = "config.json"
    PRECISION = "precision.json"
    STORE_MANIFEST = "store_manifest.json"
    STATUS = "status.json"
    METRICS_LOG = "metrics.jsonl"
    CHECKPOINTS = "checkpoints"
    LAST, BEST = "last.pt", "best.pt"  # the latest state and the one selected on validation
    METRICS = "metrics.json"
    REPORT = "report.md"
    EXAMPLES = "examples.html"
    # what a run that stopped before its first checkpoint leaves, removed when it starts over
    START_FILES = (CONFIG, STATUS, METRICS_LOG, STORE_MANIFEST)

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # ---- paths

    @property
    def config_path(self) -> Path:
        return self.path / self.CONFIG

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / self.CHECKPOINTS

    def checkpoint(self, name: str = BEST) -> Path:
        """``checkpoints/<name>`` (``last.pt`` or ``best.pt``)."""
        return self.checkpoint_dir / name

    def costs_path(self, split: str, fmt: str = "h5") -> Path:
        """Where the cost file of ``split`` goes: ``costs_<split>.h5`` or ``.zarr``."""
        return self.path / f"costs_{split}.{fmt}"

    # ---- state

    def is_run(self) -> bool:
        """Whether the folder holds a run (its config.json)."""
        return self.config_path.is_file()

    def read_status(self) -> dict:
        """status.json, or {} when it is missing or unreadable."""
        try:
            return json.loads((self.path / self.STATUS).read_text())
        except (OSError, ValueError):
            return {}

    @property
    def state(self) -> str:
        return str(self.read_status().get("state", "unknown"))

    def write_status(self, **data: Any) -> None:
        self.write_json(self.STATUS, data)

    def write_json(self, name: str, data: Any) -> None:
        atomic_write_text(self.path / name, json.dumps(data, indent=2, default=str) + "\n")

    def append_metrics(self, record: dict) -> None:
        """One line of metrics.jsonl (appended: a torn last line is what a reader skips)."""
        with open(self.path / self.METRICS_LOG, "a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")

    def clear_start(self) -> None:
        """Remove what a run that never reached a checkpoint wrote, so it can start over."""
        for name in self.START_FILES:
            (self.path / name).unlink(missing_ok=True)

    # ---- config and checkpoints

    def save_config(self, cfg: Any) -> None:
        from .config import save_config

        save_config(cfg, self.config_path)

    def load_config(self, cls: type) -> Any:
        """The run's config as ``cls``; ConfigError for a folder that is not a run."""
        from .config import load_config

        if not self.is_run():
            raise ConfigError(f"{self.path} is not a run folder (no {self.CONFIG}); pass the folder "
                              "`dab train --out` wrote")
        return load_config(cls, self.config_path)

    def save_checkpoint(self, name: str, state: dict) -> None:
        from .checkpoint import save_checkpoint

        save_checkpoint(self.checkpoint(name), state)

    def load_checkpoint(self, name: str, map_location: Any = "cpu") -> Optional[dict]:
        """``checkpoints/<name>`` read weights-only, or None when it does not exist."""
        from .checkpoint import load_checkpoint

        path = self.checkpoint(name)
        return load_checkpoint(path, map_location=map_location) if path.exists() else None

    # ---- cost files

    def find_costs(self) -> Path:
        """The cost file of the run (``costs_test.h5`` / ``.zarr``); a typed error saying why there is none."""
        if not self.path.is_dir():
            raise ConfigError(f"--run {self.path}: not a folder (expected a run folder written by `dab train`)")
        cands = sorted(p for p in self.path.iterdir() if p.name.startswith("costs_") and p.suffix in COST_SUFFIXES)
        if not cands:
            raise StoreError(f"{self.path} holds no cost file (costs_<split>.h5|.zarr); "
                             f"the run's state is {self.state!r}")
        return cands[0]
