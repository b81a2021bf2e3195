"""What a new user reads first: `dab --help`'s summary of the commands and the README's first screen."""

from __future__ import annotations

import re
from pathlib import Path

from dab_pipeline.cli import cli

from ..helpers.runner import invoke

REPO = Path(__file__).resolve().parents[2]


def test_the_help_summary_names_every_registered_command() -> None:
    res = invoke(["--help"])
    assert res.exit_code == 0, res.output
    summary = res.output.split("Options:")[0]  # the group's docstring, above click's own lists
    missing = [name for name in sorted(cli.commands) if not re.search(rf"^\s*dab {name}\s", summary, re.M)]
    assert not missing, f"dab --help's summary (dab_pipeline/cli/__init__.py) omits {missing}"
    assert "sweep" in cli.commands


def test_the_readme_says_what_dab_is_before_the_set_up_commands_within_one_screen() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    screen = "\n".join(lines[:24])  # one terminal screen
    assert "make demo" in screen and "make test" in screen, "the two set-up commands left the first screen"
    lead = screen.split("make demo")[0]  # what comes before them: what dab is
    for command in ("dab extract", "dab train", "dab evaluate"):
        assert command in lead, command
    assert "store" in lead
