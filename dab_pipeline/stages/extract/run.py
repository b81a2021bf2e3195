"""run_extract: one code path for one process and for every rank of a torchrun job."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ...clip_models import encode_images, encode_texts, load_clip
from ...core.errors import ExtractionFailed, StoreError, WriteError
from ...core.events import Event, ProgressCallback, null_progress
from ...core.location import location
from ...core.write_errors import write_failure
from ...datasets import load_dataset
from ...runtime.devices import resolve_device
from ...runtime.distributed import LocalContext, mark_shared
from ...store import STATUS_FAILED, STATUS_MISSING, STATUS_OK, open_store
from .config import ExtractConfig, ExtractResult, build_manifest, parse_options, resolve_compute_dtype
from .texts import text_truncation
from .workers import encode_captions, encode_videos
from .writers import ExistingStore, ExtractJob, StoreWriter, choose_writer, existing_store

if TYPE_CHECKING:
    from ...runtime.distributed import DistContext

_COUNTS = (
    "videos_total",
    "videos_ok",
    "videos_failed",
    "videos_missing",
    "videos_skipped",
    "store_ok",
    "store_failed",
    "store_missing",
)


def run_extract(
    cfg: ExtractConfig, progress: ProgressCallback = null_progress, dist: Optional["DistContext"] = None
) -> ExtractResult:
    """Build (or resume) the feature store described by ``cfg``.

    ``dist``: this process is one rank of a torchrun job (see
    :mod:`dab_pipeline.runtime.distributed`); each rank encodes its share of the videos.
    None (or a one-process job) is the plain single-process extraction. Captions
    are encoded by rank 0 alone: the text tower costs a small fraction of the
    frames' work, and the ragged token-state array cannot be cut at caption
    boundaries into chunk-aligned shares.
    """
    t0 = time.perf_counter()
    ctx = dist if dist is not None and dist.world_size > 1 else LocalContext(resolve_device(cfg.device))
    if not ctx.is_main:
        progress = null_progress  # one progress display: rank 0's
    out = location(cfg.out)
    catalogue, videos, captions, missing = _load_catalogue(cfg, progress)
    resumed = None if cfg.overwrite else out
    cfg = dataclasses.replace(
        cfg, compute_dtype=resolve_compute_dtype(cfg.compute_dtype, ctx.device, resumed, progress)
    )
    # Rank 0 first: it fills the weights cache (download, dab-tiny generation) that the others then read.
    bundle = ctx.main_first(lambda: load_clip(cfg.model, cfg.pretrained, device=ctx.device, dtype=cfg.compute_dtype))
    for w in getattr(bundle, "warnings", []) or []:
        progress(Event("warning", message=str(w)))
    truncation = text_truncation(bundle, captions)  # how captions are cut at the text context, per split
    manifest = {
        **build_manifest(cfg, bundle, catalogue, world_size=ctx.world_size, device=ctx.device),
        "text_truncation": truncation,
    }
    if ctx.world_size > 1:
        progress(Event("info", message=f"distributed extraction: {ctx.world_size} processes"))

    job = ExtractJob(cfg=cfg, out=out, bundle=bundle, manifest=manifest, videos=videos, captions=captions, ctx=ctx)
    writer = choose_writer(job)
    state = ctx.run_on_main(lambda: existing_store(job))
    if state is not None and state.repaired != (0, 0):
        progress(
            Event(
                "warning",
                message=f"{out} had lost chunk files: extracting the {state.repaired[0]} videos "
                f"and {state.repaired[1]} captions they held again",
            )
        )
    writer.check(state, progress)
    if state is not None and state.complete:
        progress(Event("info", message=f"{out} is complete; nothing to do"))
        writer.done(progress)
        local = _counts_of_complete(state, writer, len(captions), out)
    else:
        # agree(): a rank that fails makes every rank stop with its message (not a hang in the next collective).
        local = ctx.agree(lambda: _encode(job, writer, state, missing, progress))
        writer.finish(progress)
    result = _combine_results(ctx, local, videos, len(captions), out)
    result.text_truncation = truncation
    result.seconds = time.perf_counter() - t0
    return result


def _encode(
    job: ExtractJob, writer: StoreWriter, state: Optional[ExistingStore], missing: set[str], progress: ProgressCallback
) -> ExtractResult:
    """Open this rank's store, encode its pending captions (rank 0) and videos, close it."""
    cfg, ctx = job.cfg, job.ctx
    store, rows = writer.open(state, progress)
    try:
        with _store_errors(job.out):
            if ctx.is_main:
                encode_captions(store, job.bundle, [c.text for c in job.captions], cfg, progress, encode_texts)
            res = encode_videos(
                store, job.bundle, job.videos, missing, cfg, ctx.device, progress, encode_images, rows=rows
            )
        res.captions = len(job.captions)
        return res
    finally:
        store.close()


