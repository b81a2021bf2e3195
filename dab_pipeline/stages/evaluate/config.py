"""EvaluateConfig: what `dab evaluate` reads, computes and writes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ...core.choices import COST_KINDS, POSTPROCESS, V2T_CONVENTIONS
from ...core.errors import ConfigError


@dataclass(frozen=True)
class EvaluateConfig:
    run: Optional[Path] = None  # a run folder written by `dab train`
    costs: Optional[Path] = None  # or any cost file of the documented layout
    features: Optional[Path] = None  # store for the neighbourhood diagnostic (default: the run's store)
    out: Optional[Path] = None  # where reports go (default: the run folder / the cost file's folder)
    postprocess: str = "none"  # none | dsl (dual softmax) | is (inverted softmax); always labelled
    # several captions per video: rank the other videos by their best caption (X-Pool, CLIP4Clip) or
    # every caption ("captions"); labelled in metrics.json and the report
    v2t: str = "videos"
    postprocess_temperature: float = 0.01  # of the post-processing softmax, on similarities = -cost
    # the neighbourhood diagnostic: a video is a semantic positive when its cosine to the ground truth is >= one
    cosine_thresholds: tuple[float, ...] = (0.6, 0.7, 0.8, 0.9)
    k: int = 10  # the top-ranked videos the neighbourhood and mixture diagnostics look at
    seed: int = 0
    plots: bool = True
    examples: int = 24  # queries shown in examples.html (thumbnails of what was retrieved); 0: no page
    # score ``features``' test split with CLIP alone (mean-pooled frames, stages/evaluate/zeroshot.py) instead of a
    # run; a published zero-shot figure for the store's dataset and CLIP is put beside its own (results/published.py)
    zero_shot: bool = False
    # what ``costs`` holds, "cost" (lower is better) or "similarity" (higher is better): required for a bare .npy
    # matrix, which cannot say; checked against the file for the other formats (`dab evaluate --kind`)
    costs_kind: Optional[str] = None

    def __post_init__(self) -> None:
        if self.zero_shot:
            if self.run is not None or self.costs is not None or self.features is None:
                raise ConfigError("--zero-shot scores a store: give --features STORE, and neither --run nor --costs")
        elif self.run is None and self.costs is None:
            raise ConfigError("give a run folder (--run), a cost file (--costs) or --zero-shot --features STORE")
        if self.costs_kind is not None:
            if self.costs_kind not in COST_KINDS:
                raise ConfigError(f"kind must be one of {', '.join(COST_KINDS)}, got {self.costs_kind!r}")
            if self.costs is None:
                raise ConfigError("--kind says what a --costs file holds: give it with --costs only")
        elif self.costs is not None and Path(self.costs).suffix.lower() == ".npy":
            raise ConfigError(
                f"{self.costs} is a bare .npy matrix that cannot say whether lower or higher is better: give "
                "--kind cost (lower is better) or --kind similarity (higher is better) (EvaluateConfig: costs_kind=)"
            )
        if self.postprocess not in POSTPROCESS:
            raise ConfigError(f"postprocess must be one of {', '.join(POSTPROCESS)}, got {self.postprocess!r}")
        if self.v2t not in V2T_CONVENTIONS:
            raise ConfigError(f"v2t must be one of {', '.join(V2T_CONVENTIONS)}, got {self.v2t!r}")
        if self.postprocess_temperature <= 0:
            raise ConfigError(f"the post-processing temperature must be > 0, got {self.postprocess_temperature}")
        if self.examples < 0:
            raise ConfigError(f"examples must be >= 0, got {self.examples}")
        if self.k < 1:
            raise ConfigError(f"k must be >= 1, got {self.k}")
