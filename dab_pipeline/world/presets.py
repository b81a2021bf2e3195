"""Named worlds (``presets.json``): the benchmark's, its quick variant, the uncertain ones (the same worlds with
video-side uncertainty, world/uncertainty.py), the demo's, and a tiny one for tests.

Their seeds and sizes were fixed before any model was trained or scored on them,
and are not to be changed to favour a variant (docs/quality.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.registry import Registry
from .generate import WorldConfig

PRESETS: Registry[WorldConfig] = Registry("world preset")
for _name, _values in json.loads((Path(__file__).parent / "presets.json").read_text()).items():
    PRESETS.register(_name, WorldConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in _values.items()}))

# The pretraining part of the world that dab-world (the world's CLIP) learns from: its own
# random stream (generate.pretrain_frame), never a benchmark video.
PRETRAIN_SEED = 1000


def world_preset(name: str) -> WorldConfig:
    """The named world; an unknown name lists the valid ones."""
    return PRESETS.get(name)
