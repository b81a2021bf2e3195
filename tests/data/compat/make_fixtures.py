"""Writes the compatibility fixtures: a store (HDF5 and Zarr), a trained and evaluated run, an index and a sweep
folder, as this version of dab writes them. They are committed; tests/test_compat.py checks that later versions
still read them. Run from the repository root: `python tests/data/compat/make_fixtures.py` (once per format change
worth guarding; never to make a failing compatibility test pass)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SMALL = ["--set", "model.drift_hidden=16", "--set", "model.time_embed_dim=8", "--set", "model.steps=2",
         "--set", "batch_size=4", "--set", "lr=3e-3"]


def main() -> None:
    from click.testing import CliRunner

    from dab_pipeline import __version__
    from dab_pipeline.cli import cli
    from dab_pipeline.testing import random_store

    out = HERE / "v1"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    os.chdir(out)  # recorded paths are relative to here, as a user's runs beside their store
    splits = ["train"] * 8 + ["val"] * 2 + ["test"] * 4
    for name in ("store.h5", "store.zarr"):
        random_store(Path(name), n_videos=14, caps_per_video=1, dim=16, frames=3, splits=splits)

    def dab(*args: str) -> None:
        res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        assert res.exit_code == 0, res.output

    dab("train", "--features", "store.h5", "--out", "run", "--variant", "dab", "--epochs", "1", "--quiet", *SMALL)
    dab("evaluate", "--run", "run")
    dab("index", "--features", "store.h5", "--out", "index")
    dab("sweep", "--features", "store.zarr", "--out", "sweep", "--grid", "model.variant=prob", "--seeds", "1",
        "--set", "epochs=1", *SMALL, "--quiet")
    for junk in [*Path(".").rglob("*.png"), *Path(".").rglob("*.html"), *Path(".").rglob(".lock")]:
        junk.unlink()  # pictures and pages are not formats to keep reading
    (out / "VERSION").write_text(json.dumps({"dab": __version__}) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({size / 1e3:.0f} kB)", file=sys.stderr)


if __name__ == "__main__":
    main()
