"""The plain reference the decoders are checked against: every frame, read from the start.

Deliberately the simplest loop PyAV allows (no sampling, no resize, no seeking),
so that tests and ``benchmarks/decoders.py`` compare dab's decoders with the
definition of frame ``i`` rather than with themselves.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def read_every_frame(path: Path) -> list[np.ndarray]:
    """All frames of a sequential read as (H, W, 3) uint8 RGB, as coded (no rotation), skipping
    packets the decoder rejects."""
    import av

    frames = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            try:
                frames.extend(f.to_ndarray(format="rgb24") for f in packet.decode())
            except av.FFmpegError:
                continue
    return frames
