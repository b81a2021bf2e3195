"""What every trainer writes when it is done: the test split's cost file, as `dab evaluate` reads it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..core.overrides import to_dict
from ..runs.costfile import CostMatrix

EXTRAS = ("text_var", "bridged_var", "video_var")  # per-query diagnostics a scoring result may carry


def run_costs(res: Any, test: Any, cfg: Any, best_epoch: Any) -> CostMatrix:
    """The cost file of a run's test pass: ``res`` (a scoring result over ``test``, the test split's arrays)
    scored by the checkpoint of ``best_epoch``, with the run's config ``cfg``, its split and store recorded."""
    extras = {k: np.asarray(getattr(res, k)) for k in EXTRAS if getattr(res, k, None) is not None}
    return CostMatrix(
        cost=np.asarray(res.cost, dtype=np.float32),
        query_ids=np.asarray(test.caption_ids),
        video_ids=np.asarray(test.video_ids),
        gt=test.caption_video.numpy().astype(np.int64),
        kind="cost",
        extras=extras,
        attrs={
            "config": json.dumps(to_dict(cfg), default=str),
            "split": cfg.test_split,
            "best_epoch": best_epoch,
            "variant": cfg.model.variant,
            "store": str(cfg.features),
        },
    )
