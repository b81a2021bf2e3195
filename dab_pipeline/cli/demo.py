"""`make demo`: the main job end to end on the procedural world, with retrieval you can check.

Writes a small world (a few hundred mp4 clips of shapes on backgrounds, captions
from a grammar, and what every clip really shows), then runs the commands a
user runs on a real dataset, printing each one: extract with ``dab-world`` (the
world's own pretrained CLIP, shipped with dab), train the ``xpool`` baseline and
the full ``dab`` model with the world recipe, evaluate and compare them, and
search the test videos with free-text queries, each hit shown with what the
video really contains.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
from pathlib import Path

from ..world import make_world, world_preset
from . import cli, register_commands

# Free-text queries for `dab search`: words of the world, phrasings of one's own.
QUERIES = ("a large red circle", "two shapes on sand", "a small white ring on a navy background")


def _run(args: list[str]) -> None:
    print(f"\n$ dab {shlex.join(args)}", flush=True)
    try:
        cli.main(args=args, prog_name="dab", standalone_mode=False)
    except SystemExit as exc:  # click exits 0 on success in some paths
        if exc.code not in (0, None):
            raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("demo_out"), help="working folder (rebuilt each time)")
    ap.add_argument("--world", default="demo", help="world preset (dab_pipeline/world/presets.json)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--steps", type=int, default=8, help="bridge steps T' for the dab run")
    ap.add_argument("--backend", choices=["h5", "zarr"], default="h5")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    register_commands()
    t0 = time.time()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cfg = world_preset(args.world)
    print(
        f"writing the {args.world!r} world ({cfg.train} train / {cfg.val} val / {cfg.test} test clips) "
        f"to {out / 'world'} ...",
        flush=True,
    )
    captions = make_world(out / "world", cfg, workers=2)
    store = out / f"store.{args.backend}"
    q = ["--quiet"] if args.quiet else []
    _run(
        [
            "extract",
            "--dataset",
            "folder",
            "--videos",
            str(out / "world" / "videos"),
            "--annotations",
            str(captions),
            "--model",
            "dab-world",
            "--out",
            str(store),
            *q,
        ]
    )
    _run(["inspect", str(store)])
    sets = ["--recipe", "world", "--epochs", str(args.epochs)]  # the world's recipe (dab_pipeline/recipes/world.json)
    runs = []
    for variant in ("xpool", "dab"):
        run = out / "runs" / variant
        extra = ["--steps", str(args.steps)] if variant == "dab" else []
        _run(["train", "--features", str(store), "--variant", variant, *extra, *sets, "--out", str(run), *q])
        _run(["evaluate", "--run", str(run)])
        runs.append(str(run))
    _run(["compare", *runs, "--out", str(out / "comparison.md")])
    _run(
        [
            "search",
            "--run",
            runs[-1],
            "--features",
            str(store),
            "-k",
            "5",
            "--descriptions",
            str(out / "world" / "descriptions.json"),
            "--html",
            str(out / "search.html"),
            *QUERIES,
        ]
    )
    print(
        f"\nopen {out / 'runs' / 'dab' / 'examples.html'} (test queries, with thumbnails of what was retrieved) "
        f"and {out / 'search.html'} (the queries above) in a browser",
        flush=True,
    )
    print(f"\ndemo finished in {time.time() - t0:.0f} s; everything is under {out}/", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
