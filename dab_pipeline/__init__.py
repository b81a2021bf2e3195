"""dab: Distribution-Alignment Bridge for uncertainty-aware text-to-video retrieval.

The public Python API (docs/api.md): the names in ``__all__``, importable from ``dab_pipeline`` itself::

    import dab_pipeline as dab

    run = dab.load_run("runs/dab")
    with dab.open_store("store.h5") as store:
        test = store.load_split("test")
    result = dab.score_all(run.model, test.text, test.frames, test.frame_mask, k=10)
    print(dab.t2v_metrics(result.cost, test.caption_video))

They are loaded on first use, so ``import dab_pipeline`` stays cheap (no torch until a name needs it). Every
other module is private by convention: its names may change between versions.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> the module that defines it (kept stable: a move inside the package changes this table, not the API)
_API = {
    # stores of frame and caption features
    "open_store": "dab_pipeline.store",
    "FeatureStore": "dab_pipeline.store",
    "SplitFeatures": "dab_pipeline.store",
    # trained runs and the model
    "load_run": "dab_pipeline.runs.load",
    "LoadedRun": "dab_pipeline.runs.load",
    "DABModel": "dab_pipeline.model",
    "ModelConfig": "dab_pipeline.model",
    # scoring and metrics
    "score_all": "dab_pipeline.scoring",
    "Scorer": "dab_pipeline.scoring.scorer",
    "first_stage": "dab_pipeline.scoring.first_stage",
    "ScoreResult": "dab_pipeline.scoring.result",
    "t2v_metrics": "dab_pipeline.metrics",
    "v2t_metrics": "dab_pipeline.metrics",
    # free-text search
    "Searcher": "dab_pipeline.search",
    "SearchResult": "dab_pipeline.search",
    "SearchHit": "dab_pipeline.search",
    # calibrated probabilities, conformal sets, answers with a risk guarantee (docs/uncertainty.md)
    "CalibrateConfig": "dab_pipeline.stages.calibrate",
    "run_calibrate": "dab_pipeline.stages.calibrate",
    "Calibration": "dab_pipeline.calibration",
    "read_calibration": "dab_pipeline.calibration",
    "UncertaintyRequest": "dab_pipeline.calibration",
    "QueryUncertainty": "dab_pipeline.calibration",
    # the stages, as the CLI runs them
    "build_extract_config": "dab_pipeline.stages.extract",
    "run_extract": "dab_pipeline.stages.extract",
    "TrainConfig": "dab_pipeline.runs.config",
    "build_train_config": "dab_pipeline.stages.train",
    "run_train": "dab_pipeline.stages.train",
    "EvaluateConfig": "dab_pipeline.stages.evaluate",
    "run_evaluate": "dab_pipeline.stages.evaluate",
    "SearchConfig": "dab_pipeline.stages.search",
    "run_search": "dab_pipeline.stages.search",
    "ServeConfig": "dab_pipeline.stages.serve",
    "run_serve": "dab_pipeline.stages.serve",
    # errors: every mistake a user can make raises a DabError with a one-line message
    "DabError": "dab_pipeline.core.errors",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'dab_pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
