"""The procedural world: deterministic, captions true of their videos, splits disjoint, files decodable."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.video import decode_video, sample_frame_indices
from dab_pipeline.world import (
    COLOURS,
    LEVELS,
    WorldConfig,
    iter_world,
    level_weights,
    make_world,
    matching_videos,
    pretrain_frame,
    satisfies,
    world_video,
)
from dab_pipeline.world.render import render_scene
from dab_pipeline.world.scene import Scene, Thing

SMALL = WorldConfig(seed=3, train=24, val=6, test=10, frames=24)


@pytest.fixture(scope="module")
def small_world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("world")
    make_world(root, SMALL)
    return root


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_generator_is_deterministic(small_world: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    make_world(again, SMALL, workers=2)  # other process layout, same bytes
    for name in ("captions.csv", "captions_all.csv", "descriptions.json", "world.json"):
        assert (small_world / name).read_bytes() == (again / name).read_bytes(), name
    for p in sorted((small_world / "videos").iterdir()):
        assert p.read_bytes() == (again / "videos" / p.name).read_bytes(), p.name
    other = [v.captions[0].text for v in iter_world(WorldConfig(seed=4, train=24, val=6, test=10, frames=24))]
    assert other != [v.captions[0].text for v in iter_world(SMALL)]


def test_every_caption_is_true_of_its_own_video() -> None:
    cfg = WorldConfig(seed=1, train=150, val=0, test=0)
    for video in iter_world(cfg):
        assert len(video.captions) >= 1 and video.captions[0].level == "video"
        assert len({c.text for c in video.captions}) == len(video.captions)  # distinct
        for cap in video.captions:
            assert cap.level in LEVELS
            assert satisfies(video.shots, cap.claim), (cap.text, video.description)


def test_claims_are_checked_against_other_videos_too() -> None:
    videos = list(iter_world(WorldConfig(seed=1, train=200, val=0, test=0)))
    generic = [c for v in videos for c in v.captions if c.level == "generic"]
    specific = [c for v in videos for c in v.captions if c.level == "video" and "scenes" in c.text]
    # generic captions are true of many videos, multi-shot video captions of few
    assert np.mean([len(matching_videos(c, videos)) for c in generic[:60]]) > 10
    assert np.mean([len(matching_videos(c, videos)) for c in specific[:60]]) < 1.5
    # a claim about a colour is false for a video without that colour anywhere
    red = next(c for c in generic if c.text == "something red")
    for v in videos:
        has_red = any(t.colour == "red" for s in v.shots for t in s.scene.things)
        assert satisfies(v.shots, red.claim) == has_red


def test_captions_need_no_frame_order() -> None:
    """The pooling sees frames as a set: no caption may say what comes first, or where things go."""
    order_words = re.compile(r"\b(then|before|after|first|last|begins|ends|later|left|right|towards|moves)\b")
    for video in iter_world(WorldConfig(seed=2, train=300, val=0, test=0)):
        for cap in video.captions:
            assert not order_words.search(cap.text), cap.text


def test_every_shot_is_seen_by_the_sampled_frames() -> None:
    """Shots are long enough that uniform sampling of 12 frames lands at least twice in each."""
    for frames in (24, 32, 48):
        idx, _ = sample_frame_indices(frames, 12)
        for video in iter_world(WorldConfig(seed=5, train=200, val=0, test=0, frames=frames)):
            for shot in video.shots:
                assert ((idx >= shot.start) & (idx < shot.stop)).sum() >= 2, (frames, shot.start, shot.stop)


def test_ambiguity_moves_weight_to_partial_captions() -> None:
    low, high = level_weights(0.0), level_weights(1.0)
    assert low["generic"] == 0.0 and high["generic"] > 0.3
    assert high["object"] > low["object"]
    assert abs(sum(high.values()) - 1.0) < 1e-12
    with pytest.raises(ValueError):
        level_weights(1.5)

    def share(a: float) -> float:
        caps = [c for v in iter_world(WorldConfig(seed=0, train=120, val=0, test=0, ambiguity=a)) for c in v.captions]
        return np.mean([c.level in ("object", "generic") for c in caps])

    assert share(0.9) > share(0.1) + 0.2


def test_splits_are_disjoint_and_sized(small_world: Path) -> None:
    rows = _rows(small_world / "captions.csv")
    split_of = {}
    for r in rows:
        assert split_of.setdefault(r["video_id"], r["split"]) == r["split"]  # one split per video
    counts = {s: sum(1 for v in split_of.values() if v == s) for s in ("train", "val", "test")}
    assert counts == {"train": SMALL.train, "val": SMALL.val, "test": SMALL.test}
    # 1K-A-like: one caption per test video; the MSVD-like file has all of them
    per_video = {}
    for r in rows:
        per_video[r["video_id"]] = per_video.get(r["video_id"], 0) + 1
    assert all(per_video[v] == 1 for v, s in split_of.items() if s in ("val", "test"))
    assert all(per_video[v] >= SMALL.captions_per_video[0] for v, s in split_of.items() if s == "train")
    everything = _rows(small_world / "captions_all.csv")
    for split, n in (("val", SMALL.val), ("test", SMALL.test)):
        assert len([r for r in everything if r["split"] == split]) >= n * SMALL.captions_per_video[0]
    assert [r for r in everything if r["split"] == "train"] == [r for r in rows if r["split"] == "train"]


def test_world_files_hold_the_truth(small_world: Path) -> None:
    meta = json.loads((small_world / "world.json").read_text())
    desc = json.loads((small_world / "descriptions.json").read_text())
    assert meta["config"]["seed"] == SMALL.seed and set(desc) == set(meta["videos"])
    vid, info = next(iter(meta["videos"].items()))
    assert info["description"] == desc[vid] and desc[vid].startswith("shot 1 (frames 0-")
    assert all(c["claim"] for c in info["captions"])
    rows = {r["video_id"]: r for r in _rows(small_world / "captions.csv") if r["split"] != "train"}
    for vid, info in meta["videos"].items():
        if info["split"] != "train":
            assert rows[vid]["caption"] == info["captions"][info["test_query"]]["text"]


def test_videos_decode_through_the_normal_path(small_world: Path) -> None:
    for i, video in enumerate(list(iter_world(SMALL))[:4]):
        dec = decode_video(small_world / "videos" / f"{video.video_id}.mp4", num_frames=12)
        assert dec.num_video_frames == SMALL.frames and dec.frames.shape == (12, 64, 64, 3) and not dec.warnings
        # the first object of the first shot shows its colour in the first sampled frame (lossy coding aside)
        shot = video.shots[0]
        want = np.array(COLOURS[shot.scene.things[-1].colour], float)  # drawn last: never covered
        dist = np.abs(dec.frames[0].reshape(-1, 3).astype(float) - want).sum(axis=1)
        assert (dist < 60).sum() > 10


def test_rendered_shapes_have_their_colour_and_size() -> None:
    for size, lo, hi in (("small", 20, 140), ("large", 300, 1300)):
        thing = Thing(
            shape="circle",
            colour="red",
            size=size,
            radius=0.08 if size == "small" else 0.2,
            x=0.5,
            y=0.5,
            vx=0.0,
            vy=0.0,
        )
        img = render_scene(Scene("black", (thing,), texture_seed=0), 0, (64, 64), noise_seed=0)
        red = (np.abs(img.astype(int) - np.array(COLOURS["red"])).sum(axis=-1) < 40).sum()
        assert lo < red < hi, (size, red)


def test_pretraining_frames_are_another_part_of_the_world() -> None:
    frame, text = pretrain_frame(1000, 0, (64, 64))
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8 and text
    again, same = pretrain_frame(1000, 0, (64, 64))
    np.testing.assert_array_equal(frame, again)
    assert text == same
    # the benchmark world's videos never come from the pretraining stream
    assert world_video(SMALL, 0, "train").captions != ()


def test_bad_world_configs_are_refused() -> None:
    with pytest.raises(ConfigError, match="frames"):
        WorldConfig(frames=4)
    with pytest.raises(ConfigError, match="size"):
        WorldConfig(size=(63, 64))
    with pytest.raises(ConfigError, match="ambiguity"):
        WorldConfig(ambiguity=2.0)


def test_presets_are_named_and_fixed() -> None:
    from dab_pipeline.core.errors import UnknownNameError
    from dab_pipeline.world import PRESETS, world_preset

    bench = world_preset("benchmark")
    assert (bench.train, bench.val, bench.test, bench.seed) == (2000, 300, 500, 0)
    assert set(PRESETS.names()) >= {"benchmark", "quick", "demo", "tiny"}
    with pytest.raises(UnknownNameError, match="benchmark"):
        world_preset("huge")


# --------------------------------------------------------------------------- video-side uncertainty


def test_worlds_without_uncertainty_are_unchanged() -> None:
    """The knobs draw from their own stream and only when on: world.json of a world without them is the one
    written before they existed (sha256 of the metadata, computed by the code of commit 10cb691)."""
    import hashlib

    from dab_pipeline.world.generate import world_metadata

    for cfg, digest in (
        (SMALL, "fed64132945617b582f3fe27a852203e436c117f5b6ec4cc6421b837bc9549b0"),
        (world_preset_named("tiny"), "ce21d8fff53910777982738fb63654293587c7d01c6b693b2a57f34052b05d39"),
    ):
        meta = json.dumps(world_metadata(cfg, list(iter_world(cfg))), indent=1)
        assert hashlib.sha256(meta.encode()).hexdigest() == digest


def world_preset_named(name: str) -> WorldConfig:
    from dab_pipeline.world import world_preset

    return world_preset(name)


def test_hidden_and_faint_objects_are_drawn_so() -> None:
    red = np.array(COLOURS["red"])
    thing = Thing(
        shape="square", colour="red", size="large", radius=0.2, x=0.5, y=0.5, vx=0.0, vy=0.0, hidden=((0, 4),)
    )

    def red_pixels(t: Thing, k: int) -> int:
        img = render_scene(Scene("black", (t,), texture_seed=0), k, (64, 64), noise_seed=k)
        return int((np.abs(img.astype(int) - red).sum(axis=-1) < 40).sum())

    assert red_pixels(thing, 2) == 0 and red_pixels(thing, 4) > 300  # enters at frame 4 of its shot
    faint = Thing(shape="square", colour="red", size="large", radius=0.2, x=0.5, y=0.5, vx=0.0, vy=0.0, alpha=0.4)
    img = render_scene(Scene("black", (faint,), texture_seed=0), 0, (64, 64), noise_seed=0).astype(float)
    centre = img[28:36, 28:36].reshape(-1, 3).mean(axis=0)
    from dab_pipeline.world import BACKGROUNDS

    want = np.array(BACKGROUNDS["black"][0]) + 0.4 * (red - np.array(BACKGROUNDS["black"][0]))
    np.testing.assert_allclose(centre, want, atol=6)


def test_the_uncertain_world_hides_part_of_what_its_captions_say() -> None:
    """Partly visible objects are often seen by one sampled frame or none; flash shots are shorter than the
    sampling interval and often fall between the samples; every caption is still true of its video."""
    import dataclasses

    cfg = dataclasses.replace(world_preset_named("uncertain"), train=120, val=0, test=0)
    base = dataclasses.replace(cfg, partial=0.0, low_contrast=0.0, flash=0.0)
    assert cfg.uncertain and not base.uncertain
    idx, _ = sample_frame_indices(cfg.frames, 12)
    seen, flashes, missed, faint, objects = [], 0, 0, 0, 0
    for video, plain in zip(iter_world(cfg), iter_world(base)):
        for cap in video.captions:
            assert satisfies(video.shots, cap.claim), (cap.text, video.description)
        long_shots = [s for s in video.shots if s.stop - s.start > 2]
        # the same base scenes as the world without the knobs (their own random stream)
        assert [s.scene.background for s in long_shots] == [s.scene.background for s in plain.shots]
        for shot in video.shots:
            inside = (idx >= shot.start) & (idx < shot.stop)
            if shot.stop - shot.start <= 2:
                flashes += 1
                missed += not inside.any()
                continue
            for t in shot.scene.things:
                objects += 1
                faint += t.alpha < 1.0
                if t.hidden:
                    drawn = [shot.start + k for k in range(shot.stop - shot.start) if t.visible_at(k)]
                    assert 1 <= len(drawn) < shot.stop - shot.start
                    seen.append(int(np.isin(idx, drawn).sum()))
    assert 0.35 < len(seen) / objects < 0.65 and 0.15 < faint / objects < 0.45
    assert np.mean(np.asarray(seen) <= 1) > 0.3  # many partly visible objects get one sampled frame or none
    assert 0.3 < flashes / 120 < 0.7 and missed >= flashes // 4
    desc = next(v for v in iter_world(cfg) if any(t.hidden for s in v.shots for t in s.scene.things)).description
    assert "drawn in" in desc


def test_uncertainty_knobs_are_probabilities() -> None:
    for name in ("partial", "low_contrast", "flash"):
        with pytest.raises(ConfigError, match=name):
            WorldConfig(**{name: 1.5})


def test_relevance_matrix_follows_the_claims(small_world: Path) -> None:
    from dab_pipeline.world import caption_claims, load_world, relevance_matrix, world_videos

    meta = load_world(small_world)
    videos = world_videos(meta)
    rows = [r for r in _rows(small_world / "captions_all.csv") if r["split"] == "test"]
    claims, levels = caption_claims(meta, [r["video_id"] for r in rows], [r["caption"] for r in rows])
    assert levels == [r["level"] for r in rows]
    test_ids = sorted({r["video_id"] for r in rows})
    rel = relevance_matrix(claims, [videos[v] for v in test_ids])
    for q, r in enumerate(rows):
        assert rel[q, test_ids.index(r["video_id"])]  # every caption is true of its own video
        for j, vid in enumerate(test_ids):  # and of exactly the videos satisfies() says
            assert rel[q, j] == satisfies(videos[vid].shots, claims[q])
    generic = [q for q, lv in enumerate(levels) if lv == "generic"]
    assert rel[generic].sum(axis=1).mean() > rel[[q for q, lv in enumerate(levels) if lv == "video"]].sum(axis=1).mean()
    with pytest.raises(ConfigError, match="no caption"):
        caption_claims(meta, [rows[0]["video_id"]], ["a caption nobody wrote"])
