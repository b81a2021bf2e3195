"""Stage one: decode videos, encode frames and captions with CLIP, cache them in a store.

Decoding (and CLIP's own PIL preprocessing) runs in DataLoader worker
processes, overlapped with batched encoding in the main process; results are
written to the store batch by batch, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import torch

from .. import __version__
from ..events import Event, ProgressCallback, null_progress
from ..augment import VIEW_TRANSFORM
from ..thumbnails import THUMB_BYTES, THUMBNAIL_NOTE, make_thumbnail
from ..capabilities import capabilities
from ..choices import CLIP_DTYPES, STORE_DTYPES
from ..devices import resolve_device
from ..fsutil import sha256_file
from ..errors import ConfigError, DabError, ExtractionFailed, StoreError, StoreMismatchError, VideoDecodeError
from ..video import DECODE_RULES

if TYPE_CHECKING:
    from ..distributed import DistContext

# Manifest keys that must agree before an existing store is appended to:
# anything that changes the numbers a video or caption gets.
COMPATIBILITY_KEYS = (
    "model",
    "pretrained",
    "weights_sha256",
    "quick_gelu",
    "frames",
    "image_size",
    "preprocessing",
    "compute_dtype",
    "store_dtype",
    "trainable_blocks",
    "decoder",
    "dataset",
    "dataset_options",
    "annotation_sha256",
    "train_views",  # present only in stores made with --train-views
)


@dataclass(frozen=True)
class ExtractConfig:
    """Everything that decides what `dab extract` writes."""

    dataset: str
    out: Path
    videos: Optional[Path] = None
    annotations: Optional[Path] = None
    dataset_options: tuple[str, ...] = ()  # "key=value" loader options, e.g. "train_split=7k"
    model: str = "ViT-B-32"
    pretrained: Optional[str] = "openai"
    frames: int = 12
    trainable_blocks: Optional[int] = None
    # CLIP's dtype: auto | float32 | bfloat16 | float16 | autocast-bf16 (resolve_compute_dtype)
    compute_dtype: str = "float32"
    store_dtype: str = "float16"
    batch_size: int = 16  # videos per encoding batch
    text_batch_size: int = 256
    workers: int = 2
    device: str = "auto"
    decode_short_side: Optional[int] = 0  # 0: CLIP's image size; None: decode at full resolution
    decode_backend: str = "pyav"  # pyav | pyav-seek | decord (dab_pipeline.video)
    limit: Optional[int] = None  # only the first N videos (and their captions): quick trials
    # augmented views per training video (X-Pool's train transform, seeded; dab_pipeline.augment)
    train_views: int = 0
    thumbnails: bool = True  # a small JPEG strip per video in the store (dab_pipeline.thumbnails), for result pages
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.frames < 1:
            raise ConfigError(f"frames must be >= 1, got {self.frames}")
        if self.trainable_blocks is not None and self.trainable_blocks < 0:
            raise ConfigError(f"trainable_blocks must be >= 0, got {self.trainable_blocks}")
        if self.batch_size < 1 or self.text_batch_size < 1:
            raise ConfigError("batch sizes must be >= 1")
        if self.workers < 0:
            raise ConfigError(f"workers must be >= 0, got {self.workers}")
        if self.compute_dtype not in CLIP_DTYPES:
            raise ConfigError(f"compute_dtype must be one of {', '.join(CLIP_DTYPES)}, got {self.compute_dtype!r}")
        if self.train_views < 0:
            raise ConfigError(f"train_views must be >= 0, got {self.train_views}")
        if self.store_dtype not in STORE_DTYPES:
            raise ConfigError(f"store_dtype must be one of {', '.join(STORE_DTYPES)}, got {self.store_dtype!r}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1, got {self.limit}")
        from ..video import BACKENDS

        if self.decode_backend not in BACKENDS:
            raise ConfigError(f"decode_backend must be one of {', '.join(BACKENDS)}, got {self.decode_backend!r}")
        if self.decode_short_side is not None and self.decode_short_side < 0:
            raise ConfigError(f"decode_short_side must be >= 0 or None, got {self.decode_short_side}")


@dataclass
class ExtractResult:
    """What one run did (``videos_*``, for the videos it was given) and where the store stands."""

    store: Path
    videos_total: int
    videos_ok: int
    videos_failed: int
    videos_missing: int
    videos_skipped: int  # already done by an earlier run
    captions: int
    failures: list[tuple[str, str]]  # (video id, reason) of this run's failures
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (video id, message) of this run's videos
    # The whole store after the run (earlier runs included): counts by status.
    store_ok: int = 0
    store_failed: int = 0
    store_missing: int = 0
    video_seconds: float = 0.0  # wall time of the video phase (decoding + encoding)
    seconds: float = 0.0  # the whole stage


def parse_options(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``("train_split=7k", "val_size=0")`` -> ``{"train_split": "7k", "val_size": 0}``."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"dataset option {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        val: Any = raw
        for conv in (int, float):
            try:
                val = conv(raw)
                break
            except ValueError:
                continue
        out[key.strip()] = val
    return out


def resolve_compute_dtype(dtype: str, device: "str | torch.device", out: Optional[Path] = None,
                          progress: ProgressCallback = null_progress) -> str:
    """CLIP's compute dtype for this device (:func:`dab_pipeline.capabilities.resolve_clip_dtype`).

    ``auto`` resuming an existing store takes the store's own dtype, so the same
    command resumes on a machine whose ``auto`` would pick another one.  A bf16
    request on a device without native bf16 becomes float32, with one warning.
    """
    from ..capabilities import resolve_clip_dtype

    dev = resolve_device(device)
    requested = dtype
    if dtype == "auto" and out is not None:
        requested = _stored_dtype(Path(out)) or dtype
    choice = resolve_clip_dtype(requested, dev)
    if choice.warning:
        progress(Event("warning", message=choice.warning))
    return choice.dtype


def _stored_dtype(out: Path) -> Optional[str]:
    """The compute dtype an existing store records, or None (no store, or not readable as one)."""
    if not out.exists():
        return None
    from ..store import open_store

    try:
        with open_store(out, "r") as st:
            return st.manifest.get("compute_dtype")
    except (DabError, OSError, KeyError, ValueError):
        return None


# --------------------------------------------------------------------------- decoding workers


class _DecodeDataset(torch.utils.data.Dataset):
    """Decode + preprocess one video per item; failures travel back as strings, not exceptions.

    items: (store row, path) or (store row, path, video id, N): N augmented training views too.
    """

    def __init__(self, items: list[tuple], frames: int, short_side: Optional[int], backend: str, preprocess,
                 view_geometry: Optional[tuple[int, Sequence[float], Sequence[float]]] = None) -> None:
        self.items = items
        self.frames = frames
        self.short_side = short_side
        self.backend = backend
        self.preprocess = preprocess
        self.view_geometry = view_geometry  # (image size, mean, std) for the augmented views

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        from PIL import Image

        from ..video import decode_video

        index, path = self.items[i][:2]
        try:
            dec = decode_video(Path(path), num_frames=self.frames, short_side=self.short_side, backend=self.backend)
            # CLIP's own PIL transform, frame by frame, so features equal open_clip's on these frames.
            pixels = torch.stack([self.preprocess(Image.fromarray(f)) for f in dec.frames])  # (F, 3, S, S)
            item = {"index": index, "pixels": pixels, "mask": torch.from_numpy(dec.mask),
                    "num_video_frames": dec.num_video_frames, "error": None,
                    "warning": "; ".join(dec.warnings) or None, "views": None,
                    "thumbnail": make_thumbnail(dec.frames, dec.mask)}
            if len(self.items[i]) > 2 and self.items[i][3] and self.view_geometry is not None:
                from ..augment import augmented_views

                size, mean, std = self.view_geometry
                item["views"] = augmented_views(dec.frames, self.items[i][2], self.items[i][3], size, mean, std)
            return item
        except VideoDecodeError as exc:
            return {"index": index, "error": str(exc)}
        except Exception as exc:  # a codec or PIL failure on one file must not stop the run
            return {"index": index, "error": f"{path}: {type(exc).__name__}: {exc}"}


def _collate(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


def _worker_init(_: int) -> None:
    # Two one-thread decoders beat one two-thread decoder (measured 2x on 2 cores).
    torch.set_num_threads(1)


# --------------------------------------------------------------------------- the stage


def build_manifest(cfg: ExtractConfig, bundle, index, world_size: int = 1,
                   device: "str | torch.device" = "cpu") -> dict[str, Any]:
    desc = bundle.describe()
    return {
        "format": "dab-store",
        "format_version": 1,
        "package_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        # what the encoding device runs natively (why compute_dtype is what it is); not compared on resume
        "device_capabilities": capabilities(device).as_dict(),
        "model": bundle.model_name,
        "pretrained": bundle.pretrained,
        "weights_sha256": bundle.weights_sha256,
        "quick_gelu": bool(bundle.quick_gelu),
        "clip": desc,
        "frames": cfg.frames,
        "image_size": int(bundle.image_size),
        "preprocessing": (
            f"open_clip eval transform: resize shorter side to {bundle.image_size} (bicubic), "
            f"centre crop {bundle.image_size}, normalise mean={list(map(float, bundle.mean))} "
            f"std={list(map(float, bundle.std))}; frames sampled at segment midpoints (X-Pool uniform)"
        ),
        "decode_short_side": _short_side(cfg, bundle),
        # Everything about decoding that changes the pixels a video gets (compared on resume).
        "decoder": {"backend": cfg.decode_backend, "short_side": _short_side(cfg, bundle), "rules": DECODE_RULES,
                    "frame_order": "sequential decode order" if cfg.decode_backend == "pyav" else
                    "timestamps (seeking)", "resize": "bicubic (FFmpeg swscale), display rotation applied"},
        "compute_dtype": cfg.compute_dtype,
        "store_dtype": cfg.store_dtype,
        "trainable_blocks": cfg.trainable_blocks,
        "features": "projected CLIP features, not L2-normalised",
        "dataset": index.name,
        "dataset_options": {k: v for k, v in sorted(index.options.items()) if k != "warnings"},
        "annotation_files": [str(p) for p in index.annotation_files],
        "annotation_sha256": {Path(p).name: sha256_file(Path(p)) for p in index.annotation_files},
        **({"thumbnails": THUMBNAIL_NOTE} if cfg.thumbnails else {}),
        **({"train_views": cfg.train_views, "train_view_transform": VIEW_TRANSFORM,
            "train_view_split": "train"} if cfg.train_views else {}),
        "limit": cfg.limit,
        "world_size": world_size,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()},
    }


def _short_side(cfg: ExtractConfig, bundle) -> Optional[int]:
    """The decode-time resize: 0 means CLIP's image size, None full resolution."""
    return int(bundle.image_size) if cfg.decode_short_side == 0 else cfg.decode_short_side


