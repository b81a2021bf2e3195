"""`make demo`: the main job end to end on the embedded default dataset.

Generates a small synthetic video dataset (coloured frames whose captions name
the set of colours), then runs the same `dab` commands a user would run on a
real dataset, printing each one: extract (tiny CLIP, random weights), train the
`xpool` baseline and the full `dab` model, evaluate both and compare them.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
from pathlib import Path

# Small enough for 2 CPU cores in a few minutes; the model keeps the paper's
# structure, only its widths and step count shrink with the tiny CLIP (D=32).
DEMO_MODEL_SETTINGS = ("model.drift_hidden=128", "model.time_embed_dim=32")


def _run(args: list[str]) -> None:
    from .cli import cli

    print(f"\n$ dab {shlex.join(args)}", flush=True)
    try:
        cli.main(args=args, prog_name="dab", standalone_mode=False)
    except SystemExit as exc:  # click exits 0 on success in some paths
        if exc.code not in (0, None):
            raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("demo_out"), help="working folder (rebuilt each time)")
    ap.add_argument("--videos", type=int, default=120, help="number of synthetic videos")
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--steps", type=int, default=8, help="bridge steps T' for the dab run")
    ap.add_argument("--backend", choices=["h5", "zarr"], default="h5")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    from .cli import _register
    from .synthetic import make_demo_dataset

    _register()
    t0 = time.time()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    print(f"generating {args.videos} synthetic videos in {out / 'data'} ...", flush=True)
    captions = make_demo_dataset(out / "data", num_videos=args.videos)
    store = out / f"store.{args.backend}"
    q = ["--quiet"] if args.quiet else []
    _run(["extract", "--dataset", "folder", "--videos", str(out / "data" / "videos"), "--annotations", str(captions),
          "--model", "dab-tiny", "--frames", "12", "--out", str(store), *q])
    _run(["inspect", str(store)])
    runs = []
    for variant in ("xpool", "dab"):
        run = out / "runs" / variant
        extra = ["--steps", str(args.steps)] if variant == "dab" else []
        sets = [x for s in DEMO_MODEL_SETTINGS for x in ("--set", s)]
        _run(["train", "--features", str(store), "--variant", variant, *extra, "--epochs", str(args.epochs),
              "--batch-size", "16", "--set", "lr=5e-3", *sets, "--out", str(run), *q])
        _run(["evaluate", "--run", str(run)])
        runs.append(str(run))
    _run(["compare", *runs, "--out", str(out / "comparison.md")])
    print(f"\ndemo finished in {time.time() - t0:.0f} s; everything is under {out}/", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