def _counts_of_complete(state: ExistingStore, writer: StoreWriter, n_caps: int, out: Path) -> ExtractResult:
    """This rank's result for a store that was complete before the run: every video skipped."""
    share = writer.share(state)
    mine = state.status if share is None else state.status[share]
    return ExtractResult(
        store=out,
        videos_total=len(mine),
        videos_ok=0,
        videos_failed=0,
        videos_missing=0,
        videos_skipped=len(mine),
        captions=n_caps,
        failures=[],
        store_ok=int((mine == STATUS_OK).sum()),
        store_failed=int((mine == STATUS_FAILED).sum()),
        store_missing=int((mine == STATUS_MISSING).sum()),
    )


def _combine_results(ctx, local: ExtractResult, videos, n_caps: int, out: Path) -> ExtractResult:
    """Every rank's counts summed (on every rank); failures in dataset order.

    A run that failed no video of its own but left failed videos in the store
    reports the reasons of the earlier runs' failures (the first five).
    """
    rows = ctx.all_gather_object(
        ({k: getattr(local, k) for k in _COUNTS}, local.failures, local.warnings, local.video_seconds)
    )
    pos = {v.video_id: i for i, v in enumerate(videos)}
    failures = sorted((f for r in rows for f in r[1]), key=lambda f: pos.get(f[0], -1))
    warnings = sorted((w for r in rows for w in r[2]), key=lambda w: pos.get(w[0], -1))
    result = ExtractResult(
        store=out,
        captions=n_caps,
        failures=failures,
        warnings=warnings,
        video_seconds=max(r[3] for r in rows),
        **{k: sum(r[0][k] for r in rows) for k in _COUNTS},
    )
    if not result.failures and result.store_failed:
        result.failures = ctx.run_on_main(lambda: _earlier_failures(out))
    first_missing = ""
    if result.store_ok == 0 and result.store_missing:
        missing = [v for v in videos if not Path(v.path).is_file()]
        first_missing = f"{missing[0].video_id} at {missing[0].path}" if missing else ""
    try:
        _raise_if_all_failed(result, first_missing)
    except ExtractionFailed as exc:
        raise mark_shared(exc) from None
    return result


def _earlier_failures(out: Path) -> list[tuple[str, str]]:
    with open_store(out, "r") as st:
        return st.failures()[:5]


def _raise_if_all_failed(result: ExtractResult, first_missing: str = "") -> None:
    """No video of the store encoded: the same answer on the first run and on every rerun."""
    if result.videos_total > 0 and result.store_ok == 0:
        if result.failures:
            why = f"first error: {result.failures[0][0]}: {result.failures[0][1]}"
        else:
            why = f"no video file was found (first: {first_missing}); check --videos" if first_missing else "n/a"
        raise ExtractionFailed(
            f"every video failed ({result.store_failed} failed, {result.store_missing} missing on disk); {why}. "
            "Fix or replace the files and rerun the same command: it retries failed and missing videos"
        )


@contextlib.contextmanager
def _store_errors(out: Path):
    """A write that the file system refuses (full disk, read-only, permissions) becomes one line.

    The store stays valid: every video whose status is set was fully written, so the
    same command resumes once the cause is fixed.
    """
    hint = "the videos written so far are kept, fix the cause and rerun the same command to resume"
    try:
        yield
    except WriteError as exc:  # the store's own writes name their failures (the backends)
        raise WriteError(f"{exc}; {hint}") from None
    except OSError as exc:
        named = write_failure(exc, out)
        if named is not None:
            raise WriteError(f"{named}; {hint}") from None
        raise StoreError(f"cannot write {out}: {exc.strerror or exc}; {hint}") from None


def _load_catalogue(cfg: ExtractConfig, progress: ProgressCallback):
    """The dataset's videos and captions (``--limit`` applied) and the ids missing on disk."""
    catalogue = load_dataset(cfg.dataset, cfg.videos, cfg.annotations, **parse_options(cfg.dataset_options))
    for w in catalogue.options.get("warnings", []) or []:
        progress(Event("warning", message=str(w)))
    videos = list(catalogue.videos)
    captions = list(catalogue.captions)
    if cfg.limit is not None:
        videos = videos[: cfg.limit]
        keep = {v.video_id for v in videos}
        captions = [c for c in captions if c.video_id in keep]
    missing = set(catalogue.missing) & {v.video_id for v in videos}
    if missing:
        first = ", ".join(sorted(missing)[:5])
        progress(
            Event(
                "warning",
                message=f"{len(missing)} listed videos are missing on disk (first: {first}); recorded in the store",
            )
        )
    return catalogue, videos, captions, missing
