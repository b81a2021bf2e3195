"""run_extract: one process, or one rank of a torchrun job (zarr shares or HDF5 part files)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional
import numpy as np
from ...events import Event, ProgressCallback, null_progress
from ...thumbnails import THUMB_BYTES
from ...devices import resolve_device
from ...errors import ExtractionFailed, StoreError, StoreMismatchError
if TYPE_CHECKING:
    from ...distributed import DistContext

from .config import COMPATIBILITY_KEYS, ExtractConfig, ExtractResult, build_manifest, parse_options, resolve_compute_dtype
from .workers import _encode_captions, _encode_videos


def run_extract(cfg: ExtractConfig, progress: ProgressCallback = null_progress,
                dist: Optional["DistContext"] = None) -> ExtractResult:
    """Build (or resume) the feature store described by ``cfg``.

    ``dist``: this process is one rank of a torchrun job (see
    :mod:`dab_pipeline.distributed`); each rank encodes its share of the videos.
    None (or a one-process job) is the plain single-process extraction.
    """
    if dist is not None and dist.world_size > 1:
        return _run_extract_distributed(cfg, progress, dist)
    from ...clip_models import encode_images, encode_texts, load_clip
    from ...store import open_store

    t0 = time.perf_counter()
    out = Path(cfg.out)
    index, videos, captions, missing = _load_index(cfg, progress)
    if out.suffix.lower() in (".h5", ".hdf5"):
        from ...distributed import part_files

        worlds = sorted({w for _, _, w in part_files(out)})
        if worlds:
            progress(Event("warning", message=(
                f"part files of an unfinished {worlds[0]}-process extraction into {out} exist; this single "
                f"process ignores them (rerun with torchrun --nproc-per-node {worlds[0]} to resume them)")))

    device = resolve_device(cfg.device)
    resumed = None if cfg.overwrite else out
    cfg = dataclasses.replace(cfg, compute_dtype=resolve_compute_dtype(cfg.compute_dtype, device, resumed, progress))
    bundle = load_clip(cfg.model, cfg.pretrained, device=device, dtype=cfg.compute_dtype)
    for w in getattr(bundle, "warnings", []) or []:
        progress(Event("warning", message=str(w)))
    manifest = build_manifest(cfg, bundle, index, device=device)

    store = None
    if out.exists() and not cfg.overwrite:
        store = open_store(out, mode="a")
        try:
            _check_resumable(store, manifest, videos, captions, out)
        except StoreMismatchError:
            store.close()
            raise
        progress(Event("info", message=f"resuming {out}"))
    if store is None:
        store = _create(out, cfg, bundle, manifest, videos, captions, overwrite=cfg.overwrite)

    try:
        with _store_errors(out):
            n_caps = _encode_captions(store, bundle, [c.text for c in captions], cfg, progress, encode_texts)
            result = _encode_videos(store, bundle, videos, missing, cfg, device, progress, encode_images)
        result.captions = n_caps
        result.store = out
        if not result.failures and result.store_failed:
            result.failures = store.failures()[:5]  # the reasons of earlier runs' failures
    finally:
        store.close()
    result.seconds = time.perf_counter() - t0
    _raise_if_all_failed(result)
    return result


def _raise_if_all_failed(result: ExtractResult) -> None:
    """No video of the store encoded: the same answer on the first run and on every rerun."""
    if result.videos_total > 0 and result.store_ok == 0:
        raise ExtractionFailed(
            f"every video failed ({result.store_failed} failed, {result.store_missing} missing); "
            f"first error: {result.failures[0][1] if result.failures else 'n/a'}"
        )


@contextlib.contextmanager
def _store_errors(out: Path):
    """A write that the file system refuses (full disk, read-only, permissions) becomes one line.

    The store stays valid: every video whose status is set was fully written, so the
    same command resumes once the cause is fixed.
    """
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise StoreError(f"cannot write {out}: {reason}; the videos written so far are kept, "
                         "fix the cause and rerun the same command to resume") from None


def _load_index(cfg: ExtractConfig, progress: ProgressCallback):
    """The dataset's videos and captions (``--limit`` applied) and the ids missing on disk."""
    from ...datasets import load_dataset

    index = load_dataset(cfg.dataset, cfg.videos, cfg.annotations, **parse_options(cfg.dataset_options))
    for w in index.options.get("warnings", []) or []:
        progress(Event("warning", message=str(w)))
    videos = list(index.videos)
    captions = list(index.captions)
    if cfg.limit is not None:
        videos = videos[: cfg.limit]
        keep = {v.video_id for v in videos}
        captions = [c for c in captions if c.video_id in keep]
    missing = set(index.missing) & {v.video_id for v in videos}
    if missing:
        first = ", ".join(sorted(missing)[:5])
        progress(Event("warning", message=f"{len(missing)} listed videos are missing on disk (first: {first}); recorded in the store"))
    return index, videos, captions, missing


