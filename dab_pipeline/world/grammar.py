"""Captions of world videos, from a grammar at four levels of specificity, and what they claim.

Levels, most to least specific:

* ``video``: every shot of a multi-shot video (listed in random order: no caption
  says which came first);
* ``shot``: every object of one shot and its background;
* ``object``: one object, with or without its size or background;
* ``generic``: a coarse statement many videos satisfy ("shapes on sand",
  "something pink").

Every caption carries its *claim*, a structured statement (:class:`Claim`) that
:func:`satisfies` checks against any video, so the world knows exactly which
videos a caption is true of: the one-to-many ambiguity DAB's uncertainty is
meant to model, measured rather than assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations
from typing import Optional, Sequence

import numpy as np

from .scene import Shot, Thing

BACKGROUND_PHRASES = {
    "black": "a black background",
    "grey": "a grey background",
    "navy": "a navy background",
    "grass": "grass",
    "sand": "sand",
    "brick": "a brick wall",
}

LEVELS = ("video", "shot", "object", "generic")
_NUMBER = {1: "one", 2: "two", 3: "three", 4: "four"}  # four scenes: a flash shot (uncertainty.py)


@dataclass(frozen=True)
class ObjectClaim:
    shape: Optional[str] = None
    colour: Optional[str] = None
    size: Optional[str] = None

    def holds(self, thing: Thing) -> bool:
        return all(
            want is None or want == have
            for want, have in ((self.shape, thing.shape), (self.colour, thing.colour), (self.size, thing.size))
        )


@dataclass(frozen=True)
class ShotClaim:
    """Some shot has this background (None: any) and distinct objects matching ``objects``."""

    background: Optional[str] = None
    objects: tuple[ObjectClaim, ...] = ()
    count: Optional[int] = None  # exactly this many objects

    def holds(self, shot: Shot) -> bool:
        scene = shot.scene
        if self.background is not None and scene.background != self.background:
            return False
        if self.count is not None and len(scene.things) != self.count:
            return False
        return _assign(self.objects, scene.things)


@dataclass(frozen=True)
class Claim:
    """What a caption says: distinct shots of the video satisfy these shot claims."""

    shots: tuple[ShotClaim, ...]


@dataclass(frozen=True)
class Caption:
    text: str
    level: str
    claim: Claim


def _assign(claims: Sequence, items: Sequence) -> bool:
    """Whether each claim can be matched to its own item (claims and items are few: brute force)."""
    if len(claims) > len(items):
        return False
    return any(all(c.holds(it) for c, it in zip(claims, perm)) for perm in permutations(items, len(claims)))


def satisfies(shots: Sequence[Shot], claim: Claim) -> bool:
    """Whether a video made of ``shots`` makes ``claim`` true."""
    return _assign(claim.shots, shots)


def _article(phrase: str) -> str:
    return "an " + phrase if phrase[0] in "aeiou" else "a " + phrase


def _join(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _object_phrase(thing: Thing, rng: np.random.Generator, with_size: bool = True) -> tuple[str, ObjectClaim]:
    if with_size:
        return _article(f"{thing.size} {thing.colour} {thing.shape}"), ObjectClaim(
            thing.shape, thing.colour, thing.size
        )
    return _article(f"{thing.colour} {thing.shape}"), ObjectClaim(thing.shape, thing.colour)


def _shot_phrase(shot: Shot, rng: np.random.Generator) -> tuple[str, ShotClaim]:
    things = [shot.scene.things[i] for i in rng.permutation(len(shot.scene.things))]
    sized = bool(rng.random() < 0.7)
    parts, claims = zip(*(_object_phrase(t, rng, with_size=sized) for t in things))
    bg = shot.scene.background
    if rng.random() < 0.5:
        text = f"{_join(list(parts))} on {BACKGROUND_PHRASES[bg]}"
    else:
        text = f"{BACKGROUND_PHRASES[bg]} with {_join(list(parts))}"
    return text, ShotClaim(background=bg, objects=tuple(claims), count=len(things))


def _video_caption(shots: Sequence[Shot], rng: np.random.Generator) -> Caption:
    order = rng.permutation(len(shots))
    texts, claims = zip(*(_shot_phrase(shots[i], rng) for i in order))
    if len(shots) == 1:
        return Caption(texts[0], "video", Claim(tuple(claims)))
    template = int(rng.integers(0, 3))
    if template == 0:
        text = "a video cutting between " + _join(list(texts))
    elif template == 1:
        text = f"{_NUMBER[len(shots)]} scenes: " + "; ".join(texts)
    else:
        text = " and elsewhere ".join(texts)
    return Caption(text, "video", Claim(tuple(claims)))


def _object_caption(shots: Sequence[Shot], rng: np.random.Generator) -> Caption:
    shot = shots[int(rng.integers(0, len(shots)))]
    thing = shot.scene.things[int(rng.integers(0, len(shot.scene.things)))]
    phrase, claim = _object_phrase(thing, rng, with_size=bool(rng.random() < 0.6))
    if rng.random() < 0.5:
        bg = shot.scene.background
        return Caption(
            f"{phrase} on {BACKGROUND_PHRASES[bg]}", "object", Claim((ShotClaim(background=bg, objects=(claim,)),))
        )
    return Caption(phrase, "object", Claim((ShotClaim(objects=(claim,)),)))


def _generic_caption(shots: Sequence[Shot], rng: np.random.Generator) -> Caption:
    shot = shots[int(rng.integers(0, len(shots)))]
    scene = shot.scene
    thing = scene.things[int(rng.integers(0, len(scene.things)))]
    bg = scene.background
    kind = int(rng.integers(0, 5))
    if kind == 0:
        return Caption(f"shapes on {BACKGROUND_PHRASES[bg]}", "generic", Claim((ShotClaim(background=bg),)))
    if kind == 1:
        n = len(scene.things)
        words = f"{_NUMBER[n]} shape" + ("s" if n > 1 else "")
        return Caption(f"{words} on {BACKGROUND_PHRASES[bg]}", "generic", Claim((ShotClaim(background=bg, count=n),)))
    if kind == 2:
        return Caption(
            f"something {thing.colour}", "generic", Claim((ShotClaim(objects=(ObjectClaim(colour=thing.colour),)),))
        )
    if kind == 3:
        return Caption(_article(thing.shape), "generic", Claim((ShotClaim(objects=(ObjectClaim(shape=thing.shape),)),)))
    return Caption(
        f"{_article(thing.size)} shape on {BACKGROUND_PHRASES[bg]}",
        "generic",
        Claim((ShotClaim(background=bg, objects=(ObjectClaim(size=thing.size),)),)),
    )


_MAKERS = {"video": _video_caption, "shot": None, "object": _object_caption, "generic": _generic_caption}


def level_weights(ambiguity: float) -> dict[str, float]:
    """How often each level is drawn; ``ambiguity`` in [0, 1] moves weight to object and generic captions."""
    if not 0.0 <= ambiguity <= 1.0:
        raise ValueError(f"ambiguity must be in [0, 1], got {ambiguity}")
    w = {"video": 1.0, "shot": 1.0, "object": 0.5 + 1.5 * ambiguity, "generic": 2.0 * ambiguity}
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


def make_captions(shots: Sequence[Shot], count: int, ambiguity: float, rng: np.random.Generator) -> list[Caption]:
    """``count`` distinct captions of a video (fewer if its grammar runs out), the first always video-level."""
    weights = level_weights(ambiguity)
    levels, probs = list(weights), list(weights.values())
    out = [_video_caption(shots, rng)]
    seen = {out[0].text}
    for _ in range(count * 20):
        if len(out) >= count:
            break
        level = levels[int(rng.choice(len(levels), p=probs))]
        if level == "shot":
            shot = shots[int(rng.integers(0, len(shots)))]
            text, claim = _shot_phrase(shot, rng)
            cap = Caption(text, "shot", Claim((claim,)))
        else:
            cap = _MAKERS[level](shots, rng)
        if cap.text not in seen:
            seen.add(cap.text)
            out.append(cap)
    return out


def describe(shots: Sequence[Shot]) -> str:
    """A video's ground truth in words, shot by shot, with frame ranges (for people, not for training)."""
    parts = []
    for i, shot in enumerate(shots, 1):
        things = ", ".join(_seen_phrase(t, shot) for t in shot.scene.things)
        parts.append(f"shot {i} (frames {shot.start}-{shot.stop - 1}): {things} on {shot.scene.background}")
    return "; ".join(parts)


def _seen_phrase(thing: Thing, shot: Shot) -> str:
    """An object's phrase, with how it is shown when the world hides or fades it (world/uncertainty.py)."""
    notes = []
    if thing.alpha < 1.0:
        notes.append(f"faint, {thing.alpha:.0%} contrast")
    if thing.hidden:
        n = shot.stop - shot.start
        seen = [k for k in range(n) if thing.visible_at(k)]
        notes.append(
            f"drawn in {len(seen)} of {n} frames: "
            + ", ".join(
                f"{shot.start + a}-{shot.start + b - 1}" if b - a > 1 else f"{shot.start + a}" for a, b in _runs(seen)
            )
        )
    return thing.phrase + (f" ({'; '.join(notes)})" if notes else "")


def _runs(frames: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs [a, b) of sorted frame indices."""
    runs: list[tuple[int, int]] = []
    for k in frames:
        if runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k, k + 1))
    return runs
