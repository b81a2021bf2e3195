"""The one CLI factory of the tests: `dab` invoked in-process by click's runner, stderr mixed into the output, and
the tiny extraction every stage test starts from."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from click.testing import CliRunner, Result

from dab_pipeline.cli import cli


def invoke(args: Sequence[str], catch_exceptions: bool = True, **kwargs) -> Result:
    """``dab ARGS...`` as a user types it; ``catch_exceptions=False`` lets a traceback fail the test loudly."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=catch_exceptions, **kwargs)


def extract_args(captions: Path, *extra: str, out: Path | None = None) -> list[str]:
    """`dab extract` of a folder dataset (``captions``, its videos in ``captions.parent / "videos"``) with the tiny
    CLIP, no worker processes and batches of 2, as the tests run it; ``extra`` options follow."""
    args = "extract --dataset folder --model dab-tiny --workers 0 --batch-size 2".split()
    args += ["--annotations", str(captions), "--videos", str(captions.parent / "videos")]
    return [*args, *(["--out", str(out)] if out is not None else []), *extra]