def run_extract(cfg: ExtractConfig, progress: ProgressCallback = null_progress,
                dist: Optional["DistContext"] = None) -> ExtractResult:
    """Build (or resume) the feature store described by ``cfg``.

    ``dist``: this process is one rank of a torchrun job (see
    :mod:`dab_pipeline.distributed`); each rank encodes its share of the videos.
    None (or a one-process job) is the plain single-process extraction.
    """
    if dist is not None and dist.world_size > 1:
        return _run_extract_distributed(cfg, progress, dist)
    from ..clip_models import encode_images, encode_texts, load_clip
    from ..store import open_store

    t0 = time.perf_counter()
    out = Path(cfg.out)
    index, videos, captions, missing = _load_index(cfg, progress)
    if out.suffix.lower() in (".h5", ".hdf5"):
        from ..distributed import part_files

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
    from ..datasets import load_dataset

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
    from ..store import manifest_compatible

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
    from ..clip_models import tokenize_lengths
    from ..store import create_store

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


# --------------------------------------------------------------------------- distributed


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
    from ..clip_models import encode_images, encode_texts, load_clip
    from ..distributed import mark_shared
    from ..store import default_share_rows, open_store, store_backend, video_share

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
        from ..store import STATUS_FAILED, STATUS_MISSING, STATUS_OK

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
            from ..store import merge_parts

            progress(Event("info", message=f"merging {world} part files into {out}"))
            u = default_share_rows(n, world)
            merge_parts(out, parts, [video_share(n, u, r, world) for r in range(world)], overwrite=cfg.overwrite)
            _remove_parts(out, world)

        dist.run_on_main(merge)
    return _combine_results(dist, local, videos, len(captions), out)


