"""What the world is made of: shapes, colours, sizes, backgrounds, and random scenes of them.

A *scene* is one background and 1-3 objects; a *video* is 1-3 shots, each one
scene shown for a run of frames, separated by hard cuts. Objects drift and
bounce inside the frame (so frames differ), but nothing a caption says depends
on frame order or motion: every caption is answerable from the set of frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SHAPES = ("circle", "square", "triangle", "diamond", "cross", "ring")

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (225, 35, 35),
    "green": (40, 185, 60),
    "blue": (45, 85, 235),
    "yellow": (245, 220, 35),
    "purple": (150, 55, 200),
    "orange": (250, 140, 25),
    "white": (245, 245, 245),
    "pink": (245, 120, 190),
}

# name -> (base RGB, texture): "flat" plain, "speckle" grainy, "stripes" diagonal bands
BACKGROUNDS: dict[str, tuple[tuple[int, int, int], str]] = {
    "black": ((18, 18, 22), "flat"),
    "grey": ((120, 120, 124), "flat"),
    "navy": ((25, 35, 95), "flat"),
    "grass": ((55, 115, 45), "speckle"),
    "sand": ((210, 185, 135), "speckle"),
    "brick": ((140, 60, 45), "stripes"),
}

# Object sizes as a fraction of the frame's shorter side: the radius of the shape.
SIZES: dict[str, tuple[float, float]] = {"small": (0.07, 0.10), "large": (0.18, 0.24)}

# An object must stand out from its background (sum of |RGB differences|).
_MIN_CONTRAST = 150


def contrasts(colour: str, background: str) -> bool:
    """Whether an object of ``colour`` is clearly visible on ``background``."""
    c = np.array(COLOURS[colour])
    b = np.array(BACKGROUNDS[background][0])
    return int(np.abs(c - b).sum()) >= _MIN_CONTRAST


@dataclass(frozen=True)
class Thing:
    """One object of a scene and how it moves (positions and velocity relative to the frame)."""

    shape: str
    colour: str
    size: str
    radius: float  # fraction of the shorter side
    x: float  # centre at the scene's first frame, in [0, 1]
    y: float
    vx: float  # per frame, fraction of the frame
    vy: float
    # video-side uncertainty (world/uncertainty.py); the defaults draw the object in every frame at full contrast
    hidden: tuple[tuple[int, int], ...] = ()  # frame ranges [a, b) of its shot (from the shot's start) it is not drawn
    alpha: float = 1.0  # contrast: its colour blended toward the background's, 1 = full colour

    @property
    def phrase(self) -> str:
        return f"{self.size} {self.colour} {self.shape}"

    def visible_at(self, k: int) -> bool:
        """Whether the object is drawn in frame ``k`` of its shot."""
        return not any(a <= k < b for a, b in self.hidden)


@dataclass(frozen=True)
class Scene:
    background: str
    things: tuple[Thing, ...]
    texture_seed: int

    @property
    def phrase(self) -> str:
        return ", ".join(t.phrase for t in self.things) + f" on {self.background}"


@dataclass(frozen=True)
class Shot:
    scene: Scene
    start: int  # first frame of the shot
    stop: int  # one past its last frame


def random_scene(rng: np.random.Generator, max_things: int = 3) -> Scene:
    """A background and 1..max_things objects with distinct (shape, colour), all visible on it."""
    background = str(rng.choice(list(BACKGROUNDS)))
    colours = [c for c in COLOURS if contrasts(c, background)]
    n = int(rng.integers(1, max_things + 1))
    seen: set[tuple[str, str]] = set()
    things = []
    while len(things) < n:
        shape, colour = str(rng.choice(SHAPES)), str(rng.choice(colours))
        if (shape, colour) in seen:
            continue
        seen.add((shape, colour))
        size = str(rng.choice(list(SIZES)))
        lo, hi = SIZES[size]
        radius = float(rng.uniform(lo, hi))
        things.append(
            Thing(
                shape=shape,
                colour=colour,
                size=size,
                radius=radius,
                x=float(rng.uniform(radius, 1 - radius)),
                y=float(rng.uniform(radius, 1 - radius)),
                vx=float(rng.uniform(-0.025, 0.025)),
                vy=float(rng.uniform(-0.025, 0.025)),
            )
        )
    # larger objects first, so that small ones are drawn on top and stay visible
    things.sort(key=lambda t: -t.radius)
    return Scene(background=background, things=tuple(things), texture_seed=int(rng.integers(0, 2**31)))


def random_shots(rng: np.random.Generator, num_frames: int, max_shots: int = 3, min_shot: int = 8) -> list[Shot]:
    """1..max_shots shots covering ``num_frames`` frames, each at least ``min_shot`` long."""
    most = max(1, min(max_shots, num_frames // min_shot))
    k = int(rng.integers(1, most + 1))
    # cut points: k-1 distinct positions keeping every shot >= min_shot frames
    spare = num_frames - k * min_shot
    extra = np.sort(rng.integers(0, spare + 1, size=k - 1)) if k > 1 else np.zeros(0, int)
    lengths = np.diff(np.concatenate([[0], extra, [spare]])) + min_shot  # (k,)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    scenes: list[Scene] = []
    while len(scenes) < k:
        s = random_scene(rng)
        # neighbouring shots look different: another background or other objects
        if (
            scenes
            and s.background == scenes[-1].background
            and {t.phrase for t in s.things} == {t.phrase for t in scenes[-1].things}
        ):
            continue
        scenes.append(s)
    return [Shot(scene=sc, start=int(a), stop=int(a + n)) for sc, a, n in zip(scenes, starts, lengths)]
