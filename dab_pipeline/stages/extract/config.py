"""ExtractConfig, the manifest and its resume check, and the compute dtype a store gets."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from ... import __version__
from ...core.choices import CLIP_DTYPES, STORE_DTYPES
from ...core.errors import ConfigError, DabError
from ...core.events import Event, ProgressCallback, null_progress
from ...core.fsutil import sha256_file
from ...core.location import location
from ...results.thumbnails import THUMBNAIL_NOTE
from ...runtime.capabilities import capabilities, resolve_clip_dtype
from ...runtime.devices import resolve_device
from ...store import open_store
from ...video import BACKENDS, DECODE_RULES
from ...video.augment import VIEW_TRANSFORM
from .texts import truncation_line

if TYPE_CHECKING:
    pass


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


# the most frames a video may be sampled at: the field uses 12 (64 for DiDeMo and ActivityNet); 100,000 ran a
# machine out of memory decoding the first batch and preallocated a store of F x D values a video
MAX_FRAMES = 256


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
    # None (default): decode at full resolution and let open_clip's transform resize (PIL bicubic with
    # antialiasing: the pixels CLIP was trained on); 0: resize in FFmpeg's swscale to CLIP's image size
    # at decode time; N: to N pixels (docs/extraction.md, benchmarks/resize.py)
    decode_short_side: Optional[int] = None
    decode_backend: str = "pyav"  # pyav | pyav-seek | decord (dab_pipeline.video)
    limit: Optional[int] = None  # only the first N videos (and their captions): quick trials
    # augmented views per training video (X-Pool's train transform, seeded; dab_pipeline.video.augment)
    train_views: int = 0
    thumbnails: bool = (
        True  # a small JPEG strip per video in the store (dab_pipeline.results.thumbnails), for result pages
    )
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.frames <= MAX_FRAMES:
            raise ConfigError(
                f"frames must be in [1, {MAX_FRAMES}] (the field samples 12, or 64 for long videos), got {self.frames}"
            )
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
    # how captions are cut at the text tower's context, per split (stages/extract/texts.py; the manifest's record)
    text_truncation: Optional[dict] = None

    @property
    def truncation_note(self) -> Optional[str]:
        """The line `dab extract` prints when captions were cut at the text context (None when none was)."""
        return truncation_line(self.text_truncation)


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


def resolve_compute_dtype(
    dtype: str, device: "str | torch.device", out: Optional[Path] = None, progress: ProgressCallback = null_progress
) -> str:
    """CLIP's compute dtype for this device (:func:`dab_pipeline.runtime.capabilities.resolve_clip_dtype`).

    ``auto`` resuming an existing store takes the store's own dtype, so the same
    command resumes on a machine whose ``auto`` would pick another one.  A bf16
    request on a device without native bf16 becomes float32, with one warning.
    """
    dev = resolve_device(device)
    requested = dtype
    if dtype == "auto" and out is not None:
        requested = _stored_dtype(location(out)) or dtype
    choice = resolve_clip_dtype(requested, dev)
    if choice.warning:
        progress(Event("warning", message=choice.warning))
    return choice.dtype


def _stored_dtype(out: Path) -> Optional[str]:
    """The compute dtype an existing store records, or None (no store, or not readable as one)."""
    return _stored_manifest(out).get("compute_dtype")


def _stored_manifest(out: Path) -> dict[str, Any]:
    """The manifest of the store at ``out``, or {} (no store, or not readable as one: the stage says why)."""
    if not out.exists():
        return {}
    try:
        with open_store(out, "r") as st:
            return dict(st.manifest)
    except (DabError, OSError, KeyError, ValueError):
        return {}


# The `dab extract` options a rerun that leaves them out takes from the store at --out: rerunning the command
# is extract's resume, so an option the user did not type is not a change (each of these decides the numbers
# a video or caption gets, and differs from the option's default in a store made with another value). Not
# here: --limit (leaving it out is how to ask for every video), --dtype (its auto already takes the store's
# dtype) and what the resume check does not compare (--batch-size, --workers, --device, the paths).
RESUMED_OPTIONS = (
    "model",
    "pretrained",
    "frames",
    "trainable_blocks",
    "store_dtype",
    "train_views",
    "decode_backend",
    "dataset_options",
)


def stored_options(out: Path) -> dict[str, Any]:
    """The values of :data:`RESUMED_OPTIONS` the store at ``out`` was built with, as `dab extract` options
    ({} without a readable store, or one whose manifest records no config)."""
    config = _stored_manifest(location(out)).get("config") or {}
    values = {k: config[k] for k in RESUMED_OPTIONS if k in config}
    if "dataset_options" in values:
        values["dataset_options"] = tuple(values["dataset_options"])  # a JSON list in the manifest
    if "pretrained" in values and values["pretrained"] is None:
        values["pretrained"] = "none"  # no weights tag: random weights or dab's own; an absent one means openai
    return values


def build_manifest(
    cfg: ExtractConfig, bundle, catalogue, world_size: int = 1, device: "str | torch.device" = "cpu"
) -> dict[str, Any]:
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
        "decoder": {
            "backend": cfg.decode_backend,
            "short_side": _short_side(cfg, bundle),
            "rules": DECODE_RULES,
            "frame_order": "sequential decode order" if cfg.decode_backend == "pyav" else "timestamps (seeking)",
            "resize": _resize_note(cfg),
        },
        "compute_dtype": cfg.compute_dtype,
        "store_dtype": cfg.store_dtype,
        "trainable_blocks": cfg.trainable_blocks,
        "features": "projected CLIP features, not L2-normalised",
        "dataset": catalogue.name,
        "dataset_options": {k: v for k, v in sorted(catalogue.options.items()) if k != "warnings"},
        "annotation_files": [str(p) for p in catalogue.annotation_files],
        "annotation_sha256": {Path(p).name: sha256_file(Path(p)) for p in catalogue.annotation_files},
        **({"thumbnails": THUMBNAIL_NOTE} if cfg.thumbnails else {}),
        **(
            {"train_views": cfg.train_views, "train_view_transform": VIEW_TRANSFORM, "train_view_split": "train"}
            if cfg.train_views
            else {}
        ),
        "limit": cfg.limit,
        "world_size": world_size,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()},
    }


def _resize_note(cfg: ExtractConfig) -> str:
    if cfg.decode_short_side is None:
        return "none at decode (open_clip's transform: PIL bicubic with antialiasing), display rotation applied"
    return "bicubic (FFmpeg swscale), display rotation applied"


def _short_side(cfg: ExtractConfig, bundle) -> Optional[int]:
    """The decode-time resize: 0 means CLIP's image size, None full resolution."""
    return int(bundle.image_size) if cfg.decode_short_side == 0 else cfg.decode_short_side
