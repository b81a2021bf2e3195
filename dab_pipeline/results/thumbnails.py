"""Small JPEG thumbnails of a video's sampled frames, kept in the store to show retrieval results.

A thumbnail is a strip of ``THUMB_FRAMES`` of the video's sampled frames (first, middle and
last of the real ones), each ``THUMB_HEIGHT`` pixels high, side by side, as one JPEG of at
most ``THUMB_BYTES`` (the quality steps down until it fits). No upscaling: frames decoded
smaller than that keep their height.
"""

from __future__ import annotations

import io
from typing import Sequence

import numpy as np

__all__ = ["THUMB_FRAMES", "THUMB_HEIGHT", "THUMB_BYTES", "make_thumbnail", "THUMBNAIL_NOTE"]

THUMB_FRAMES = 3
THUMB_HEIGHT = 96
THUMB_BYTES = 24 * 1024
THUMBNAIL_NOTE = (
    f"{THUMB_FRAMES} sampled frames, {THUMB_HEIGHT} px high, side by side, JPEG (at most {THUMB_BYTES} bytes)"
)


def make_thumbnail(frames: Sequence[np.ndarray], mask: np.ndarray | None = None) -> bytes:
    """JPEG bytes of a strip of a video's frames; frames (H, W, 3) uint8, mask (F,) bool real frames."""
    from PIL import Image

    real = [i for i in range(len(frames)) if mask is None or bool(mask[i])] or [0]
    picks = sorted({real[int(round(x))] for x in np.linspace(0, len(real) - 1, THUMB_FRAMES)})
    tiles = []
    for i in picks:
        img = Image.fromarray(np.asarray(frames[i], np.uint8))
        h = min(THUMB_HEIGHT, img.height)
        w = max(1, round(img.width * h / img.height))
        tiles.append(img.resize((w, h), Image.BICUBIC) if (w, h) != img.size else img)
    strip = Image.new("RGB", (sum(t.width for t in tiles), max(t.height for t in tiles)))
    x = 0
    for t in tiles:
        strip.paste(t, (x, 0))
        x += t.width
    for quality in (85, 70, 55, 40, 25):
        buf = io.BytesIO()
        strip.save(buf, format="JPEG", quality=quality)
        if buf.tell() <= THUMB_BYTES:
            return buf.getvalue()
    strip.thumbnail((strip.width // 2, strip.height // 2))  # a huge aspect ratio: halve it
    buf = io.BytesIO()
    strip.save(buf, format="JPEG", quality=25)
    return buf.getvalue()[:THUMB_BYTES] if buf.tell() > THUMB_BYTES else buf.getvalue()
