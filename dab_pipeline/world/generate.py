"""Writing a world to disk: mp4 videos, captions in the ``folder`` dataset format, and the truth.

Layout of ``make_world(root, cfg)``::

    root/videos/w00000.mp4 ...   H.264 (x264 with B-frames), read back by dab's normal decoder
    root/captions.csv            video_id, video, caption, split, level: every caption of a training video,
                                 one per val and test video (1K-A-like queries)
    root/captions_all.csv        the same with every caption of the val and test videos (MSVD-like)
    root/descriptions.json       {video_id: what the video really shows, shot by shot}
    root/world.json              the config, and per video its split, shots and captions with their claims

Everything is a pure function of the config: video ``i`` draws from its own
random stream ``(seed, 0, i)``, so the world can be written by several processes,
in any order, and comes out byte-identical.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from ..core.errors import ConfigError
from ..video.synthetic import write_video
from .grammar import Caption, Claim, ObjectClaim, ShotClaim, describe, make_captions, satisfies
from .render import render_scene, render_video
from .scene import Scene, Shot, random_scene, random_shots
from .uncertainty import UNCERTAINTY_STREAM, with_uncertainty

SPLITS = ("train", "val", "test")
_VIDEO_STREAM, _SPLIT_STREAM, _PRETRAIN_STREAM = 0, 1, 2  # and UNCERTAINTY_STREAM = 3
_UNCERTAINTY_KEYS = ("partial", "low_contrast", "flash")


@dataclass(frozen=True)
class WorldConfig:
    """Everything that decides a world (the benchmark default: about 2,000 / 300 / 500 videos)."""

    seed: int = 0
    train: int = 2000
    val: int = 300
    test: int = 500
    frames: int = 32  # per video
    size: tuple[int, int] = (64, 64)  # (W, H)
    fps: int = 8
    captions_per_video: tuple[int, int] = (10, 20)  # drawn uniformly in this range
    ambiguity: float = 0.5  # in [0, 1]: weight of object-level and generic captions (grammar.level_weights)
    max_shots: int = 3
    min_shot: int = 8  # frames
    # video-side uncertainty (world/uncertainty.py), probabilities: an object visible in part of its
    # shot only, an object drawn faint, a video with a flash shot of 1-2 frames
    partial: float = 0.0
    low_contrast: float = 0.0
    flash: float = 0.0

    def __post_init__(self) -> None:
        if min(self.train, self.val, self.test) < 0 or self.train < 1:
            raise ConfigError(f"world sizes must be >= 0 (train >= 1), got {self.train}/{self.val}/{self.test}")
        if self.frames < self.min_shot:
            raise ConfigError(f"frames={self.frames} must be at least min_shot={self.min_shot}")
        w, h = self.size
        if w % 2 or h % 2 or min(w, h) < 16:
            raise ConfigError(f"size must be (W, H) with even sides >= 16, got {self.size}")
        lo, hi = self.captions_per_video
        if not 1 <= lo <= hi:
            raise ConfigError(f"captions_per_video must be (lo, hi) with 1 <= lo <= hi, got {self.captions_per_video}")
        for name in ("ambiguity", "partial", "low_contrast", "flash"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    @property
    def uncertain(self) -> bool:
        """Whether the frames may hide part of what the captions say (any uncertainty knob is on)."""
        return self.partial > 0 or self.low_contrast > 0 or self.flash > 0

    @property
    def num_videos(self) -> int:
        return self.train + self.val + self.test


@dataclass(frozen=True)
class WorldVideo:
    video_id: str
    split: str
    shots: tuple[Shot, ...]
    captions: tuple[Caption, ...]
    test_query: int  # index of the caption used as the 1K-A-like query (val and test videos; 0 for train)

    @property
    def description(self) -> str:
        return describe(self.shots)


def video_ids(cfg: WorldConfig) -> list[str]:
    width = max(5, len(str(cfg.num_videos - 1)))
    return [f"w{i:0{width}d}" for i in range(cfg.num_videos)]


def split_of(cfg: WorldConfig) -> list[str]:
    """The split of every video: a seeded permutation, so ids do not give the split away."""
    labels = np.array(["train"] * cfg.train + ["val"] * cfg.val + ["test"] * cfg.test)
    order = np.random.default_rng([cfg.seed, _SPLIT_STREAM]).permutation(cfg.num_videos)
    return labels[order].tolist()


def world_video(cfg: WorldConfig, i: int, split: str) -> WorldVideo:
    """Video ``i`` of the world: its shots and captions (nothing rendered)."""
    rng = np.random.default_rng([cfg.seed, _VIDEO_STREAM, i])
    shots = tuple(random_shots(rng, cfg.frames, cfg.max_shots, cfg.min_shot))
    if cfg.uncertain:
        shots = tuple(
            with_uncertainty(
                shots,
                np.random.default_rng([cfg.seed, UNCERTAINTY_STREAM, i]),
                cfg.partial,
                cfg.low_contrast,
                cfg.flash,
            )
        )
    lo, hi = cfg.captions_per_video
    caps = tuple(make_captions(shots, int(rng.integers(lo, hi + 1)), cfg.ambiguity, rng))
    query = int(rng.integers(0, len(caps))) if split in ("val", "test") else 0
    return WorldVideo(video_ids(cfg)[i], split, shots, caps, query)


def iter_world(cfg: WorldConfig) -> Iterator[WorldVideo]:
    for i, split in enumerate(split_of(cfg)):
        yield world_video(cfg, i, split)


def _write_one(job: tuple[WorldConfig, int, str, str]) -> None:
    cfg, i, split, path = job
    video = world_video(cfg, i, split)
    write_video(
        Path(path),
        render_video(list(video.shots), cfg.size, seed=cfg.seed * 1_000_003 + i),
        fps=cfg.fps,
        fmt="x264-bframes",
    )


def make_world(root: Path, cfg: WorldConfig = WorldConfig(), workers: int = 1) -> Path:
    """Write the world under ``root`` (see the module docstring) and return ``root / "captions.csv"``.

    A folder already holding this exact world (same ``world.json``) is reused as it is.
    """
    root = Path(root)
    meta_path = root / "world.json"
    videos = list(iter_world(cfg))
    meta = world_metadata(cfg, videos)
    if meta_path.is_file() and json.loads(meta_path.read_text()) == meta:
        return root / "captions.csv"
    (root / "videos").mkdir(parents=True, exist_ok=True)
    jobs = [(cfg, i, v.split, str(root / "videos" / f"{v.video_id}.mp4")) for i, v in enumerate(videos)]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            list(pool.map(_write_one, jobs, chunksize=16))
    else:
        for job in jobs:
            _write_one(job)
    for name, every in (("captions.csv", False), ("captions_all.csv", True)):
        _write_captions(root / name, videos, every)
    (root / "descriptions.json").write_text(json.dumps({v.video_id: v.description for v in videos}, indent=1))
    meta_path.write_text(json.dumps(meta, indent=1))  # last: its presence means the world is complete
    return root / "captions.csv"


def _write_captions(path: Path, videos: list[WorldVideo], every: bool) -> None:
    """Training videos: every caption. Val and test: the query caption only, or every caption."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["video_id", "video", "caption", "split", "level"])
        for v in videos:
            caps = [v.captions[v.test_query]] if v.split != "train" and not every else v.captions
            for c in caps:
                w.writerow([v.video_id, f"{v.video_id}.mp4", c.text, v.split, c.level])


