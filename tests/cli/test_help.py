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


def test_serve_ray_help_and_the_architecture_say_how_the_ray_path_batches() -> None:
    """Issue 61, item 4c: `dab serve --help` said --ray batches "with Serve's own batching" and docs/architecture.md
    "rerank replicas with serve.batch"; the code batches in the ingress with dab serve's own Batcher, one batch a
    request (stages/serve/on_ray.py), as docs/search.md says. The help and the tree say what the code does."""
    import ast

    on_ray = (REPO / "dab_pipeline" / "stages" / "serve" / "on_ray.py").read_text()
    tree = ast.parse(on_ray)
    decorators = [ast.unparse(d) for n in ast.walk(tree) if hasattr(n, "decorator_list") for d in n.decorator_list]
    assert not any("batch" in d for d in decorators), decorators  # no @serve.batch anywhere
    assert "Batcher(" in on_ray  # the ingress's batcher: dab serve's
    res = invoke(["serve", "--help"])
    assert res.exit_code == 0, res.output
    ray = " ".join(res.output.split("\n  --ray ", 1)[1].split("\n  --replicas", 1)[0].split())  # the option's help
    assert "Serve's own batching" not in ray and "dab serve's own batcher" in ray and "one request" in ray, ray
    arch = (REPO / "docs" / "architecture.md").read_text()
    line = " ".join(arch.split("on_ray.py", 1)[1].split("distill/", 1)[0].split())
    assert "with serve.batch" not in line and "Batcher" in line and "not serve.batch" in line, line