def _check_resumable(store, manifest: dict, videos, captions, out: Path) -> None:
    """StoreMismatchError unless ``store`` was built with this configuration and these videos/captions."""
    from ...store import manifest_compatible

    diff = manifest_compatible(store.manifest, manifest, COMPATIBILITY_KEYS)
    same_ids = list(store.video_ids) == [v.video_id for v in videos] and list(store.caption_ids) == [
        c.caption_id for c in captions
    ]
    if diff or not same_ids:
        what = ", ".join(diff) if diff else "the video/caption lists"
        raise StoreMismatchError(
            f"{out} was built with a different configuration ({what} differ); "
            "choose another --out or pass --overwrite to rebuild it"
        )


def _create(out: Path, cfg: ExtractConfig, bundle, manifest: dict, videos, captions, *, overwrite: bool,
            share_rows: Optional[int] = None):
    """A new, preallocated store for these videos and captions (open for writing)."""
    from ...clip_models import tokenize_lengths
    from ...store import create_store

    vid_pos = {v.video_id: i for i, v in enumerate(videos)}
    text_lengths = None
    text_width = None
    vision_state_shape = None
    if cfg.trainable_blocks is not None:
        text_width = bundle.text_width
        if cfg.trainable_blocks == 0:
            vision_state_shape = (bundle.vision_width,)
        else:
            vision_state_shape = (bundle.vision_tokens, bundle.vision_width)
            text_lengths = tokenize_lengths(bundle, [c.text for c in captions])
    return create_store(
        out,
        manifest=manifest,
        video_ids=np.array([v.video_id for v in videos], dtype=object),
        video_split=np.array([v.split for v in videos], dtype=object),
        caption_ids=np.array([c.caption_id for c in captions], dtype=object),
        caption_video_index=np.array([vid_pos[c.video_id] for c in captions], dtype=np.int64),
        caption_text=np.array([c.text for c in captions], dtype=object),
        caption_split=np.array([c.split for c in captions], dtype=object),
        num_frames=cfg.frames,
        dim=bundle.embed_dim,
        dtype=cfg.store_dtype,
        vision_state_shape=vision_state_shape,
        text_state_width=text_width,
        text_state_lengths=text_lengths,
        overwrite=overwrite,
        share_rows=share_rows,
        train_views=cfg.train_views,
        thumbnail_bytes=THUMB_BYTES if cfg.thumbnails else 0,
    )


