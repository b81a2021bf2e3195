"""The dependency rules of docs/architecture.md, enforced: cli -> stages -> library, no cycles, no UI in the library."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(exe).exists():
        pytest.fail("import-linter is a test dependency (pip install -e '.[test]'): lint-imports not found")
    done = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout and "3 kept" in done.stdout, done.stdout[-2000:]


def test_every_library_module_is_in_the_contracts() -> None:
    """A new top-level module must be placed in a layer and under the no-click/rich rule, not slip past them."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers, forbidden = contracts[0], contracts[1]
    library = {m.strip() for m in layers["layers"][2].split(":")}
    top = {p.stem if p.is_file() else p.name for p in (REPO / "dab_pipeline").iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    expected = {f"dab_pipeline.{m}" for m in top - {"cli", "stages"}}
    assert library == expected, (sorted(expected - library), sorted(library - expected))
    assert set(forbidden["source_modules"]) == expected | {"dab_pipeline.stages"}


def test_every_test_the_reliability_page_cites_exists() -> None:
    """docs/reliability.md states promises by the tests that hold them: each must exist."""
    import re

    repo = Path(__file__).resolve().parents[1]
    cited = set(re.findall(r"`(test_\w+\.py)::(test_\w+)`", (repo / "docs" / "reliability.md").read_text()))
    assert len(cited) >= 20
    for module, name in sorted(cited):
        assert re.search(rf"^def {name}\(", (repo / "tests" / module).read_text(), re.M), f"{module}::{name}"
