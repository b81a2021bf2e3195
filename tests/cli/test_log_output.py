"""A command's output in a log, a pipe or a file (click's runner: not a terminal) fits 120 columns and is readable:
tables wrapped to fit with ASCII borders, no character cut into U+FFFD, the extraction's counts whole (issue 61,
item 5)."""

from __future__ import annotations

from pathlib import Path

from ..helpers.runner import extract_args, invoke

BOX = set("━┃│┏┓┗┛┡┩└┘┌┐─╇╸╺")  # rich's box and bar characters: multi-byte in UTF-8


def _log_lines(output: str) -> list[str]:
    lines = output.splitlines()
    assert lines, output
    assert all(len(x) <= 120 for x in lines), "\n".join(x for x in lines if len(x) > 120)
    assert not any("\ufffd" in x for x in lines), output
    assert not any(set(x) & BOX for x in lines), output  # ASCII borders and bars
    return lines


def test_extract_and_inspect_fit_120_columns_in_a_log(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    """`dab inspect` was 225 columns wide on a real store (its decoder entry on one line) and `dab extract`'s summary
    157: each within 120 now, every value still whole once its wrapped lines are joined."""
    out = tmp_path / "a-store-with-a-longer-name.h5"
    res = invoke(extract_args(tiny_folder_dataset, out=out), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    lines = _log_lines(res.output)
    bars = [x for x in lines if x.startswith(("captions ", "videos "))]
    assert any("12/12" in x for x in bars) and any("6/6" in x for x in bars), res.output  # the counts whole
    text = " ".join(res.output.split())
    assert "6 videos encoded, 0 already done, 0 failed, 0 missing; 12 captions" in text, res.output
    assert "of this run's videos have decoder warnings" in text

    res = invoke(["inspect", out], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    lines = _log_lines(res.output)
    manifest = {}  # key -> value, a value's wrapped lines joined
    key = None
    for x in lines:
        cells = [c.strip() for c in x.split("|")[1:-1]]
        if len(cells) != 2:
            key = None
            continue
        if cells[0]:
            key = cells[0]
            manifest[key] = cells[1]
        elif key is not None:
            manifest[key] += " " + cells[1]
    assert manifest["model"] == "dab-tiny" and len(manifest["weights_sha256"]) == 64, manifest
    # the decoder's dict an entry a row (it was a Python repr, "{'backend': 'pyav', ...}"), None written "-"
    assert manifest["decoder.frame_order"] == "sequential decode order", manifest
    assert manifest["decoder.short_side"] == "-" and manifest["pretrained"] == "-", manifest
    assert manifest["quick_gelu"] == "no", manifest
    assert "open_clip's transform: PIL bicubic" in manifest["decoder.resize"], manifest  # wrapped, whole once joined
    assert not any(c in v for v in manifest.values() for c in "{}[]"), manifest
    assert not any(v in ("None", "True", "False") for v in manifest.values()), manifest
    assert "videos/frames" in res.output and "complete" in res.output


def test_plain_rows_write_every_kind_of_value_without_a_repr() -> None:
    """`dab inspect`'s manifest rows: a dict an entry a row (nested ones too), lists joined, None, bools and empty
    containers as words, so that a key added to the manifest later reads as well as those there now."""
    from dab_pipeline.cli.commands.output import plain, plain_rows

    value = {"backend": "pyav", "short_side": None, "sizes": [224, 336], "nested": {"on": True}, "none": {}}
    assert plain_rows("decoder", value) == [
        ("decoder.backend", "pyav"),
        ("decoder.short_side", "-"),
        ("decoder.sizes", "224, 336"),
        ("decoder.nested.on", "yes"),
        ("decoder.none", "-"),
    ]
    assert plain_rows("trainable_blocks", None) == [("trainable_blocks", "-")]
    assert plain_rows("frames", 12) == [("frames", "12")]
    assert plain([]) == "-" and plain([{"a": 1, "b": False}, {"a": 2}]) == "a: 1, b: no; a: 2"


def test_the_demos_commands_fit_120_columns_and_paste_back_as_typed() -> None:
    """`make demo` prints each command it runs: continued with backslashes within 120 columns (its search was a
    250-column line), an option beside its value, and the lines, pasted in a shell, the same command."""
    import shlex

    from dab_pipeline.cli.demo import QUERIES, shell_lines

    folder = "/home/someone/projects/dab/demo_out"
    args = ["search", "--run", f"{folder}/runs/dab", "--features", f"{folder}/store.h5", "-k", "5"]
    args += ["--descriptions", f"{folder}/world/descriptions.json", "--html", f"{folder}/search.html", *QUERIES]
    shown = shell_lines(args)
    lines = shown.splitlines()
    assert len(lines) > 1 and all(len(x) <= 120 for x in lines), shown
    assert all(x.endswith(" \\") for x in lines[:-1]) and lines[0].startswith("$ dab search ")
    assert shlex.split(shown[2:].replace("\\\n", " ")) == ["dab", *args]
    assert any(f"--descriptions {folder}/world/descriptions.json" in x for x in lines), shown
    assert shell_lines(["inspect", "store.h5"]) == "$ dab inspect store.h5"


def _argv_through_sh(shown: str) -> list[str]:
    """The arguments /bin/sh hands to `dab` when it runs the lines ``shown`` (without their "$ "), as pasted."""
    import json
    import os
    import subprocess
    import sys

    assert shown.startswith("$ dab ")
    script = 'dab() { "$PY" -c "import json, sys; print(json.dumps(sys.argv[1:]))" "$@"; }\n' + shown[2:]
    env = {**os.environ, "PY": sys.executable}
    out = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_an_argument_longer_than_a_line_is_echoed_on_lines_that_paste_back_as_that_argument() -> None:
    """The demo's last search quoted a 206-character caption on one 222-column line: an argument longer than a line
    is now written in double quotes broken with backslash-newline, every line within the width, and /bin/sh reads
    the lines back as exactly the arguments given: spaces, quotes, $, backquotes, backslashes and ! included, and a
    word longer than a line (broken inside it)."""
    from dab_pipeline.cli.demo import shell_lines

    caption = " ".join(["a large white cross and a small purple square on a brick wall,"] * 5)[:300]
    awkward = ('the "$HOME" of `id`, a back\\slash, it\'s done! ' * 8)[:300]
    word = "x" * 300  # no space to break at
    args = ["search", "--run", "/runs/dab", "-k", "3", "a large red circle", caption, "--max-risk", "0.2"]
    for extra in ([], [awkward], [word, "--json"]):
        shown = shell_lines([*args, *extra])
        lines = shown.splitlines()
        assert all(len(x) <= 120 for x in lines), "\n".join(x for x in lines if len(x) > 120)
        assert all(x.endswith("\\") for x in lines[:-1]), shown
        assert len(caption) == 300 and any(x.startswith('    "a large white cross') for x in lines), shown
        assert _argv_through_sh(shown) == [*args, *extra]
    assert "-k 3 'a large red circle'" in shown  # the short arguments as before
