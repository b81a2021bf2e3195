"""`make demo` ends by saying how to run `dab` yourself: it lives in .venv, which a newcomer has not activated."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dab_pipeline.cli import demo


def test_the_demo_says_how_to_get_dab_on_the_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text("")
    (venv / "dab").write_text("")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)  # not activated: `dab: command not found`
    assert demo.path_hint() == (
        f"to run the commands above yourself: `source .venv/bin/activate` (then `dab --help`), or call {venv / 'dab'} "
        "directly"
    )
    monkeypatch.setattr(demo.shutil, "which", lambda name: str(venv / "dab"))  # activated
    assert "`dab` is on your PATH" in demo.path_hint()
    (venv / "activate").unlink()  # an environment without an activate script (a conda env, say)
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)
    assert demo.path_hint() == f"to run the commands above yourself, call {venv / 'dab'} (dab --help lists them)"