def world_metadata(cfg: WorldConfig, videos: list[WorldVideo]) -> dict[str, Any]:
    return {
        "format": "dab-world",
        "version": 1,
        "config": config_dict(cfg),
        "videos": {
            v.video_id: {
                "split": v.split,
                "description": v.description,
                "shots": [_shot_dict(s) for s in v.shots],
                "captions": [{"text": c.text, "level": c.level, "claim": _claim_dict(c.claim)} for c in v.captions],
                "test_query": v.test_query,
            }
            for v in videos
        },
    }


def config_dict(cfg: WorldConfig) -> dict[str, Any]:
    """The config as world.json records it; uncertainty knobs that are off are left out, so the files of a
    world without them are those written before the knobs existed."""
    out = json.loads(json.dumps(dataclasses.asdict(cfg)))
    return {k: v for k, v in out.items() if not (k in _UNCERTAINTY_KEYS and v == 0)}


def _shot_dict(shot: Shot) -> dict[str, Any]:
    return {
        "start": shot.start,
        "stop": shot.stop,
        "background": shot.scene.background,
        "objects": [_object_dict(t) for t in shot.scene.things],
    }


def _object_dict(t) -> dict[str, Any]:
    out: dict[str, Any] = {"shape": t.shape, "colour": t.colour, "size": t.size}
    if t.hidden:
        out["hidden"] = [list(r) for r in t.hidden]  # frame ranges [a, b) of the shot, from its start
    if t.alpha < 1.0:
        out["alpha"] = round(t.alpha, 4)
    return out


