"""A procedural video world whose captions mean something (docs/quality.md).

Scenes of shapes on backgrounds, videos of 1-3 shots separated by cuts, and
captions from a grammar at four levels of specificity, each with a structured
claim that says exactly which videos it is true of. The world is written as
real mp4 files plus captions in the ``folder`` dataset format, so it goes
through the same decode, extract, train and evaluate path as a real dataset.
"""

from .generate import (
    WorldConfig,
    WorldVideo,
    descriptions,
    frame_caption_pairs,
    iter_world,
    load_world,
    make_world,
    matching_videos,
    pretrain_frame,
    world_video,
)
from .grammar import LEVELS, Caption, Claim, describe, level_weights, make_captions, satisfies
from .presets import PRESETS, PRETRAIN_SEED, world_preset
from .scene import BACKGROUNDS, COLOURS, SHAPES, SIZES
from .truth import caption_claims, relevance_matrix, world_config, world_videos

__all__ = [
    "WorldConfig",
    "WorldVideo",
    "make_world",
    "iter_world",
    "world_video",
    "load_world",
    "descriptions",
    "matching_videos",
    "pretrain_frame",
    "frame_caption_pairs",
    "LEVELS",
    "Caption",
    "Claim",
    "describe",
    "level_weights",
    "make_captions",
    "satisfies",
    "BACKGROUNDS",
    "COLOURS",
    "SHAPES",
    "SIZES",
    "PRESETS",
    "PRETRAIN_SEED",
    "world_preset",
    "caption_claims",
    "relevance_matrix",
    "world_config",
    "world_videos",
]
