"""The decoding workers and the encode-and-write loop of extraction."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import torch

from ...core.errors import VideoDecodeError
from ...core.events import Event, ProgressCallback
from ...core.location import location
from ...results.thumbnails import make_thumbnail

if TYPE_CHECKING:
    pass

from ...store import STATUS_FAILED, STATUS_MISSING, STATUS_OK
from ...video import decode_video
from ...video.augment import augmented_views
from .config import ExtractConfig, ExtractResult


class DecodeDataset(torch.utils.data.Dataset):
    """Decode + preprocess one video per item; failures travel back as strings, not exceptions.

    items: (store row, path) or (store row, path, video id, N): N augmented training views too.
    """

    def __init__(
        self,
        items: list[tuple],
        num_frames: int,
        short_side: Optional[int],
        backend: str,
        preprocess,
        view_geometry: Optional[tuple[int, Sequence[float], Sequence[float]]] = None,
    ) -> None:
        self.items = items
        self.num_frames = num_frames  # a count; `frames` names arrays of them
        self.short_side = short_side
        self.backend = backend
        self.preprocess = preprocess
        self.view_geometry = view_geometry  # (image size, mean, std) for the augmented views

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        from PIL import Image

        index, path = self.items[i][:2]
        try:
            dec = decode_video(Path(path), num_frames=self.num_frames, short_side=self.short_side, backend=self.backend)
            # CLIP's own PIL transform, frame by frame, so features equal open_clip's on these frames.
            pixels = torch.stack([self.preprocess(Image.fromarray(f)) for f in dec.frames])  # (F, 3, S, S)
            item = {
                "index": index,
                "pixels": pixels,
                "mask": torch.from_numpy(dec.mask),
                "num_video_frames": dec.num_video_frames,
                "error": None,
                "warning": "; ".join(dec.warnings) or None,
                "views": None,
                "thumbnail": make_thumbnail(dec.frames, dec.mask),
            }
            if len(self.items[i]) > 2 and self.items[i][3] and self.view_geometry is not None:
                size, mean, std = self.view_geometry
                item["views"] = augmented_views(dec.frames, self.items[i][2], self.items[i][3], size, mean, std)
            return item
        except VideoDecodeError as exc:
            return {"index": index, "error": str(exc)}
        except Exception as exc:  # a codec or PIL failure on one file must not stop the run
            return {"index": index, "error": f"{path}: {type(exc).__name__}: {exc}"}


def collate_items(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


def decode_worker_init(_: int) -> None:
    # Two one-thread decoders beat one two-thread decoder (measured 2x on 2 cores).
    torch.set_num_threads(1)
    die_with_parent()


def die_with_parent() -> bool:
    """Have the kernel kill this process the moment its parent dies (Linux ``PR_SET_PDEATHSIG``); -> whether set.

    A decode worker is forked after the store is open and shares its file lock: without this,
    a SIGKILLed extraction's workers kept the HDF5 store locked until the DataLoader's watchdog
    noticed, seconds later. Elsewhere (macOS) nothing is set and the watchdog still ends them.
    """
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    # the parent may have died between the fork and the prctl: then nobody would send the signal
    if os.getppid() == 1:
        os._exit(1)
    return True


def encode_captions(
    store, bundle, texts: list[str], cfg: ExtractConfig, progress: ProgressCallback, encode_texts
) -> int:
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


def encode_videos(
    store,
    bundle,
    videos,
    missing: set[str],
    cfg: ExtractConfig,
    device: torch.device,
    progress: ProgressCallback,
    encode_images,
    rows: Optional[np.ndarray] = None,
) -> ExtractResult:
    """Encode the pending videos (of ``rows`` only, when given: one rank's share)."""
    total = len(videos) if rows is None else len(rows)
    pending = _pending_rows(store, rows)
    skipped = total - len(pending)
    miss_idx = [i for i in pending if videos[i].video_id in missing]
    if miss_idx:
        store.mark_missing(miss_idx)
    todo = [
        (i, str(videos[i].path), videos[i].video_id, cfg.train_views if videos[i].split == "train" else 0)
        for i in pending
        if videos[i].video_id not in missing
    ]
    loader = _decode_loader(todo, bundle, cfg)
    failures: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    t0 = time.perf_counter()
    progress(Event("start", task="videos", total=len(todo)))
    with _encoder_threads(device, cfg.workers):
        ok, failed = _consume(loader, store, bundle, videos, cfg, device, progress, encode_images, failures, warnings)
    seconds = time.perf_counter() - t0
    progress(Event("end", task="videos", message=f"{ok} ok, {failed} failed, {len(miss_idx)} missing"))
    status = store.status() if rows is None else store.status()[np.asarray(rows, np.int64)]
    return ExtractResult(
        store=location(cfg.out),
        videos_total=total,
        videos_ok=ok,
        videos_failed=failed,
        videos_missing=len(miss_idx),
        videos_skipped=skipped,
        captions=0,
        failures=failures,
        warnings=warnings,
        store_ok=int((status == STATUS_OK).sum()),
        store_failed=int((status == STATUS_FAILED).sum()),
        store_missing=int((status == STATUS_MISSING).sum()),
        video_seconds=seconds,
    )


def _pending_rows(store, rows: Optional[np.ndarray]) -> list[int]:
    """The store rows still to encode (of ``rows`` only, when given), ascending."""
    # a rerun retries the videos that failed or were missing: their files may have been replaced since
    pending = [int(i) for i in store.pending_videos(include_failed=True, include_missing=True)]
    if rows is not None:
        pending = [int(i) for i in np.intersect1d(pending, rows)]  # sorted, like pending_videos()
    return pending


def _decode_loader(todo: list[tuple], bundle, cfg: ExtractConfig) -> torch.utils.data.DataLoader:
    """A loader decoding ``todo``'s videos in ``cfg.workers`` processes, in order, a list of items a batch."""
    short_side = bundle.image_size if cfg.decode_short_side == 0 else cfg.decode_short_side
    geometry = (int(bundle.image_size), list(map(float, bundle.mean)), list(map(float, bundle.std)))
    ds = DecodeDataset(todo, cfg.frames, short_side, cfg.decode_backend, bundle.preprocess, geometry)
    return torch.utils.data.DataLoader(
        ds,
        batch_size=cfg.batch_size,
        shuffle=False,
        num_workers=cfg.workers,
        collate_fn=collate_items,
        worker_init_fn=decode_worker_init if cfg.workers > 0 else None,
        prefetch_factor=2 if cfg.workers > 0 else None,
        persistent_workers=False,
    )


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


def _write_views(
    store, bundle, items: list[dict[str, Any]], cfg: ExtractConfig, device: torch.device, encode_images
) -> None:
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


def _consume(
    loader,
    store,
    bundle,
    videos,
    cfg: ExtractConfig,
    device: torch.device,
    progress: ProgressCallback,
    encode_images,
    failures: list[tuple[str, str]],
    warnings: list[tuple[str, str]],
) -> tuple[int, int]:
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
            _write_views(store, bundle, [b for b in good if b.get("views") is not None], cfg, device, encode_images)
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
        progress(
            Event(
                "advance",
                task="videos",
                n=len(batch),
                data={"unit": "videos"},
                message=f"{failed} failed" if failed else "",
            )
        )
    return ok, failed
