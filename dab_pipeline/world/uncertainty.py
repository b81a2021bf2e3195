"""Video-side uncertainty: what the sampled frames of a world video fail to show.

Without it nothing in a world video is hidden: every object is drawn at full contrast in
every frame of its shot, and every shot spans several of the 12 sampled frames. Three
knobs of :class:`~dab_pipeline.world.WorldConfig`, each a probability, make the frames a
model sees support a caption only partly:

* ``partial``: an object is visible in only part of its shot: it enters late, leaves
  early, or is occluded for a stretch (visible in 15-50 % of the shot's frames, at least one);
* ``low_contrast``: an object is drawn faint, its colour blended toward the background's
  (25-50 % of its full contrast);
* ``flash``: the video gets one more shot of 1-2 frames, cut from the end of another shot,
  shorter than the interval between sampled frames (32 / 12 = 2.7 frames at the presets'
  length), so it may fall between them entirely.

Captions and claims still state the truth: a caption may name an object, or a whole
shot, that the sampled frames show faintly, rarely, or not at all.

The draws come from a random stream of their own, ``(seed, 3, i)`` for video ``i``, and
only when a knob is on: a world with every knob at 0 is byte-identical to one written
before the knobs existed, and a world with them on has the same base scenes as the same
world with them off.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from .scene import Shot, random_scene

UNCERTAINTY_STREAM = 3
VISIBLE_FRACTION = (0.15, 0.5)  # of the shot's frames, for a partly visible object
FAINT_ALPHA = (0.25, 0.5)  # contrast of a faint object
FLASH_FRAMES = (1, 2)  # length of a flash shot


def with_uncertainty(
    shots: Sequence[Shot], rng: np.random.Generator, partial: float, low_contrast: float, flash: float
) -> list[Shot]:
    """``shots`` with at most one flash shot added, then partly visible and faint objects in the other shots."""
    out = list(shots)
    flash_at = None
    if flash > 0 and rng.random() < flash:
        out, flash_at = _add_flash(out, rng)
    # the shots' final lengths decide what is hidden; a flash shot is left as it is
    return [s if j == flash_at else _hide_and_fade(s, rng, partial, low_contrast) for j, s in enumerate(out)]


def _hide_and_fade(shot: Shot, rng: np.random.Generator, partial: float, low_contrast: float) -> Shot:
    n = shot.stop - shot.start
    things = []
    for t in shot.scene.things:
        # both draws are made for every object, so one knob never shifts the other's stream
        u_partial, u_faint = rng.random(), rng.random()
        if partial > 0 and u_partial < partial:
            t = dataclasses.replace(t, hidden=_hidden_frames(n, rng))
        if low_contrast > 0 and u_faint < low_contrast:
            t = dataclasses.replace(t, alpha=float(rng.uniform(*FAINT_ALPHA)))
        things.append(t)
    return dataclasses.replace(shot, scene=dataclasses.replace(shot.scene, things=tuple(things)))


def _hidden_frames(n: int, rng: np.random.Generator) -> tuple[tuple[int, int], ...]:
    """The frames [a, b) of an n-frame shot in which an object is not drawn: it enters, leaves or is occluded."""
    visible = max(1, int(round(rng.uniform(*VISIBLE_FRACTION) * n)))
    kind = int(rng.integers(0, 3))
    if kind == 2 and visible >= 2:  # occluded in the middle: seen at both ends
        a = int(rng.integers(1, visible))
        return ((a, a + n - visible),)
    if kind == 0 or kind == 2:  # enters late
        return ((0, n - visible),)
    return ((visible, n),)  # leaves early


def _add_flash(shots: list[Shot], rng: np.random.Generator) -> tuple[list[Shot], int | None]:
    """One more shot of 1-2 frames, taken from the end of a random shot, showing a scene of its own;
    with its position in the new list (None when no shot could give up a frame)."""
    j = int(rng.integers(0, len(shots)))
    host = shots[j]
    length = int(rng.integers(FLASH_FRAMES[0], FLASH_FRAMES[1] + 1))
    length = min(length, host.stop - host.start - 1)
    if length < 1:
        return shots, None
    phrases = {frozenset(t.phrase for t in s.scene.things) | {s.scene.background} for s in shots}
    while True:
        scene = random_scene(rng)
        if frozenset(t.phrase for t in scene.things) | {scene.background} not in phrases:
            break
    cut = host.stop - length
    flash = Shot(scene=scene, start=cut, stop=host.stop)
    return shots[:j] + [dataclasses.replace(host, stop=cut), flash] + shots[j + 1 :], j + 1
