"""The one CLI factory of the tests: `dab` invoked in-process by click's runner, stderr mixed into the output."""

from __future__ import annotations

from typing import Sequence

from click.testing import CliRunner, Result

from dab_pipeline.cli import cli


def invoke(args: Sequence[str], catch_exceptions: bool = True, **kwargs) -> Result:
    """``dab ARGS...`` as a user types it; ``catch_exceptions=False`` lets a traceback fail the test loudly."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=catch_exceptions, **kwargs)
