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


def test_the_demo_searches_a_caption_that_describes_its_first_test_video_whole(tmp_path: Path) -> None:
    rows = [
        "video_id,video,caption,split,level",
        "w1,w1.mp4,a red circle on sand then a blue square on grass,train,video",
        "w2,w2.mp4,a shape,test,generic",
        "w2,w2.mp4,a large white diamond on a navy background then grass,test,video",
        "w2,w2.mp4,a white diamond on navy then grass with a cross,test,video",
        "w3,w3.mp4,a green ring on brick,test,video",
    ]
    path = tmp_path / "captions_all.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    # the first test video's first whole-video caption, by the rule, whatever the search makes of it
    assert demo.specific_caption(path) == "a large white diamond on a navy background then grass"
