"""RunFolder: the layout of a run folder and its small files, in one place.

``dab train`` and ``dab distill`` write a run folder; ``dab evaluate``,
``dab search``, ``dab compare`` and ``dab distill`` (its teacher) read one::

    <run>/
      config.json            the resolved TrainConfig (what --resume compares), plus ``features_abs``:
                             the store's absolute path, so a copied run or another cwd still finds it
      precision.json         amp and score dtype as requested and as this device ran them
      store_manifest.json    the manifest of the store the run read
      status.json            running | complete | failed | interrupted (with the reason)
      metrics.jsonl          one line per epoch (train loss, validation metrics)
      checkpoints/last.pt    the latest state (weights only: no pickled code)
      checkpoints/best.pt    the state selected on the validation split
      costs_<split>.h5|.zarr test cost matrix, rankings, per-query variances
      metrics.json, report.md, examples.html   written by `dab evaluate`
      .lock                  the advisory lock of the process writing the folder (its pid inside)

Every write is atomic (a temporary sibling renamed into place), so a killed run
leaves each file either old or new, never half written. One process writes a run
folder at a time: :meth:`RunFolder.writer_lock` (``flock``, released by the
kernel when its process dies, so a killed run leaves no stale lock).
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from ..core.errors import ConfigError, RunLockedError, StoreError
from ..core.fsutil import atomic_write_text
from ..core.location import StoreURL, is_url, location
from ..core.overrides import from_dict, to_dict
from ..core.write_errors import named_write_errors
from .checkpoint import load_checkpoint, save_checkpoint

COST_SUFFIXES = (".h5", ".zarr")
# config.json's key for the store's absolute path (beside ``features`` as given); not a TrainConfig field, so
# --resume, which compares configs, never sees it, and a config.json of an older dab loads without it
FEATURES_ABS = "features_abs"


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
    LOCK = ".lock"
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

    # ---- one writer at a time

    @contextmanager
    def writer_lock(self, what: str) -> Iterator[None]:
        """Hold the folder's advisory lock while this process writes it (the folder must exist).

        A second writer gets :class:`RunLockedError` naming the holder's pid and command at once;
        a lock whose process died is free again (the kernel drops a dead process's flock), so it
        is taken over without a question.
        """
        fd = os.open(self.path / self.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "a process"
            os.close(fd)
            raise RunLockedError(
                f"{self.path} is being written by another process ({holder}); wait for it to "
                "finish, or stop it, before you run this again"
            ) from None
        try:
            with named_write_errors(self.path / self.LOCK):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()}: {what}".encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the lock

    def lock_holder(self) -> Optional[str]:
        """Who holds the writer lock ("pid N: command"), or None when no live process writes the folder."""
        try:
            with self.writer_lock("a check"):
                return None
        except RunLockedError as exc:
            return str(exc).split("(", 1)[1].split(")", 1)[0]
        except OSError:  # no folder, or not writable: nobody can be writing it from here
            return None

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
        with named_write_errors(self.path / self.METRICS_LOG), open(self.path / self.METRICS_LOG, "a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")

    def clear_start(self) -> None:
        """Remove what a run that never reached a checkpoint wrote, so it can start over."""
        for name in self.START_FILES:
            (self.path / name).unlink(missing_ok=True)

    # ---- config and checkpoints

    def save_config(self, cfg: Any) -> None:
        """config.json: ``cfg`` as a dict, with the store's absolute path beside the one given."""
        data = to_dict(cfg)
        if isinstance(data.get("features"), str) and not is_url(data["features"]):
            data[FEATURES_ABS] = str(Path(data["features"]).resolve())
        atomic_write_text(self.config_path, json.dumps(data, indent=2, sort_keys=True) + "\n")

    def load_config(self, cls: type) -> Any:
        """The run's config as ``cls``, its store where it is found from here (:func:`locate_store`);
        ConfigError for a folder that is not a run or a damaged config.json."""
        if not self.is_run():
            raise ConfigError(
                f"{self.path} is not a run folder (no {self.CONFIG}); pass the folder `dab train --out` wrote"
            )
        try:
            data = json.loads(self.config_path.read_text())
        except ValueError as exc:  # bad JSON, or bytes that are not UTF-8
            raise ConfigError(f"config file {self.config_path} is not valid JSON: {exc}") from None
        absolute = data.pop(FEATURES_ABS, None) if isinstance(data, dict) else None
        if isinstance(data, dict) and isinstance(data.get("features"), str):
            data["features"] = str(locate_store(data["features"], self.path, absolute))
        return from_dict(cls, data)

    def save_checkpoint(self, name: str, state: dict) -> None:
        save_checkpoint(self.checkpoint(name), state)

    def load_checkpoint(self, name: str, map_location: Any = "cpu") -> Optional[dict]:
        """``checkpoints/<name>`` read weights-only, or None when it does not exist."""
        path = self.checkpoint(name)
        return load_checkpoint(path, map_location=map_location) if path.exists() else None

    # ---- cost files

    def find_costs(self) -> Path:
        """The cost file of the run (``costs_test.h5`` / ``.zarr``); a typed error saying why there is none."""
        if not self.path.is_dir():
            raise ConfigError(f"--run {self.path}: not a folder (expected a run folder written by `dab train`)")
        cands = sorted(p for p in self.path.iterdir() if p.name.startswith("costs_") and p.suffix in COST_SUFFIXES)
        if not cands:
            raise StoreError(
                f"{self.path} holds no cost file (costs_<split>.h5|.zarr); the run's state is {self.state!r}"
            )
        return cands[0]


def locate_store(recorded: str | Path, run: Path, absolute: Optional[str] = None) -> Path | StoreURL:
    """Where a run's store is now: the first that exists of the path as recorded (from the cwd), the recorded
    path taken from the run folder, and the absolute path recorded at training; the recorded path when none does
    (so an error names what config.json says). A URL is where it is."""
    if is_url(recorded):
        return location(recorded)
    recorded = Path(recorded)
    candidates = [recorded, Path(run) / recorded] + ([Path(absolute)] if absolute else [])
    return next((c for c in candidates if c.exists()), recorded)


def enclosing_run(path: str | Path) -> Optional[Path]:
    """The nearest run folder strictly above ``path`` (which need not exist), or None.

    A run folder here is a config.json with status.json or checkpoints/ beside it (what `dab train` and
    `dab distill` leave), so another tool's config.json in a project folder does not count. Relative paths
    stay relative, as the user gave them.
    """
    here = Path(path)
    absolute = Path(os.path.abspath(here))
    for parent in absolute.parents:
        folder = RunFolder(parent)
        if folder.is_run() and ((parent / RunFolder.STATUS).is_file() or folder.checkpoint_dir.is_dir()):
            return parent if here.is_absolute() else Path(os.path.relpath(parent))
    return None


def check_not_inside_run(path: str | Path) -> None:
    """ConfigError when ``path`` lies inside another run's folder: a run written there would be copied, moved
    and deleted with that run, and read as part of it. Called before anything of the new run is written."""
    outer = enclosing_run(path)
    if outer is not None:
        raise ConfigError(
            f"--out {path} is inside the run folder {outer} (it holds a run's config.json); choose a folder outside it"
        )
