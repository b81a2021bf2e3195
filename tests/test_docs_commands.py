"""The shell commands of README.md and docs/*.md run as written.

Every `dab` command the docs show, in a code block or inline, names a command and options that exist (the quick
suite: a renamed option breaks it at once). Every command of a code block is then either run, in a scratch
folder where a small demo's store and run stand in for the paths the docs name (``slow``: about 90 s), or
listed in :data:`SKIPPED` with the reason it cannot run here; a command that is neither fails the test, so a new
one is classified when it is written. The ``python benchmarks/*.py`` commands, too long to run, have their
options checked against the script's own ``--help``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
STARTS = ("dab ", "python ", "python3 ", "make ", "torchrun ", "pip ")

# (pattern, reason): the code-block commands that do not run here, and why. Each pattern is searched in the
# command; a command that matches none is run by test_a_docs_command_runs.
SKIPPED = [
    (r"^make (demo|test)", "set-up: make test is CI's own command; make demo is test_demo_pipeline_small's, tiny"),
    (r"^pip install", "installs from the network"),
    (r"^torchrun", "several processes or nodes: tests/runtime/test_distributed.py runs the distributed paths"),
    (r"^python -c .*open_clip\.create_model", "writes ViT-B-32's 350 MB random weights for a benchmark"),
    (r"make_demo_dataset\(Path\('data'\), num_videos=400\)", "a benchmark's 400-video data set (minutes)"),
    (r"--pretrained vitb32_random\.pt|--out run_dab|--run run_dab", "the ViT-B-32 benchmark recipe (tens of minutes)"),
    (r"^python benchmarks/", "a benchmark (minutes to hours): its options are checked against its --help"),
    (r"^dab serve", "a server that runs until stopped: tests/stages/test_serve.py starts the real one"),
    (r"--dataset lsmdc", "LSMDC's annotation files are licensed and not in ../shared/data"),
    (r"--pretrained openai", "downloads OpenAI's CLIP weights and needs the dataset's videos"),
    (r"stores/msrvtt|msrvtt-b32|didemo-b32|anet-b32|charades-b32|lsmdc-b32", "a store of a real dataset's videos"),
    (r"sweeps/table5 *$", "resumes a sweep of a real dataset's store"),
    (r"runs/(msrvtt|didemo|anet|charades|lsmdc)", "a run on a real dataset's store"),
    (r"--features demo_out/store\.h5 --out demo_out/sweeps", "the demo's sweep: 4 variants x 3 seeds (minutes)"),
    (r"ROOT/videos .* \.\.\.$", "a fragment: the options of one's own folder follow"),
    (r"s3://", "an S3 bucket and its credentials: tests/stages/test_remote_store.py runs these against moto (slow)"),
]


@dataclass(frozen=True)
class DocCommand:
    where: str  # README.md:79
    text: str  # the command, continuation lines joined, its trailing comment dropped
    block: bool  # from a code block (else an inline `dab ...` span)

    @property
    def skip_reason(self) -> str | None:
        return next((why for pattern, why in SKIPPED if re.search(pattern, self.text)), None)


def _strip_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (a ``#`` inside quotes is kept)."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1] == " "):
            return line[:i].rstrip()
    return line.rstrip()


def doc_commands() -> list[DocCommand]:
    """Every command of a shell code block (split at ``&&``), and every inline `dab ...` span, of the docs."""
    out: list[DocCommand] = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        fence, pending, start = None, "", 0
        for no, raw in enumerate(lines, 1):
            line = raw.strip()
            if line.startswith("```"):
                fence = None if fence is not None else line[3:].strip()
                continue
            if fence is None:
                for span in re.findall(r"`(dab [^`]+)`", raw):
                    out.append(DocCommand(f"{path.name}:{no}", span, False))
                continue
            if fence not in ("bash", "sh", "shell", "console", ""):
                continue
            if not pending:
                start = no
            line = (pending + " " + line).strip() if pending else line
            if line.endswith("\\"):
                pending = line[:-1].strip()
                continue
            pending = ""
            line = _strip_comment(line[2:] if line.startswith("$ ") else line)
            if line.startswith(STARTS):
                for part in line.split(" && "):
                    out.append(DocCommand(f"{path.name}:{start}", part.strip(), True))
    return out


COMMANDS = doc_commands()


def _dab_commands():
    from dab_pipeline.cli import cli, register_commands

    register_commands()
    return cli.commands


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in a prose span: its words are enough
        return text.split()


def _unknown_options(text: str, commands) -> list[str]:
    """The options of a `dab` command line that its subcommand does not have (brackets and ``...`` allowed)."""
    words = _tokens(text)
    if len(words) < 2 or words[1].startswith("-"):
        return [w for w in words[1:] if w.startswith("--") and w not in ("--help", "--version")]
    name = words[1]
    if name not in commands:
        return [f"(no command {name!r})"] if re.fullmatch(r"[a-z]+", name) else []
    known = {o for p in commands[name].params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    bad = []
    for w in words[2:]:
        w = w.strip("[]()")
        if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", w) and w.split("=")[0] not in known:
            bad.append(w)
    return bad


def test_every_dab_command_in_the_docs_names_options_that_exist() -> None:
    commands = _dab_commands()
    dab = [c for c in COMMANDS if c.text.startswith("dab ")]
    assert len(dab) > 200  # the extraction found the docs' commands
    bad = [f"{c.where}: `{c.text}`: {', '.join(u)}" for c in dab if (u := _unknown_options(c.text, commands))]
    assert not bad, "docs name options that do not exist:\n" + "\n".join(bad)


def test_every_skip_reason_is_used() -> None:
    used = {why for c in COMMANDS if c.block and (why := c.skip_reason)}
    assert used == {why for _, why in SKIPPED}, "remove the reasons no docs command needs"


# ----------------------------------------------------------------------------- the commands run (slow)

BLOCK = [c for c in COMMANDS if c.block]
RUN = [c for c in BLOCK if c.skip_reason is None]
DATASETS = ("msrvtt", "msvd", "vatex", "didemo", "activitynet", "charades", "lsmdc")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The demo on the tiny world (2 epochs) and an index of its store: what `store.h5`, `RUN` and `store.index`
    stand for."""
    from dab_pipeline.cli.demo import main

    out = tmp_path_factory.mktemp("docs") / "demo"
    assert main(["--out", str(out), "--world", "tiny", "--epochs", "2", "--quiet"]) == 0
    index = out / "store.index"
    done = _dab(["index", "--features", str(out / "store.h5"), "--out", str(index)], out)
    assert done.returncode == 0, done.stderr
    library = _library(out / "my_library")
    done = _dab(["extract", "--dataset", "folder", "--videos", str(library), "--model", "dab-world", "--out",
                 str(out / "library.h5"), "--quiet"], out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {"store": out / "store.h5", "run": out / "runs" / "dab", "index": index, "library": library}


def _library(folder: Path) -> Path:
    """A folder of three videos and no captions: `my_library` of docs/datasets.md."""
    from .helpers.videos import write_index_video

    (folder / "trip").mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(("a.mp4", "b.mp4", "trip/c.mp4")):
        write_index_video(folder / name, 8 + i, (32, 24))
    return folder


def _dab(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DAB_PROGRESS": "0"}
    code = "import sys; from dab_pipeline.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def _placed(cmd: DocCommand, demo: dict, scratch: Path) -> list[str]:
    """The command's words with the docs' placeholders put in place: the demo's store, run and index, a library
    of videos without captions and its store; A (or a
    path into ../shared/data) the real annotation files; V (or /tmp/empty) an empty videos folder."""
    words = _tokens(cmd.text)
    dataset = words[words.index("--dataset") + 1] if "--dataset" in words else None
    empty = scratch / "empty"
    empty.mkdir(exist_ok=True)
    out = words[words.index("--out") + 1] if "--out" in words else None
    placed = []
    for w in words:
        if w == "A" and dataset in DATASETS:
            if not (SHARED / dataset).is_dir():
                pytest.skip(f"{cmd.where}: ../shared/data/{dataset} is absent")
            w = str(SHARED / dataset)
        elif w.startswith("../shared/data/"):
            if not SHARED.is_dir():
                pytest.skip(f"{cmd.where}: ../shared/data is absent")
            w = str(SHARED / w.removeprefix("../shared/data/"))
        elif w in ("V", "/tmp/empty"):
            w = str(empty)
        elif w in ("RUN", "demo_out/runs/dab"):
            w = str(demo["run"])
        elif w == "demo_out/store.h5":
            w = str(demo["store"])
        elif w in ("store.h5", "store.index", "library.h5") and w != out:
            w = str({"store.h5": demo["store"], "store.index": demo["index"]}.get(w, demo["library"].parent / w))
        elif w == "my_library":
            w = str(demo["library"])
        placed.append(w)
    return placed


@pytest.mark.slow
@pytest.mark.parametrize("cmd", RUN, ids=[c.where for c in RUN])
def test_a_docs_command_runs(cmd: DocCommand, demo: dict, tmp_path: Path) -> None:
    words = _placed(cmd, demo, tmp_path)
    assert words[0] == "dab", f"{cmd.where}: `{cmd.text}` is not a dab command: run it here or add a reason to SKIPPED"
    done = _dab(words[1:], tmp_path)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    if "--dry-run" in words and str(tmp_path / "empty") in words:
        # a dry run over an empty videos folder reads the annotations, lists every video as missing and exits 1
        # (docs/datasets.md): the counts printed, the last line saying why
        assert done.returncode == 1 and "listed videos are missing on disk" in done.stderr, done.stderr[-2000:]
        assert re.search(r"\d+ videos", done.stdout), done.stdout[-2000:]
        return
    assert done.returncode == 0, f"{cmd.where}: `{cmd.text}` failed:\n{done.stderr[-2000:]}"


@pytest.mark.slow
def test_the_readmes_python_example_runs_on_the_demos_output(
    demo: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The README's `## In Python` block, pasted where a real demo wrote `demo_out/` (issue 61, item 4a; the quick
    suite's tests/test_api.py checks its paths against the demo's commands)."""
    blocks = re.findall(r"## In Python\n.*?```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert len(blocks) == 1
    (tmp_path / "demo_out").symlink_to(demo["store"].parent, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    exec(compile(blocks[0], "README.md", "exec"), {})  # noqa: S102  # the README's own text, as a user runs it
    printed = capsys.readouterr().out
    assert "'R@1'" in printed and "'MdR'" in printed, printed


def test_the_commands_run_and_skipped_cover_every_block_command() -> None:
    """Nothing falls between: each code-block command runs, or has its reason (the lists are printed by -rA)."""
    assert all(c.text.startswith("dab ") for c in RUN), [c.text for c in RUN if not c.text.startswith("dab ")]
    assert len(RUN) >= 8, [c.text for c in RUN]
    for c in BLOCK:
        print(f"{c.where}: {'run' if c.skip_reason is None else 'skipped: ' + c.skip_reason}: {c.text}")


BENCHMARKS = sorted({_tokens(c.text)[1] for c in BLOCK if c.text.startswith("python benchmarks/")})


@pytest.mark.slow
@pytest.mark.parametrize("script", BENCHMARKS)
def test_the_options_of_a_documented_benchmark_exist(script: str) -> None:
    done = subprocess.run(
        [sys.executable, script, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for c in BLOCK:
        words = _tokens(c.text)
        if len(words) > 1 and words[1] == script:
            for w in words[2:]:
                opt = w.strip("[]").split("=")[0]
                if opt.startswith("--"):
                    assert re.search(rf"{re.escape(opt)}\b", done.stdout), f"{c.where}: {script} has no {opt}"
