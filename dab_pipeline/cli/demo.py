"""`make demo`: the main job end to end on the procedural world, with retrieval you can check.

Writes a small world (a few hundred mp4 clips of shapes on backgrounds, captions
from a grammar, and what every clip really shows), then runs the commands a
user runs on a real dataset, printing each one: extract with ``dab-world`` (the
world's own pretrained CLIP, shipped with dab), train the ``xpool`` baseline and
the full ``dab`` model with the world recipe, evaluate and compare them, and
search the test videos with free-text queries, each hit shown with what the
video really contains; then calibrate the dab run on its validation captions and
search every video with a 90 % conformal set.
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import shutil
import sys
import textwrap
import time
from pathlib import Path

from ..world import make_world, world_preset
from . import cli, register_commands
from .progress import LOG_WIDTH

DEMO_MAX_RISK = 0.2  # the risk the demo's last search answers under (README: some queries are answered there)
# Free-text queries for `dab search`: words of the world, phrasings of one's own.
QUERIES = ("a large red circle", "two shapes on sand", "a small white ring on a navy background")


def _run(args: list[str]) -> None:
    print(f"\n{shell_lines(args)}", flush=True)
    try:
        cli.main(args=args, prog_name="dab", standalone_mode=False)
    except SystemExit as exc:  # click exits 0 on success in some paths
        if exc.code not in (0, None):
            raise


def shell_lines(args: list[str], width: int = LOG_WIDTH) -> str:
    """``$ dab ARGS`` as a user would type it, continued with `` \\`` between arguments so that no line passes
    ``width`` columns (the log's; an option stays with its value). An argument too long for a line of its own (the
    demo's last query) is written in double quotes, broken with backslash-newline: the lines still paste into a
    POSIX shell as that one argument."""
    indent = "    "
    units: list[str] = []
    long: set[int] = set()  # indices in units of the arguments written across lines
    for arg in args:
        word = shlex.quote(arg)
        if len(indent + word + " \\") > width:
            long.add(len(units))
            units.append(arg)
        elif units and units[-1].startswith("-") and " " not in units[-1] and not word.startswith("-"):
            units[-1] += " " + word  # --option value
        else:
            units.append(word)
    lines, line = [], "$ dab"
    for i, word in enumerate(units):
        if i in long:
            lines.append(line + " \\")
            *head, line = _double_quoted_lines(word, indent, width)
            lines += head
            continue
        if len(line) + 1 + len(word) + 2 > width and line.strip() not in ("$ dab", ""):
            lines.append(line + " \\")
            line = indent[:-1]
        line += " " + word
    return "\n".join([*lines, line])


def _double_quoted_lines(arg: str, indent: str, width: int) -> list[str]:
    """``arg`` in double quotes on lines of at most ``width`` columns (the last one leaving room for `` \\``), the
    first indented and every line but the last ended with a backslash: inside double quotes a POSIX shell removes
    backslash-newline, so the lines are one argument again. Broken after a space where one falls in the line, else
    between two characters; the continuation lines start at column 0, an indentation would be part of the argument.
    ``\\``, ``"``, ``$`` and a backquote are escaped; ``!`` is single-quoted, as bash expands it between double
    quotes in an interactive shell."""
    esc = ["\\" + c if c in '\\"$`' else "\"'!'\"" if c == "!" else c for c in arg]  # one unit a character
    lines: list[str] = []
    line = start = indent + '"'
    i = 0
    while i < len(esc):
        j = next((k + 1 for k in range(i, len(esc)) if esc[k] == " "), len(esc))  # the word and its space
        tail = 3 if j == len(esc) else 1  # '" \\' after the last word, '\\' after any other
        if len(line) + sum(map(len, esc[i:j])) + tail <= width:
            line += "".join(esc[i:j])
            i = j
            continue
        if line not in (start, ""):
            lines.append(line + "\\")
            line = ""
            continue
        # a word longer than a line: as much of it as fits, the rest on the next lines
        while i < j and len(line) + len(esc[i]) + (3 if i + 1 == len(esc) else 1) <= width:
            line += esc[i]
            i += 1
        if i < len(esc):
            lines.append(line + "\\")
            line = ""
    return [*lines, line + '"']


def _say(text: str) -> None:
    """A line of the demo's own, wrapped between words within the log's 120 columns."""
    print(textwrap.fill(text, LOG_WIDTH, break_long_words=False, break_on_hyphens=False), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    register_commands()
    t0 = time.time()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    captions = _every_validation_caption(_write_world(args.world, out))
    store = out / f"store.{args.backend}"
    q = ["--quiet"] if args.quiet else []
    _extract(out / "world" / "videos", captions, store, q)
    _run(["inspect", str(store)])
    runs = [_train(store, out / "runs" / v, v, args.epochs, args.steps, q) for v in ("xpool", "dab")]
    # calibrated on every caption of the validation videos against every video (the gallery the searches use),
    # before dab evaluate, so that report.md has its calibration section
    _run(["calibrate", "--run", runs[-1], "--gallery", "all", "--quiet"])
    for run in runs:
        _run(["evaluate", "--run", run])
    _run(["compare", *runs, "--out", str(out / "comparison.md")])
    _search(runs[-1], store, out, specific_caption(out / "world" / "captions_all.csv"))
    print(flush=True)
    _say(
        f"open {out / 'runs' / 'dab' / 'examples.html'} (test queries, with thumbnails of what was retrieved) "
        f"and {out / 'search.html'} (the last search: each hit marked in or out of its 90 % set) in a browser"
    )
    print(flush=True)
    _say(f"demo finished in {time.time() - t0:.0f} s; everything is under {out}/")
    print(flush=True)
    _say(path_hint())
    return 0


def path_hint() -> str:
    """How to type the commands above yourself: `dab` is in the environment that runs this demo."""
    here = Path(sys.executable).parent / "dab"
    found = shutil.which("dab")
    if found and Path(found).resolve() == here.resolve():
        return "the commands above are yours to run: `dab` is on your PATH (dab --help lists them)"
    activate = Path(sys.executable).parent / "activate"
    if activate.is_file():
        shown = os.path.relpath(activate) if not os.path.relpath(activate).startswith("..") else str(activate)
        return f"to run the commands above yourself: `source {shown}` (then `dab --help`), or call {here} directly"
    return f"to run the commands above yourself, call {here} (dab --help lists them)"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("demo_out"), help="working folder (rebuilt each time)")
    ap.add_argument("--world", default="demo", help="world preset (dab_pipeline/world/presets.json)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--steps", type=int, default=8, help="bridge steps T' for the dab run")
    ap.add_argument("--backend", choices=["h5", "zarr"], default="h5")
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def _write_world(preset: str, out: Path) -> Path:
    """The world ``preset`` written under ``out / "world"``; its captions file."""
    cfg = world_preset(preset)
    _say(
        f"writing the {preset!r} world ({cfg.train} train / {cfg.val} val / {cfg.test} test clips) to {out / 'world'} ..."
    )
    return make_world(out / "world", cfg, workers=2)


def _extract(videos: Path, captions: Path, store: Path, q: list[str]) -> None:
    _run(
        [
            "extract",
            "--dataset",
            "folder",
            "--videos",
            str(videos),
            "--annotations",
            str(captions),
            "--model",
            "dab-world",
            "--out",
            str(store),
            *q,
        ]
    )


def _every_validation_caption(captions: Path) -> Path:
    """A captions file beside ``captions`` with every caption of the validation videos (the world writes them all in
    captions_all.csv), the test videos keeping their one query: the calibration's queries, several a video (the
    video is the unit), instead of one a video (30 queries to fit a probability on)."""
    out = captions.with_name("captions_demo.csv")

    def rows(path: Path) -> list[dict]:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))

    every, one = rows(captions.parent / "captions_all.csv"), rows(captions)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(every[0]))
        w.writeheader()
        w.writerows([r for r in every if r["split"] != "test"] + [r for r in one if r["split"] == "test"])
    return out


def _train(store: Path, run: Path, variant: str, epochs: int, steps: int, q: list[str]) -> str:
    """Train ``variant`` on ``store`` with the world's recipe (dab_pipeline/recipes/world.json); the run folder
    (``steps``: the bridge steps T' of the dab variant)."""
    sets = ["--recipe", "world", "--epochs", str(epochs)]
    extra = ["--steps", str(steps)] if variant == "dab" else []
    _run(["train", "--features", str(store), "--variant", variant, *extra, *sets, "--out", str(run), *q])
    return str(run)


def specific_caption(captions_all: Path) -> str:
    """The first caption of the world's first test video that describes the whole video (level "video", the most
    specific of the grammar's four): a query that names what one video shows, beside the demo's vague ones. Chosen by
    this rule, not by how the search does with it."""
    with open(captions_all, newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["split"] == "test"]
    first = rows[0]["video_id"]
    return next(r["caption"] for r in rows if r["video_id"] == first and r["level"] == "video")


def _search(run: str, store: Path, out: Path, specific: str) -> None:
    _run(
        [
            "search",
            "--run",
            run,
            "--features",
            str(store),
            "-k",
            "5",
            "--descriptions",
            str(out / "world" / "descriptions.json"),
            *QUERIES,
        ]
    )
    _say(
        "the run was calibrated on every video (split all), so on the test split alone its numbers are marked (~) "
        "and promise nothing; the search below is of every video"
    )
    # a search of every video (the gallery calibrated on) with 90 % sets, answered where the risk allows: two vague
    # queries and one that describes a test video whole
    _run(
        [
            "search",
            "--run",
            run,
            "--features",
            str(store),
            "--split",
            "all",
            "-k",
            "3",
            "--coverage",
            "0.9",
            "--max-risk",
            str(DEMO_MAX_RISK),
            "--html",
            str(out / "search.html"),
            *QUERIES[:2],
            specific,
        ]
    )
    _say(
        "a vague query gets a long set and a low P(first); one that says what a video shows a shorter set and a "
        f"higher one. At max risk {DEMO_MAX_RISK} nothing is answered: the per-video risk test needs far more held-out "
        "videos with confident answers than the demo's 30 (500 more calibration videos answered nothing at 0.1-0.3 on "
        "worlds like this one: benchmarks/risk_calibration_split.py, docs/uncertainty.md)"
    )


if __name__ == "__main__":
    sys.exit(main())
