"""Generate docs/cli.md from the click commands (``--check`` fails when it is stale)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click

from . import cli, register_commands

HEADER = """# CLI reference

Generated from the click commands by `make docs-cli`
(`python -m dab_pipeline.cli.docgen > docs/cli.md`); a test fails when this
file and the commands disagree.
"""


def _section(title: str, cmd: click.Command, info_name: str, parent: click.Context | None) -> str:
    lines = [f"## `{title}`", ""]
    # make_context applies each command's context_settings (e.g. -h), as a real invocation does
    sub = cmd.make_context(
        info_name, [], parent=parent, resilient_parsing=True, terminal_width=100, max_content_width=100
    )
    help_text = cmd.get_help(sub)
    lines += ["```text", help_text.rstrip(), "```", ""]
    return "\n".join(lines)


def render() -> str:
    register_commands()
    root = cli.make_context("dab", [], resilient_parsing=True, terminal_width=100, max_content_width=100)
    parts = [HEADER, _section("dab", cli, "dab", None)]
    for name in sorted(cli.commands):
        parts.append(_section(f"dab {name}", cli.commands[name], name, root))
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", type=Path, default=None, help="compare with this file instead of printing")
    args = ap.parse_args(argv)
    text = render()
    if args.check is not None:
        current = args.check.read_text() if args.check.exists() else ""
        if current != text:
            print(f"{args.check} is out of date: run `make docs-cli`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
