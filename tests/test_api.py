"""The public Python API (docs/api.md): every name loads and is documented, `import dab_pipeline` stays free of
torch, and the README's example runs as written."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_every_public_name_loads_and_has_a_docstring() -> None:
    import dab_pipeline as dab

    names = [n for n in dab.__all__ if n != "__version__"]
    assert len(names) >= 15
    for name in names:
        assert getattr(dab, name).__doc__, name
        assert f"`{name}" in (REPO / "docs" / "api.md").read_text(), f"docs/api.md does not document {name}"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dab.nope  # noqa: B018


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, dab_pipeline; dab_pipeline.open_store; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def _demo_paths(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Where `make demo` (dab_pipeline/cli/demo.py, its default --out) writes its store and its dab run, read from the
    commands it runs (recorded, not run: the world and every command are stubbed) in ``folder``."""
    from dab_pipeline.cli import demo

    ran: list[list[str]] = []
    monkeypatch.chdir(folder)
    monkeypatch.setattr(demo, "_write_world", lambda preset, out: out / "world" / "captions.csv")
    monkeypatch.setattr(demo, "_every_validation_caption", lambda captions: captions)  # no world was written
    monkeypatch.setattr(demo, "specific_caption", lambda captions_all: "a caption of the first test video")
    monkeypatch.setattr(demo, "_run", ran.append)
    assert demo.main([]) == 0

    def out_of(command: str, *having: str) -> Path:
        args = next(a for a in ran if a[0] == command and all(h in a for h in having))
        return Path(args[args.index("--out") + 1])

    return {"store": out_of("extract"), "run": out_of("train", "dab")}


def test_the_readmes_example_runs_as_written_on_the_demos_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The README's `## In Python` block, pasted in the folder where `make demo` ran (issue 61, item 4a): its paths
    are the ones the demo writes, here holding the compatibility fixtures' store and run (tests/data/compat)."""
    blocks = re.findall(r"## In Python\n.*?```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert len(blocks) == 1, "the README's `## In Python` section has one python block"
    paths = _demo_paths(tmp_path, monkeypatch)
    assert paths == {"store": Path("demo_out/store.h5"), "run": Path("demo_out/runs/dab")}, paths
    shutil.rmtree(tmp_path / "demo_out")  # what the stubbed demo made: the fixtures take the demo's paths
    paths["run"].parent.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "data" / "compat" / "v1" / "store.h5", paths["store"])
    shutil.copytree(REPO / "tests" / "data" / "compat" / "v1" / "run", paths["run"])
    capsys.readouterr()
    exec(compile(blocks[0], "README.md", "exec"), {})  # noqa: S102  # the README's own text, as a user runs it
    printed = capsys.readouterr().out
    assert "'R@1'" in printed and "'MdR'" in printed


def test_the_apis_mistakes_are_one_line_dab_errors(tmp_path: Path) -> None:
    """Issue 50, 12: plain ValueError, IndexError, RuntimeError and AttributeError where docs/api.md promises a
    one-line DabError."""
    import json

    import numpy as np

    import dab_pipeline as dab
    from dab_pipeline.testing import random_store

    from .helpers.models import hand_made_run

    store = random_store(tmp_path / "s.h5", dim=32)
    run, model = hand_made_run(tmp_path / "run", store, "dab")
    with pytest.raises(dab.DabError, match="mode must be 'r' .* or 'a'"):
        dab.open_store(store, mode="w")
    with dab.open_store(store) as st:
        with pytest.raises(dab.DabError, match=r"video rows must lie in \[0, 30\); got 0..99"):
            st.read_videos([0, 99])
        with pytest.raises(dab.DabError, match="video rows must lie in"):
            st.read_videos([-1])
        test = st.load_split("test")
    with pytest.raises(dab.DabError, match="is closed"):
        st.load_split("test")
    with pytest.raises(dab.DabError, match=r"text must be \(Q, 32\), got \(2, 8\)"):
        dab.score_all(model, np.zeros((2, 8), np.float32), test.frames, test.frame_mask)
    with pytest.raises(dab.DabError, match="no queries to score"):
        dab.score_all(model, np.zeros((0, 32), np.float32), test.frames, test.frame_mask)
    with pytest.raises(dab.DabError, match="device 'bogus' is not a torch device"):
        dab.load_run(run, device="bogus")
    cfg = json.loads((run / "config.json").read_text())
    cfg["model"] = "dab"
    (run / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(dab.DabError, match="TrainConfig.model must be a mapping of ModelConfig fields, got 'dab'"):
        dab.load_run(run)
