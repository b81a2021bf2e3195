"""extracting of :mod:`commands` (see the package docstring)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ...core.choices import CLIP_DTYPES, DECODE_BACKENDS, STORE_DTYPES
from ...core.errors import DatasetError
from .. import cli
from ..progress import RichProgress
from .options import EXISTING, EXTRACT_TIMEOUT, NEW_STORE, PATH, typed
from .output import console, echo_line, echo_survey, human_bytes, plain_rows, quiet_shared_errors


@cli.command()
@click.option(
    "--dataset",
    required=True,
    help="Dataset format: msrvtt, msvd, vatex, didemo, activitynet, charades, lsmdc or folder (docs/datasets.md).",
)
@click.option("--videos", type=PATH, default=None, help="Folder holding the video files.")
@click.option("--annotations", type=PATH, default=None, help="Annotation folder or file (captions and splits).")
@click.option(
    "--out",
    type=NEW_STORE,
    default="store.h5",
    show_default=True,
    help="Store to write: *.h5 (HDF5) or *.zarr (Zarr v3), or a *.zarr fsspec URL (s3://bucket/store.zarr).",
)
@click.option(
    "--model",
    default="ViT-B-32",
    show_default=True,
    help="open_clip architecture, or dab-world (the procedural world's CLIP) / dab-tiny (tests).",
)
@click.option(
    "--pretrained",
    default=None,
    help="open_clip pretrained tag or a local weights file (default: openai; dab-world and dab-tiny: "
    "their own weights).",
)
@click.option(
    "--frames",
    type=click.IntRange(1, 256),  # = stages.extract.config.MAX_FRAMES (a test checks)
    default=12,
    show_default=True,
    help="Frames sampled per video (12 as X-Pool; 64 for long videos; at most 256).",
)
@click.option(
    "--trainable-blocks",
    default=None,
    metavar="K|all",
    help="Also store the states entering the last K transformer blocks of both towers (fine-tuning in "
    "stage two); all: every block (12 for ViT-B/32 and B/16).",
)
@click.option(
    "--dtype",
    "compute_dtype",
    type=click.Choice(CLIP_DTYPES),
    default="auto",
    show_default=True,
    help="CLIP's dtype while encoding; auto: bf16 where the device multiplies bf16 natively (autocast "
    "on CUDA 8.0+, the converted model on AMX / AVX512-BF16 CPUs: 1.4-2.6x faster), else float32 "
    "(float16 on older GPUs); a resumed store keeps its dtype. bf16 asked on a CPU without it runs "
    "float32, with a warning. Recorded in the manifest.",
)
@click.option("--store-dtype", type=click.Choice(STORE_DTYPES), default="float16", show_default=True)
@click.option(
    "--train-views",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Also store N augmented views of every training video (X-Pool's random resized crop + flip, "
    "seeded per video and view); dab train draws one per video per epoch.",
)
@click.option("--batch-size", type=int, default=16, show_default=True, help="Videos per encoding batch.")
@click.option("--workers", type=int, default=2, show_default=True, help="Decoding worker processes.")
@click.option(
    "--decoder",
    "decode_backend",
    type=click.Choice(DECODE_BACKENDS),
    default="pyav",
    show_default=True,
    help="pyav: exact frames from every container (sequential read); pyav-seek: seek to key frames "
    "(long MP4/MKV/WebM videos); decord: decord's reader (clean MP4/MKV only). "
    "See docs/extraction.md.",
)
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option(
    "--option",
    "dataset_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Dataset loader option, e.g. train_split=7k or val_size=0 (repeatable).",
)
@click.option("--limit", type=int, default=None, help="Only the first N videos (a quick trial).")
@click.option("--overwrite", is_flag=True, help="Rebuild the store even if one exists with another configuration.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override any ExtractConfig field.")
@click.option(
    "--distributed/--no-distributed",
    default=None,
    help="One rank of a torchrun job: each process encodes its share of the videos "
    "(default: on when launched by torchrun). See docs/distributed.md.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Read the annotations and list the videos folder, decode nothing: per split the videos, queries and "
    "captions, the videos missing on disk, duplicate and empty queries. Exit 0 when every listed video is on "
    "disk and no query is empty, 1 otherwise.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def extract(
    dataset,
    videos,
    annotations,
    out,
    model,
    pretrained,
    frames,
    trainable_blocks,
    compute_dtype,
    store_dtype,
    train_views,
    batch_size,
    workers,
    decode_backend,
    device,
    dataset_options,
    limit,
    overwrite,
    overrides,
    distributed,
    dry_run,
    quiet,
) -> None:
    """Decode videos, encode frames and captions with CLIP, and cache the features in a store.

    Running the same command again resumes: finished videos are skipped.
    Several processes: `torchrun --nproc-per-node N -m dab_pipeline.cli extract ...`.
    """
    from ...stages.extract import build_extract_config, dry_run_extract  # deferred: `dab --help` must not import torch

    options = dict(
        videos=videos,
        annotations=annotations,
        dataset_options=tuple(dataset_options),
        model=model,
        pretrained=pretrained,
        frames=frames,
        trainable_blocks=trainable_blocks,
        compute_dtype=compute_dtype,
        store_dtype=store_dtype,
        train_views=train_views,
        batch_size=batch_size,
        workers=workers,
        device=device,
        decode_backend=decode_backend,
        limit=limit,
        overwrite=overwrite,
    )
    options.update(_resumed_options(click.get_current_context(), out, overwrite))
    cfg = build_extract_config(dataset, out, options=options, overrides=overrides)
    if dry_run:
        survey = dry_run_extract(cfg)
        echo_survey(survey)
        if survey.problems():
            raise DatasetError(f"dry run: {'; '.join(survey.problems())} (listed above)")
        return
    res = _run_extract(cfg, distributed, quiet)
    if res is not None:
        _extract_summary(res)


def _run_extract(cfg, distributed: bool | None, quiet: bool):
    """Extract with ``cfg``, as one rank of a torchrun job where ``distributed`` asks (or torchrun launched this
    process); the result, or None on a rank other than 0, which prints nothing."""
    from ...runtime.distributed import want_distributed  # deferred: `dab --help` must not import torch
    from ...stages.extract import run_extract  # deferred: `dab --help` must not import torch

    if not want_distributed(distributed):
        with RichProgress(quiet=quiet) as prog:
            return run_extract(cfg, progress=prog)
    from ...runtime.distributed import distributed_session  # deferred: `dab --help` must not import torch

    # gloo even on GPUs: extraction exchanges only small control messages (the
    # features go to the store), and gloo's long timeout covers ranks that
    # wait for a slower share or for rank 0's HDF5 merge.
    with distributed_session(cfg.device, backend="gloo", timeout=EXTRACT_TIMEOUT) as ctx:
        with quiet_shared_errors(ctx), RichProgress(quiet=quiet or not ctx.is_main) as prog:
            res = run_extract(cfg, progress=prog, dist=ctx)
        return res if ctx.is_main else None


def _resumed_options(ctx: click.Context, out: Path, overwrite: bool) -> dict:
    """The store's own values of the options not typed: rerunning the command resumes the store at --out, and
    an option left out of the rerun is not a change (only a typed one that differs is refused)."""
    from ...stages.extract.config import stored_options  # deferred: `dab --help` must not import torch

    if overwrite:
        return {}
    stored = stored_options(out)
    if typed(ctx, "model") and ctx.params["model"] != stored.get("model"):
        stored.pop("pretrained", None)  # the store's weights tag belongs to the store's model
    taken = {k: v for k, v in stored.items() if not typed(ctx, k)}
    differ = {k: v for k, v in taken.items() if _spelled(v) != _spelled(ctx.params.get(k))}
    if differ:  # said, so that a rerun never silently takes another model than its options' defaults name
        echo_line(
            f"options not given, taken from {out}: "
            + ", ".join(f"{k}={v}" for k, v in sorted(differ.items()))
            + " (type one to change it: a value that differs from the store's is refused)",
            err=True,
        )
    return taken


def _spelled(value) -> str:
    return "none" if value is None else str(value).lower()


def _extract_summary(res) -> None:
    """What an extract did: the store on a line of its own, then the counts and times (each line within 120
    columns in a log, whatever the store's path)."""
    echo_line(f"{res.store}:")  # a path longer than the console folds onto the next line
    click.echo(
        f"  {res.videos_ok} videos encoded, {res.videos_skipped} already done, "
        f"{res.videos_failed} failed, {res.videos_missing} missing; {res.captions} captions"
    )
    done = res.videos_ok + res.videos_failed
    rate = ""
    if done and res.video_seconds > 0:
        rate = f"{done} videos in {res.video_seconds:.2f} s ({done / res.video_seconds:.1f} videos/s); "
    click.echo(f"  {rate}{res.seconds:.2f} s in all")
    earlier = res.store_failed - res.videos_failed
    echo_line(
        f"store: {res.store_ok} ok, {res.store_failed} failed"
        + (f" ({earlier} in earlier runs)" if earlier > 0 else "")
        + f", {res.store_missing} missing; {len(res.warnings)} of this run's videos have decoder warnings"
    )
    if res.truncation_note:
        echo_line(res.truncation_note)
    if res.failures:
        click.echo(f"failures (first {min(5, len(res.failures))}):", err=True)
        for vid, err in res.failures[:5]:
            echo_line(f"  {vid}: {err}", err=True)
    if res.warnings:
        click.echo(f"warnings (first {min(5, len(res.warnings))}; `dab inspect` lists all):", err=True)
        for vid, note in res.warnings[:5]:
            echo_line(f"  {vid}: {note}", err=True)


@cli.command()
@click.argument("store", type=EXISTING)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest and summary as JSON.")
@click.option(
    "--verify",
    is_flag=True,
    help="Also read back every array the store records as written, end to end (exit 1 on damage).",
)
def inspect(store: Path, as_json: bool, verify: bool) -> None:
    """Print a store's manifest, counts per split and array sizes."""
    from ...store import open_store  # deferred: start-up (h5py, zarr)

    with open_store(store) as st:
        manifest = st.manifest
        summary = st.summary()
        warnings = st.warnings()
        failures = st.failures()
        problems = st.verify() if verify else None
    if as_json:
        click.echo(
            json.dumps(
                {"manifest": manifest, "summary": summary, "warnings": dict(warnings), "failures": dict(failures)}
                | ({} if problems is None else {"verify": problems}),
                indent=2,
                default=str,
            )
        )
    else:
        _print_store(store, manifest, summary, warnings, failures, problems)
    if problems:
        raise SystemExit(1)


# The manifest's entries `dab inspect` shows, in this order (--json shows all).
_MANIFEST_KEYS = (
    "model",
    "pretrained",
    "weights_sha256",
    "quick_gelu",
    "frames",
    "image_size",
    "compute_dtype",
    "store_dtype",
    "trainable_blocks",
    "decoder",
    "dataset",
    "dataset_options",
    "package_version",
    "created",
    "world_size",
)


def _print_store(store: Path, manifest: dict, summary: dict, warnings, failures, problems: list | None) -> None:
    """`dab inspect` as tables: the manifest, the splits, the arrays, the videos that failed or warned, the
    store's state and, after --verify, what is damaged."""
    con = console()
    con.print(_manifest_table(store, manifest))
    con.print(_splits_table(summary))
    arrays = summary.get("arrays", {})
    if arrays:
        con.print(_arrays_table(arrays))
    for title, rows in (("failed videos", failures), ("decoder warnings", warnings)):
        if rows:
            _print_video_notes(con, title, rows)
    con.print(
        f"{summary.get('backend')} store, {_store_state(summary)}; file size {human_bytes(summary.get('file_bytes'))}"
    )
    if problems is not None:
        for line in problems[:50]:
            con.print(f"[red]damaged:[/] {line}")
        con.print(f"verify: {len(problems)} problem(s)" if problems else "verify: every written array reads back")


def _manifest_table(store: Path, manifest: dict):
    from rich.table import Table

    t = Table(title=f"{store}", show_header=False)
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")  # a long value wraps between its words; a long word (a path) folds, whole
    for key in _MANIFEST_KEYS:
        if key in manifest:
            # a dict entry per row (decoder.backend, ...), None "-", lists joined: no Python repr in the table
            for name, text in plain_rows(key, manifest[key]):
                t.add_row(name, text)
    return t


def _splits_table(summary: dict):
    from rich.table import Table

    s = Table(title="videos and captions per split")
    for col in ("split", "videos", "ok", "failed", "missing", "pending", "captions", "captions done"):
        s.add_column(col, justify="left" if col == "split" else "right")
    for split, c in summary.get("splits", {}).items():
        s.add_row(
            split,
            *[str(c.get(k, "")) for k in ("videos", "ok", "failed", "missing", "pending", "captions", "captions_done")],
        )
    return s


def _arrays_table(arrays: dict):
    from rich.table import Table

    a = Table(title="arrays")
    for col in ("name", "shape", "dtype", "bytes on disk"):
        a.add_column(col, justify="left" if col in ("name", "dtype") else "right")
    for name, info in arrays.items():
        a.add_row(
            name,
            "x".join(map(str, info.get("shape", []))),
            str(info.get("dtype", "")),
            human_bytes(info.get("stored_bytes")),
        )
    return a


def _print_video_notes(con, title: str, rows) -> None:
    """The first 50 (video, message) rows as a table, and how many more."""
    from rich.table import Table

    w = Table(title=f"{title} ({len(rows)})")
    w.add_column("video")
    w.add_column("message")
    for vid, text in rows[:50]:
        w.add_row(vid, text)
    con.print(w)
    if len(rows) > 50:
        con.print(f"... and {len(rows) - 50} more (dab inspect --json lists all)")


def _store_state(summary: dict) -> str:
    if summary.get("missing_chunks"):
        return (
            f"damaged: {summary['missing_chunks']} chunk file(s) of written rows are missing (run the same "
            "extract command to extract them again)"
        )
    if summary.get("complete"):
        return "complete"
    return "incomplete (run the same extract command to resume)"