def _run_extract_distributed(cfg: ExtractConfig, progress: ProgressCallback, dist: "DistContext") -> ExtractResult:
    """One rank of a torchrun extraction: encode this rank's share of the videos.

    Shares are units of ``share_rows`` consecutive videos dealt round robin
    (:func:`dab_pipeline.store.video_share`): deterministic in (N, world size), so
    a rerun gives every rank the same videos and skips the done ones. Captions
    are encoded by rank 0 alone: the text tower costs a small fraction of the
    frames' work, and the ragged token-state array cannot be cut at caption
    boundaries into chunk-aligned shares. Zarr: every rank writes its own rows
    (and their chunk files) of the one store. HDF5 (one writer per file): every
    rank writes a part file; rank 0 merges them at the end.
    """
    from ...clip_models import encode_images, encode_texts, load_clip
    from ...distributed import mark_shared
    from ...store import default_share_rows, open_store, store_backend, video_share

    rank, world = dist.rank, dist.world_size
    if not dist.is_main:
        progress = null_progress  # one progress display: rank 0's
    out = Path(cfg.out)
    kind = store_backend(out)
    index, videos, captions, missing = _load_index(cfg, progress)
    device = dist.device
    resumed = None if cfg.overwrite else out
    cfg = dataclasses.replace(cfg, compute_dtype=resolve_compute_dtype(cfg.compute_dtype, device, resumed, progress))
    # Rank 0 first: it fills the weights cache (download, dab-tiny generation) that the others then read.
    bundle = dist.main_first(lambda: load_clip(cfg.model, cfg.pretrained, device=device, dtype=cfg.compute_dtype))
    for w in getattr(bundle, "warnings", []) or []:
        progress(Event("warning", message=str(w)))
    manifest = build_manifest(cfg, bundle, index, world_size=world, device=device)
    n = len(videos)
    progress(Event("info", message=f"distributed extraction: {world} processes"))

    def existing_store() -> Optional[dict]:
        if cfg.overwrite or not out.exists():
            return None
        with open_store(out, "r") as st:
            _check_resumable(st, manifest, videos, captions, out)
            return {"complete": st.is_complete, "world_size": int(st.manifest.get("world_size") or 1),
                    "share_rows": st.share_rows, "status": st.status()}

    state = dist.run_on_main(existing_store)
    if state is not None and state["complete"]:
        progress(Event("info", message=f"{out} is complete; nothing to do"))
        if kind == "hdf5":
            dist.run_on_main(lambda: _remove_parts(out, None))  # left by a merge killed before its cleanup
        share = video_share(n, state["share_rows"] or default_share_rows(n, world), rank, world)
        from ...store import STATUS_FAILED, STATUS_MISSING, STATUS_OK

        mine = state["status"][share]
        local = ExtractResult(store=out, videos_total=len(share), videos_ok=0, videos_failed=0, videos_missing=0,
                              videos_skipped=len(share), captions=len(captions), failures=[],
                              store_ok=int((mine == STATUS_OK).sum()), store_failed=int((mine == STATUS_FAILED).sum()),
                              store_missing=int((mine == STATUS_MISSING).sum()))
        return _combine_results(dist, local, videos, len(captions), out)
    if state is not None:
        if state["world_size"] != world:
            raise mark_shared(StoreMismatchError(
                f"{out} is incomplete and was started by a {state['world_size']}-process run; this run has {world} "
                f"processes. Resume it with {state['world_size']} process(es) (torchrun --nproc-per-node / --nnodes), "
                "or pass --overwrite to rebuild it"
            ))
        if kind == "hdf5":
            # A distributed HDF5 run only publishes the merged store once complete.
            raise mark_shared(StoreError(
                f"{out} is an incomplete HDF5 store; only one process can write it: finish it with a "
                "single-process `dab extract`, or pass --overwrite"
            ))

    if kind == "zarr":
        def prepare() -> None:
            if state is None:
                st = _create(out, cfg, bundle, manifest, videos, captions, overwrite=cfg.overwrite,
                             share_rows=default_share_rows(n, world))
            else:
                # Opened once as the only writer before the others start: clears stale .partial files.
                st = open_store(out, "a")
            st.close()

        dist.run_on_main(prepare)
        if state is not None:
            progress(Event("info", message=f"resuming {out}"))
        store = dist.agree(lambda: open_store(out, "a", writer=(rank, world)))
        share = store.video_share(rank, world)
    else:
        parts = [_part(out, r, world) for r in range(world)]
        dist.run_on_main(lambda: _check_parts(out, world, cfg.overwrite))

        def open_part():
            mine = parts[rank]
            if mine.exists():
                st = open_store(mine, "a")
                try:
                    _check_resumable(st, manifest, videos, captions, mine)
                except StoreMismatchError:
                    st.close()
                    raise
                return st, True
            return _create(mine, cfg, bundle, manifest, videos, captions, overwrite=False), False

        store, resumed = dist.agree(open_part)
        if resumed:
            progress(Event("info", message=f"resuming {parts[rank]}"))
        share = video_share(n, default_share_rows(n, world), rank, world)

    def encode() -> ExtractResult:
        try:
            n_caps = len(captions)
            with _store_errors(out):
                if dist.is_main:
                    _encode_captions(store, bundle, [c.text for c in captions], cfg, progress, encode_texts)
                res = _encode_videos(store, bundle, videos, missing, cfg, device, progress, encode_images,
                                     rows=share)
            res.captions = n_caps
            return res
        finally:
            store.close()

    # agree(): a rank that fails makes every rank stop with its message (not a hang in the next collective).
    local = dist.agree(encode)
    if kind == "hdf5":
        def merge() -> None:
            from ...store import merge_parts

            progress(Event("info", message=f"merging {world} part files into {out}"))
            u = default_share_rows(n, world)
            merge_parts(out, parts, [video_share(n, u, r, world) for r in range(world)], overwrite=cfg.overwrite)
            _remove_parts(out, world)

        dist.run_on_main(merge)
    return _combine_results(dist, local, videos, len(captions), out)


