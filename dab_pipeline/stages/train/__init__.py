"""Stage two: train DAB (or an ablation variant) on a cached feature store.

A run folder holds everything needed to trace and rebuild a result:

    runs/NAME/
      config.json            resolved TrainConfig (as asked: amp / score_dtype may say auto)
      precision.json         amp and score dtype as this machine ran them, and why (its capabilities)
      store_manifest.json    the manifest of the store the run read
      metrics.jsonl          one line per epoch (train loss, validation metrics)
      checkpoints/last.pt    resumable state (model, heads, optimiser, scheduler, RNG, position)
      checkpoints/best.pt    best validation checkpoint (model selection never looks at test)
      costs_test.h5|.zarr    test cost matrix, rankings, per-query variances (read by `dab evaluate`)
      status.json            running / complete, with the final numbers

(the layout's one home is :class:`dab_pipeline.runs.run_folder.RunFolder`).

* ``config``: TrainConfig, its dataset-dependent defaults, the optimiser groups and schedule;
* ``build``: a TrainConfig from typed values (options, a recipe, ``--set``, ``--resume``);
* ``inputs``: a split's arrays in RAM, the fine-tuned CLIP heads, one batch's inputs;
* ``step``: the training step as one module, and its loss across ranks;
* ``scoring``: scoring a split (validation, the test cost file);
* ``folder``: one run's folder, data and checkpoint I/O;
* ``loop``: ``run_train`` and the trainer (restore, fit, test, finish).
"""

from __future__ import annotations

from .build import build_train_config, store_depth  # noqa: F401
from .config import (  # noqa: F401
                     LOG_MAX_LOGIT_SCALE,
                     TrainConfig,
                     TrainResult,
                     epoch_length,
                     epoch_order,
                     epoch_views,
                     lr_lambda,
                     optimizer_groups,
                     resolve_train_config,
)
from .inputs import SplitArrays, TrainHeads, batch_inputs, text_state_batch  # noqa: F401
from .loop import run_train  # noqa: F401
from .scoring import score_split  # noqa: F401
from .session import RunData, TrainRun  # noqa: F401
from .step import TrainStep, distributed_batch_loss  # noqa: F401
