"""Where extraction writes: one store, a Zarr store shared by ranks, or HDF5 part files merged at the end.

``run_extract`` is one code path for one process and for a torchrun job; the
differences between the three ways of storing live here, behind one interface:

* ``check(state, progress)``: refuse what this writer cannot resume (every rank, same answer);
* ``open(state, progress)``: the store this rank writes and the video rows it owns;
* ``share(state)``: those rows, for a store that is already complete;
* ``finish(progress)``: after every rank encoded (the HDF5 merge);
* ``done(progress)``: the store was complete before the run (clean-up only).

Shares are units of ``share_rows`` consecutive videos dealt round robin
(:func:`dab_pipeline.store.video_share`): deterministic in (N, world size), so
a rerun gives every rank the same videos and skips the done ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ...clip_models import tokenize_lengths
from ...core.errors import StoreError, StoreMismatchError
from ...core.events import Event, ProgressCallback
from ...results.thumbnails import THUMB_BYTES
from ...runtime.distributed import mark_shared, part_files, part_path
from ...store import (
    create_store,
    default_share_rows,
    manifest_compatible,
    merge_parts,
    open_store,
    store_backend,
    video_share,
)
from .config import COMPATIBILITY_KEYS, ExtractConfig


@dataclass(frozen=True)
class ExistingStore:
    """What rank 0 found at ``--out`` (broadcast to every rank, so it must pickle)."""

    complete: bool
    world_size: int
    share_rows: Optional[int]
    status: np.ndarray  # (N,) uint8, one status per video
    repaired: tuple[int, int] = (0, 0)  # videos and captions of lost chunk files, marked to be extracted again


@dataclass(frozen=True)
class ExtractJob:
    """Everything a writer needs to know about this run."""

    cfg: ExtractConfig
    out: Path
    bundle: Any  # ClipBundle
    manifest: dict
    videos: list
    captions: list
    ctx: Any  # DistContext or LocalContext

    @property
    def num_videos(self) -> int:
        return len(self.videos)


def check_resumable(store, manifest: dict, videos, captions, out: Path) -> None:
    """StoreMismatchError unless ``store`` was built with this configuration and these videos/captions."""
    diff = manifest_compatible(store.manifest, manifest, COMPATIBILITY_KEYS)
    same_ids = list(store.video_ids) == [v.video_id for v in videos] and list(store.caption_ids) == [
        c.caption_id for c in captions
    ]
    if diff or not same_ids:
        what = ", ".join(diff) if diff else "the video/caption lists"
        old_resize = "decoder" in diff and store.manifest.get("decode_short_side") is not None
        hint = (
            (
                " (a store that resized frames at decode time, dab's default before it resized as open_clip does: "
                "resume it with --set decode_short_side=0)"
            )
            if old_resize
            else ""
        )
        raise StoreMismatchError(
            f"{out} was built with a different configuration ({what} differ){hint}; "
            "choose another --out or pass --overwrite to rebuild it"
        )


def existing_store(job: ExtractJob) -> Optional[ExistingStore]:
    """The store already at ``--out`` (checked against this run), or None for a fresh start."""
    if job.cfg.overwrite or not job.out.exists():
        return None
    with open_store(job.out, "r") as st:
        check_resumable(st, job.manifest, job.videos, job.captions, job.out)
        damaged = bool(st.missing_chunks())
    repaired = (0, 0)
    if damaged:  # chunk files lost (Zarr): extract the rows they held again, as a resume extracts pending ones
        with open_store(job.out, "a") as st:
            repaired = st.reopen_damaged()
    with open_store(job.out, "r") as st:
        # nothing to do only when no video waits for a retry (failed or missing ones are retried on a rerun)
        retry = bool(len(st.pending_videos(include_failed=True, include_missing=True)))
        return ExistingStore(
            repaired=repaired,
            complete=st.is_complete and not retry,
            world_size=int(st.manifest.get("world_size") or 1),
            share_rows=st.share_rows,
            status=st.status(),
        )


def create_for(job: ExtractJob, path: Path, *, overwrite: bool, share_rows: Optional[int] = None):
    """A new, preallocated store at ``path`` for the job's videos and captions (open for writing)."""
    cfg, bundle, videos, captions = job.cfg, job.bundle, job.videos, job.captions
    vid_pos = {v.video_id: i for i, v in enumerate(videos)}
    text_lengths = text_width = vision_state_shape = None
    if cfg.trainable_blocks is not None:
        text_width = bundle.text_width
        if cfg.trainable_blocks == 0:
            vision_state_shape = (bundle.vision_width,)
        else:
            vision_state_shape = (bundle.vision_tokens, bundle.vision_width)
            text_lengths = tokenize_lengths(bundle, [c.text for c in captions])
    return create_store(
        path,
        manifest=job.manifest,
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


def remove_part_files(out: Path, world: Optional[int]) -> None:
    """Delete the part files of ``out`` (of one world size, or all of them)."""
    for p, _, w in part_files(out):
        if world is None or w == world:
            p.unlink(missing_ok=True)


def check_part_files(out: Path, world: int, overwrite: bool) -> None:
    """Rank 0, before the parts open: part files of another world size cannot be resumed by this run."""
    if overwrite:
        remove_part_files(out, None)
        return
    other = sorted({w for _, _, w in part_files(out) if w != world})
    if other:
        names = ", ".join(p.name for p, _, w in part_files(out) if w == other[0])
        raise StoreMismatchError(
            f"{out}: part files of an unfinished {other[0]}-process run exist ({names}); this run has {world} "
            f"processes. Rerun with {other[0]} processes to resume it, or pass --overwrite to start over"
        )


class StoreWriter:
    """One process writes the store itself (HDF5 or Zarr): create it, or reopen it and resume."""

    def __init__(self, job: ExtractJob) -> None:
        self.job = job

    def check(self, state: Optional[ExistingStore], progress: ProgressCallback) -> None:
        out = self.job.out
        worlds = sorted({w for _, _, w in part_files(out)}) if store_backend(out) == "hdf5" else []
        if worlds:
            progress(
                Event(
                    "warning",
                    message=(
                        f"part files of an unfinished {worlds[0]}-process extraction into {out} exist; this single "
                        f"process ignores them (rerun with torchrun --nproc-per-node {worlds[0]} to resume them)"
                    ),
                )
            )

    def share(self, state: ExistingStore) -> Optional[np.ndarray]:
        return None  # every row

    def open(self, state: Optional[ExistingStore], progress: ProgressCallback):
        if state is None:
            return create_for(self.job, self.job.out, overwrite=self.job.cfg.overwrite), None
        store = open_store(self.job.out, mode="a")
        progress(Event("info", message=f"resuming {self.job.out}"))
        return store, None

    def finish(self, progress: ProgressCallback) -> None:
        return None

    def done(self, progress: ProgressCallback) -> None:
        return None


class _SharedWriter(StoreWriter):
    """Base of the many-rank writers: a resumed store must come from a run of the same world size."""

    def share(self, state: ExistingStore) -> np.ndarray:
        j = self.job
        rows = state.share_rows or default_share_rows(j.num_videos, j.ctx.world_size)
        return video_share(j.num_videos, rows, j.ctx.rank, j.ctx.world_size)

    def check(self, state: Optional[ExistingStore], progress: ProgressCallback) -> None:
        world = self.job.ctx.world_size
        if state is not None and not state.complete and state.world_size != world:
            raise mark_shared(
                StoreMismatchError(
                    f"{self.job.out} is incomplete and was started by a {state.world_size}-process run; this run has "
                    f"{world} processes. Resume it with {state.world_size} process(es) (torchrun --nproc-per-node / "
                    "--nnodes), or pass --overwrite to rebuild it"
                )
            )


class ZarrSharesWriter(_SharedWriter):
    """Every rank writes its own rows (and their chunk files) of the one Zarr store."""

    def open(self, state: Optional[ExistingStore], progress: ProgressCallback):
        j = self.job
        rank, world = j.ctx.rank, j.ctx.world_size

        def prepare() -> None:
            if state is None:
                st = create_for(j, j.out, overwrite=j.cfg.overwrite, share_rows=default_share_rows(j.num_videos, world))
            else:
                # Opened once as the only writer before the others start: clears stale .partial files.
                st = open_store(j.out, "a")
            st.close()

        j.ctx.run_on_main(prepare)
        if state is not None:
            progress(Event("info", message=f"resuming {j.out}"))
        store = j.ctx.agree(lambda: open_store(j.out, "a", writer=(rank, world)))
        return store, store.video_share(rank, world)


class H5PartsWriter(_SharedWriter):
    """HDF5 has one writer per file: every rank writes a part file, rank 0 merges them at the end.

    The merged store is only published once complete, so an incomplete HDF5
    store at ``--out`` was written by one process and only one process resumes it.
    """

    def check(self, state: Optional[ExistingStore], progress: ProgressCallback) -> None:
        super().check(state, progress)
        if state is not None and not state.complete:
            raise mark_shared(
                StoreError(
                    f"{self.job.out} is an incomplete HDF5 store; only one process can write it: finish it with a "
                    "single-process `dab extract`, or pass --overwrite"
                )
            )

    @property
    def parts(self) -> list[Path]:
        world = self.job.ctx.world_size
        return [part_path(self.job.out, r, world) for r in range(world)]

    def open(self, state: Optional[ExistingStore], progress: ProgressCallback):
        j = self.job
        rank, world = j.ctx.rank, j.ctx.world_size
        j.ctx.run_on_main(lambda: check_part_files(j.out, world, j.cfg.overwrite))
        mine = self.parts[rank]

        def open_part():
            if not mine.exists():
                return create_for(j, mine, overwrite=False), False
            st = open_store(mine, "a")
            try:
                check_resumable(st, j.manifest, j.videos, j.captions, mine)
            except StoreMismatchError:
                st.close()
                raise
            return st, True

        store, resumed = j.ctx.agree(open_part)
        if resumed:
            progress(Event("info", message=f"resuming {mine}"))
        return store, video_share(j.num_videos, default_share_rows(j.num_videos, world), rank, world)

    def finish(self, progress: ProgressCallback) -> None:
        j = self.job
        n, world = j.num_videos, j.ctx.world_size

        def merge() -> None:
            progress(Event("info", message=f"merging {world} part files into {j.out}"))
            u = default_share_rows(n, world)
            merge_parts(
                j.out, self.parts, [video_share(n, u, r, world) for r in range(world)], overwrite=j.cfg.overwrite
            )
            remove_part_files(j.out, world)

        j.ctx.run_on_main(merge)

    def done(self, progress: ProgressCallback) -> None:
        # Part files left by a merge that was killed before its clean-up.
        self.job.ctx.run_on_main(lambda: remove_part_files(self.job.out, None))


def choose_writer(job: ExtractJob) -> StoreWriter:
    """The writer for this store backend and number of processes."""
    if job.ctx.world_size == 1:
        return StoreWriter(job)
    return ZarrSharesWriter(job) if store_backend(job.out) == "zarr" else H5PartsWriter(job)