def _part(out: Path, rank: int, world: int) -> Path:
    from ...distributed import part_path

    return part_path(out, rank, world)


def _remove_parts(out: Path, world: Optional[int]) -> None:
    """Delete the part files of ``out`` (of one world size, or all of them)."""
    from ...distributed import part_files

    for p, _, w in part_files(out):
        if world is None or w == world:
            p.unlink(missing_ok=True)


def _check_parts(out: Path, world: int, overwrite: bool) -> None:
    """Rank 0, before the parts open: part files of another world size cannot be resumed by this run."""
    from ...distributed import part_files

    if overwrite:
        _remove_parts(out, None)
        return
    other = sorted({w for _, _, w in part_files(out) if w != world})
    if other:
        names = ", ".join(p.name for p, _, w in part_files(out) if w == other[0])
        raise StoreMismatchError(
            f"{out}: part files of an unfinished {other[0]}-process run exist ({names}); this run has {world} "
            f"processes. Rerun with {other[0]} processes to resume it, or pass --overwrite to start over"
        )


def _combine_results(dist: "DistContext", local: ExtractResult, videos, n_caps: int, out: Path) -> ExtractResult:
    """Every rank's counts summed (on every rank); failures in dataset order."""
    from ...distributed import mark_shared

    counts = ("videos_total", "videos_ok", "videos_failed", "videos_missing", "videos_skipped", "store_ok",
              "store_failed", "store_missing")
    rows = dist.all_gather_object(({k: getattr(local, k) for k in counts}, local.failures, local.warnings,
                                   local.video_seconds))
    pos = {v.video_id: i for i, v in enumerate(videos)}
    failures = sorted((f for r in rows for f in r[1]), key=lambda f: pos.get(f[0], -1))
    warnings = sorted((w for r in rows for w in r[2]), key=lambda w: pos.get(w[0], -1))
    result = ExtractResult(store=out, captions=n_caps, failures=failures, warnings=warnings,
                           video_seconds=max(r[3] for r in rows), **{k: sum(r[0][k] for r in rows) for k in counts})
    try:
        _raise_if_all_failed(result)
    except ExtractionFailed as exc:
        raise mark_shared(exc) from None
    return result