def _part(out: Path, rank: int, world: int) -> Path:
    from ..distributed import part_path

    return part_path(out, rank, world)


def _remove_parts(out: Path, world: Optional[int]) -> None:
    """Delete the part files of ``out`` (of one world size, or all of them)."""
    from ..distributed import part_files

    for p, _, w in part_files(out):
        if world is None or w == world:
            p.unlink(missing_ok=True)


def _check_parts(out: Path, world: int, overwrite: bool) -> None:
    """Rank 0, before the parts open: part files of another world size cannot be resumed by this run."""
    from ..distributed import part_files

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
    from ..distributed import mark_shared

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


def _encode_captions(store, bundle, texts: list[str], cfg: ExtractConfig, progress: ProgressCallback, encode_texts) -> int:
    pending = np.asarray(store.pending_captions())
    if len(pending) == 0:
        return len(texts)
    progress(Event("start", task="captions", total=len(pending)))
    for s in range(0, len(pending), cfg.text_batch_size):
        idx = pending[s : s + cfg.text_batch_size]
        enc = encode_texts(bundle, [texts[i] for i in idx], cfg.trainable_blocks)
        states = enc.states
        if states is not None and not isinstance(states, list):
            states = states.float().cpu().numpy()
        elif isinstance(states, list):
            states = [s_.float().cpu().numpy() for s_ in states]
        store.write_captions(idx, enc.features.float().cpu().numpy(), text_states=states)
        progress(Event("advance", task="captions", n=len(idx), data={"unit": "captions"}))
    progress(Event("end", task="captions"))
    return len(texts)


