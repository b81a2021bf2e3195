"""The click commands.  Each resolves a stage config once, then calls the stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from . import cli
from .progress import RichProgress

_PATH = click.Path(path_type=Path)
_EXISTING = click.Path(path_type=Path, exists=True)


def _console():
    from rich.console import Console

    return Console()


@cli.command()
@click.option("--dataset", required=True, help="Dataset format: msrvtt, msvd, vatex or folder.")
@click.option("--videos", type=_PATH, default=None, help="Folder holding the video files.")
@click.option("--annotations", type=_PATH, default=None, help="Annotation folder or file (captions and splits).")
@click.option("--out", type=_PATH, default=Path("store.h5"), show_default=True,
              help="Store to write: *.h5 (HDF5) or *.zarr (Zarr v3).")
@click.option("--model", default="ViT-B-32", show_default=True, help="open_clip architecture (or dab-tiny).")
@click.option("--pretrained", default="openai", show_default=True,
              help="open_clip pretrained tag or a local weights file; 'none' for dab-tiny's random weights.")
@click.option("--frames", type=int, default=12, show_default=True, help="Frames sampled per video.")
@click.option("--trainable-blocks", type=int, default=None,
              help="Also store the states entering the last K transformer blocks (partial fine-tuning in stage two).")
@click.option("--dtype", "compute_dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="CLIP's dtype while encoding (bfloat16 is ~2x faster on AVX-512 bf16 CPUs).")
@click.option("--store-dtype", type=click.Choice(["float16", "float32"]), default="float16", show_default=True)
@click.option("--batch-size", type=int, default=16, show_default=True, help="Videos per encoding batch.")
@click.option("--workers", type=int, default=2, show_default=True, help="Decoding worker processes.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--option", "dataset_options", multiple=True, metavar="KEY=VALUE",
              help="Dataset loader option, e.g. train_split=7k or val_size=0 (repeatable).")
@click.option("--limit", type=int, default=None, help="Only the first N videos (a quick trial).")
@click.option("--overwrite", is_flag=True, help="Rebuild the store even if one exists with another configuration.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override any ExtractConfig field.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def extract(dataset, videos, annotations, out, model, pretrained, frames, trainable_blocks, compute_dtype,
            store_dtype, batch_size, workers, device, dataset_options, limit, overwrite, overrides, quiet) -> None:
    """Decode videos, encode frames and captions with CLIP, and cache the features in a store.

    Running the same command again resumes: finished videos are skipped.
    """
    from ..config import apply_overrides
    from ..stages.extract import ExtractConfig, run_extract

    try:
        cfg = ExtractConfig(
            dataset=dataset, out=out, videos=videos, annotations=annotations,
            dataset_options=tuple(dataset_options), model=model,
            pretrained=None if pretrained in ("none", "None", "") else pretrained,
            frames=frames, trainable_blocks=trainable_blocks, compute_dtype=compute_dtype,
            store_dtype=store_dtype, batch_size=batch_size, workers=workers, device=device,
            limit=limit, overwrite=overwrite,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    cfg = apply_overrides(cfg, overrides)
    with RichProgress(quiet=quiet) as prog:
        res = run_extract(cfg, progress=prog)
    msg = (f"{res.store}: {res.videos_ok} videos encoded, {res.videos_skipped} already done, "
           f"{res.videos_failed} failed, {res.videos_missing} missing; {res.captions} captions")
    click.echo(msg)
    if res.failures:
        click.echo(f"failures (first {min(5, len(res.failures))}):", err=True)
        for vid, err in res.failures[:5]:
            click.echo(f"  {vid}: {err}", err=True)


@cli.command()
@click.argument("store", type=_EXISTING)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest and summary as JSON.")
def inspect(store: Path, as_json: bool) -> None:
    """Print a store's manifest, counts per split and array sizes."""
    from rich.table import Table

    from ..store import open_store

    with open_store(store) as st:
        manifest = st.manifest
        summary = st.summary()
    if as_json:
        click.echo(json.dumps({"manifest": manifest, "summary": summary}, indent=2, default=str))
        return
    con = _console()
    t = Table(title=f"{store}", show_header=False)
    for key in ("model", "pretrained", "weights_sha256", "quick_gelu", "frames", "image_size", "compute_dtype",
                "store_dtype", "trainable_blocks", "dataset", "dataset_options", "package_version", "created",
                "world_size"):
        if key in manifest:
            t.add_row(key, str(manifest[key]))
    con.print(t)
    s = Table(title="contents", show_header=False)
    for key, val in summary.items():
        s.add_row(str(key), json.dumps(val, default=str) if isinstance(val, (dict, list)) else str(val))
    con.print(s)
