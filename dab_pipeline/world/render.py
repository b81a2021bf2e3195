"""Drawing scenes into RGB frames (numpy only): anti-aliased shapes on textured backgrounds."""

from __future__ import annotations

import numpy as np

from .scene import BACKGROUNDS, COLOURS, Scene, Shot, Thing

_SUPERSAMPLE = 2  # coverage from a 2x2 grid per pixel: smooth edges at 64 px


def _bounce(p0: float, v: float, k: int, lo: float, hi: float) -> float:
    """Position after k frames of constant velocity, reflected off the walls lo and hi."""
    span = hi - lo
    if span <= 0:
        return (lo + hi) / 2
    u = (p0 - lo + v * k) % (2 * span)
    return lo + (u if u <= span else 2 * span - u)


def _shape_mask(shape: str, dx: np.ndarray, dy: np.ndarray, r: float) -> np.ndarray:
    """Boolean coverage of ``shape`` of radius r at offsets (dx, dy) from its centre."""
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        return (np.abs(dx) <= 0.8 * r) & (np.abs(dy) <= 0.8 * r)
    if shape == "diamond":
        return np.abs(dx) + np.abs(dy) <= 1.1 * r
    if shape == "cross":
        arm = 0.32 * r
        return ((np.abs(dx) <= arm) & (np.abs(dy) <= r)) | ((np.abs(dy) <= arm) & (np.abs(dx) <= r))
    if shape == "ring":
        d2 = dx * dx + dy * dy
        return (d2 <= r * r) & (d2 >= (0.55 * r) ** 2)
    if shape == "triangle":
        # upward equilateral triangle, circumradius r, centroid at the centre: apex at -r,
        # base at r/2 with half-width r*sqrt(3)/2, widening linearly in between
        inside_y = (dy >= -r) & (dy <= 0.5 * r)
        half_width = 0.866 * r * (dy + r) / (1.5 * r)
        return inside_y & (np.abs(dx) <= half_width)
    raise ValueError(f"unknown shape {shape!r}")


def _background(name: str, size: tuple[int, int], seed: int) -> np.ndarray:
    w, h = size
    base, texture = BACKGROUNDS[name]
    img = np.broadcast_to(np.array(base, np.float32), (h, w, 3)).copy()  # (H, W, 3)
    rng = np.random.default_rng(seed)
    if texture == "speckle":
        img += rng.normal(0.0, 18.0, size=(h, w, 1)).astype(np.float32)
    elif texture == "stripes":
        yy, xx = np.mgrid[0:h, 0:w]
        period = max(4, min(w, h) // 8)
        img += np.where(((xx + yy) // period) % 2 == 0, 18.0, -18.0)[..., None].astype(np.float32)
    return img


def _draw(img: np.ndarray, thing: Thing, k: int, background: tuple[int, int, int]) -> None:
    """Blend ``thing`` at frame k of its shot into ``img`` (H, W, 3) float32, in place.

    A hidden frame draws nothing; a faint object (alpha < 1) takes a colour between its own and
    the background's base colour.
    """
    if not thing.visible_at(k):
        return
    h, w = img.shape[:2]
    side = min(w, h)
    r = thing.radius * side
    cx = _bounce(thing.x, thing.vx, k, thing.radius, 1 - thing.radius) * w
    cy = _bounce(thing.y, thing.vy, k, thing.radius, 1 - thing.radius) * h
    x0, x1 = max(0, int(cx - r) - 1), min(w, int(cx + r) + 2)
    y0, y1 = max(0, int(cy - r) - 1), min(h, int(cy + r) + 2)
    if x0 >= x1 or y0 >= y1:
        return
    s = _SUPERSAMPLE
    offs = (np.arange(s) + 0.5) / s  # sub-pixel sample positions
    ys = (np.arange(y0, y1)[:, None] + offs[None, :]).reshape(-1)  # (Hb*s,)
    xs = (np.arange(x0, x1)[:, None] + offs[None, :]).reshape(-1)  # (Wb*s,)
    dy, dx = np.meshgrid(ys - cy, xs - cx, indexing="ij")  # (Hb*s, Wb*s)
    cover = _shape_mask(thing.shape, dx, dy, r).astype(np.float32)
    cover = cover.reshape(y1 - y0, s, x1 - x0, s).mean(axis=(1, 3))[..., None]  # (Hb, Wb, 1)
    colour = np.array(COLOURS[thing.colour], np.float32)
    if thing.alpha < 1.0:
        base = np.array(background, np.float32)
        colour = base + thing.alpha * (colour - base)
    patch = img[y0:y1, x0:x1]
    patch[...] = patch * (1.0 - cover) + colour * cover


def render_scene(scene: Scene, k: int, size: tuple[int, int], noise_seed: int) -> np.ndarray:
    """Frame k (from the shot's start) of ``scene`` as (H, W, 3) uint8; ``size`` is (W, H)."""
    img = _background(scene.background, size, scene.texture_seed)
    for thing in scene.things:
        _draw(img, thing, k, BACKGROUNDS[scene.background][0])
    # a little sensor noise, fresh per frame, so no two frames are identical
    img += np.random.default_rng(noise_seed).normal(0.0, 3.0, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def render_video(shots: list[Shot], size: tuple[int, int], seed: int) -> np.ndarray:
    """All frames of a video of these shots: (T, H, W, 3) uint8."""
    frames = []
    for shot in shots:
        for k in range(shot.stop - shot.start):
            frames.append(render_scene(shot.scene, k, size, noise_seed=seed * 100_003 + shot.start + k))
    return np.stack(frames)
