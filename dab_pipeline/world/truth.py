"""Which videos a world caption is true of: the relevance matrix of claim-aware retrieval.

Every world caption carries a claim (:mod:`.grammar`), and :func:`~.grammar.satisfies`
checks it against any video, so for a store extracted from a world the relevant videos of
each caption are known exactly, not only the one it was written for.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.errors import ConfigError
from .generate import WorldConfig, WorldVideo, claim_from_dict, iter_world
from .grammar import Claim, satisfies


def world_config(meta: dict[str, Any]) -> WorldConfig:
    """The config a world.json records (knobs it leaves out take their defaults)."""
    c = meta["config"]
    return WorldConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()})


def world_videos(meta: dict[str, Any]) -> dict[str, WorldVideo]:
    """Every video of a written world (regenerated from its config: shots and captions, nothing rendered)."""
    return {v.video_id: v for v in iter_world(world_config(meta))}


def caption_claims(
    meta: dict[str, Any], caption_video_ids: Sequence[str], caption_texts: Sequence[str]
) -> tuple[list[Claim], list[str]]:
    """The claim and level of each caption, found by its video and text in world.json."""
    claims, levels = [], []
    by_text: dict[str, dict[str, dict]] = {}
    for vid, text in zip(caption_video_ids, caption_texts):
        caps = by_text.get(vid)
        if caps is None:
            info = meta["videos"].get(vid)
            if info is None:
                raise ConfigError(f"video {vid!r} is not in this world")
            caps = by_text[vid] = {c["text"]: c for c in info["captions"]}
        cap = caps.get(str(text))
        if cap is None:
            raise ConfigError(f"video {vid!r} of the world has no caption {str(text)!r}")
        claims.append(claim_from_dict(cap["claim"]))
        levels.append(cap["level"])
    return claims, levels


def relevance_matrix(claims: Sequence[Claim], videos: Sequence[WorldVideo]) -> np.ndarray:
    """(Q, V) bool: claim q is true of video v. Identical claims are checked once."""
    out = np.zeros((len(claims), len(videos)), dtype=bool)
    seen: dict[Claim, np.ndarray] = {}
    for q, claim in enumerate(claims):
        row = seen.get(claim)
        if row is None:
            row = seen[claim] = np.fromiter((satisfies(v.shots, claim) for v in videos), bool, len(videos))
        out[q] = row
    return out