def _encode_videos(store, bundle, videos, missing: set[str], cfg: ExtractConfig, device: torch.device,
                   progress: ProgressCallback, encode_images, rows: Optional[np.ndarray] = None) -> ExtractResult:
    """Encode the pending videos (of ``rows`` only, when given: one rank's share)."""
    total = len(videos) if rows is None else len(rows)
    pending = [int(i) for i in store.pending_videos()]
    if rows is not None:
        pending = [int(i) for i in np.intersect1d(pending, rows)]  # sorted, like pending_videos()
    skipped = total - len(pending)
    miss_idx = [i for i in pending if videos[i].video_id in missing]
    if miss_idx:
        store.mark_missing(miss_idx)
    todo = [(i, str(videos[i].path), videos[i].video_id, cfg.train_views if videos[i].split == "train" else 0)
            for i in pending if videos[i].video_id not in missing]
    short_side = bundle.image_size if cfg.decode_short_side == 0 else cfg.decode_short_side
    geometry = (int(bundle.image_size), list(map(float, bundle.mean)), list(map(float, bundle.std)))
    ds = _DecodeDataset(todo, cfg.frames, short_side, cfg.decode_backend, bundle.preprocess, geometry)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=cfg.batch_size, shuffle=False, num_workers=cfg.workers, collate_fn=_collate,
        worker_init_fn=_worker_init if cfg.workers > 0 else None,
        prefetch_factor=2 if cfg.workers > 0 else None, persistent_workers=False,
    )
    failures: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    t0 = time.perf_counter()
    progress(Event("start", task="videos", total=len(todo)))
    with _encoder_threads(device, cfg.workers):
        ok, failed = _consume(loader, store, bundle, videos, cfg, device, progress, encode_images, failures,
                              warnings)
    seconds = time.perf_counter() - t0
    progress(Event("end", task="videos", message=f"{ok} ok, {failed} failed, {len(miss_idx)} missing"))
    status = store.status() if rows is None else store.status()[np.asarray(rows, np.int64)]
    from ..store import STATUS_FAILED, STATUS_MISSING, STATUS_OK

    return ExtractResult(store=Path(cfg.out), videos_total=total, videos_ok=ok, videos_failed=failed,
                         videos_missing=len(miss_idx), videos_skipped=skipped, captions=0, failures=failures,
                         warnings=warnings, store_ok=int((status == STATUS_OK).sum()),
                         store_failed=int((status == STATUS_FAILED).sum()),
                         store_missing=int((status == STATUS_MISSING).sum()), video_seconds=seconds)


