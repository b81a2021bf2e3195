"""Typed exceptions of the library.

Every error a user can cause (bad path, bad name, bad config, incompatible store)
is a subclass of :class:`DabError`; the CLI prints its message on one line and
exits non-zero.  Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class DabError(Exception):
    """Base class for all user-facing errors of dab."""

    exit_code: int = 1


class ConfigError(DabError, ValueError):
    """A configuration value is invalid (unknown key, wrong type, out of range).

    Also a ValueError, so code that validates values with ``except ValueError`` sees it."""

    exit_code = 2


class UnknownNameError(ConfigError):
    """A registry lookup failed; the message lists the valid names."""


class DatasetError(DabError):
    """An annotation file or video folder is missing or malformed."""


class VideoDecodeError(DabError):
    """A single video could not be decoded (recorded, not fatal, during extraction)."""


class WeightsError(DabError):
    """CLIP weights could not be obtained or do not fit the architecture."""


class StoreError(DabError):
    """A feature store or cost file is missing, corrupt or incompatible."""


class StoreMismatchError(StoreError):
    """An existing store was built with a different configuration."""


class TrainingError(DabError):
    """Training cannot go on (non-finite loss, incompatible run folder...)."""


class RunLockedError(TrainingError):
    """Another live process is writing the run folder (its advisory lock is held)."""


class CheckpointError(DabError):
    """A checkpoint cannot be read, or holds objects that loading would have to execute."""


class ExtractionFailed(DabError):
    """Every video of an extraction failed."""


class WriteError(StoreError):
    """A write the file system refused: a full disk, a read-only file system, no permission (named, one line)."""


class ServiceUnavailableError(DabError):
    """A part of a distributed server could not be reached (a replica lost more often than its retries): the
    request may succeed later; nothing is damaged (HTTP 503)."""