def _claim_dict(claim: Claim) -> list[dict[str, Any]]:
    return [
        {"background": s.background, "count": s.count, "objects": [dataclasses.asdict(o) for o in s.objects]}
        for s in claim.shots
    ]


def claim_from_dict(items: list[dict[str, Any]]) -> Claim:
    return Claim(
        tuple(
            ShotClaim(
                background=s["background"], count=s["count"], objects=tuple(ObjectClaim(**o) for o in s["objects"])
            )
            for s in items
        )
    )


def matching_videos(caption: Caption, videos: list[WorldVideo]) -> list[int]:
    """Indices of the videos a caption is true of (its own and any other)."""
    return [j for j, v in enumerate(videos) if satisfies(v.shots, caption.claim)]


# --------------------------------------------------------------------------- pretraining frames


def pretrain_frame(seed: int, i: int, size: tuple[int, int], ambiguity: float = 0.5) -> tuple[np.ndarray, str]:
    """Frame ``i`` of the world's pretraining part and one caption of it (frame-level grammar).

    Drawn from the stream ``(seed, 2, i)``, apart from every benchmark video: a CLIP
    pretrained on these frames has never seen a benchmark video.
    """
    rng = np.random.default_rng([seed, _PRETRAIN_STREAM, i])
    scene: Scene = random_scene(rng)
    k = int(rng.integers(0, 40))
    frame = render_scene(scene, k, size, noise_seed=int(rng.integers(0, 2**31)))
    shot = Shot(scene=scene, start=0, stop=1)
    caption = make_captions([shot], 2, ambiguity, rng)[int(rng.integers(0, 2)) if rng.random() < 0.6 else 0]
    return frame, caption.text


def load_world(root: Path) -> dict[str, Any]:
    """The ``world.json`` of a written world."""
    path = Path(root) / "world.json"
    if not path.is_file():
        raise ConfigError(f"{root} holds no world (no world.json); write one with make_world")
    return json.loads(path.read_text())


def descriptions(root: Path) -> dict[str, str]:
    return json.loads((Path(root) / "descriptions.json").read_text())


def frame_caption_pairs(
    seed: int, count: int, size: tuple[int, int], start: int = 0, ambiguity: float = 0.5
) -> tuple[np.ndarray, list[str]]:
    """``count`` pretraining frames (N, H, W, 3) and their captions, from index ``start`` on."""
    frames, texts = zip(*(pretrain_frame(seed, i, size, ambiguity) for i in range(start, start + count)))
    return np.stack(frames), list(texts)


def summary(videos: list[WorldVideo], split: Optional[str] = None) -> dict[str, Any]:
    """Counts per split and caption level (for tests and docs)."""
    chosen = [v for v in videos if split is None or v.split == split]
    levels: dict[str, int] = {}
    for v in chosen:
        for c in v.captions:
            levels[c.level] = levels.get(c.level, 0) + 1
    return {
        "videos": len(chosen),
        "captions": sum(len(v.captions) for v in chosen),
        "levels": levels,
        "shots": {k: sum(1 for v in chosen if len(v.shots) == k) for k in (1, 2, 3, 4)},
    }