@contextlib.contextmanager
def _encoder_threads(device: torch.device, workers: int):
    """Leave the cores the decoding workers use to them while encoding on CPU.

    Measured (benchmarks/extract.py, 2 cores, 2 workers): one encoder thread beat two by
    18-40% end to end, because two threads fought the decoders for the same cores.
    """
    before = torch.get_num_threads()
    if device.type == "cpu" and workers > 0:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) - workers))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _write_views(store, bundle, items: list[dict[str, Any]], cfg: ExtractConfig, device: torch.device,
                 encode_images) -> None:
    """Encode and write the augmented views of these training videos (before write_videos marks them ok)."""
    if not items:
        return
    pixels = torch.stack([b["views"] for b in items])  # (B, N, F, 3, S, S)
    shape = pixels.shape[:3]
    feats, states = encode_images(bundle, pixels.flatten(0, 2).to(device), cfg.trainable_blocks)
    feats = feats.float().reshape(*shape, -1).cpu().numpy()  # (B, N, F, D)
    if states is not None:
        states = states.float().reshape(*shape, *states.shape[1:]).cpu().numpy()  # (B, N, F, [L,] W)
    store.write_views(np.array([b["index"] for b in items]), feats, states)


def _consume(loader, store, bundle, videos, cfg: ExtractConfig, device: torch.device, progress: ProgressCallback,
             encode_images, failures: list[tuple[str, str]], warnings: list[tuple[str, str]]) -> tuple[int, int]:
    """Encode and write decoded batches as they arrive; returns (ok, failed)."""
    ok = failed = 0
    for batch in loader:
        good = [b for b in batch if b["error"] is None]
        for b in batch:
            if b["error"] is not None:
                store.mark_failed(b["index"], b["error"])
                failures.append((videos[b["index"]].video_id, b["error"]))
                failed += 1
        if good:
            pixels = torch.stack([b["pixels"] for b in good])  # (B, F, 3, S, S)
            B, F = pixels.shape[:2]
            feats, states = encode_images(bundle, pixels.flatten(0, 1).to(device), cfg.trainable_blocks)
            feats = feats.float().reshape(B, F, -1).cpu().numpy()  # (B, F, D)
            if states is not None:
                states = states.float().reshape(B, F, *states.shape[1:]).cpu().numpy()  # (B, F, [L,] W)
            _write_views(store, bundle, [b for b in good if b.get("views") is not None], cfg, device,
                         encode_images)
            if store.thumbnail_bytes:  # a store made before thumbnails existed resumes without them
                store.write_thumbnails(np.array([b["index"] for b in good]), [b["thumbnail"] for b in good])
            store.write_videos(
                np.array([b["index"] for b in good]),
                feats,
                np.stack([b["mask"].numpy() for b in good]),
                np.array([b["num_video_frames"] for b in good]),
                vision_states=states,
                warnings=[b["warning"] for b in good],
            )
            warnings.extend((videos[b["index"]].video_id, b["warning"]) for b in good if b["warning"])
            ok += len(good)
        progress(Event("advance", task="videos", n=len(batch), data={"unit": "videos"},
                       message=f"{failed} failed" if failed else ""))
    return ok, failed
