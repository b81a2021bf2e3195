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

* ``config``: TrainConfig's dataset-dependent defaults, the optimiser groups, the seed, TrainResult;
* ``build``: a TrainConfig from typed values (options, a recipe, ``--set``, ``--resume``);
* ``inputs``: one batch's inputs;
* ``step``: the training step as one module, and its loss across ranks;
* ``scoring``: scoring a split (validation, the test cost file);
* ``session``: one run's folder, data and checkpoint I/O;
* ``trainer``: the Trainer, `dab train` as a task of the shared loop (:mod:`dab_pipeline.training`), its test pass and finish;
* ``run``: ``run_train``, which drives it.

What other stages share with training lives in the library, so that no stage imports another (sweep
aside): TrainConfig (:mod:`dab_pipeline.runs.config`), a split's arrays and the fine-tuned heads
(:mod:`dab_pipeline.runs.inputs`), the epoch order and lr schedule (:mod:`dab_pipeline.runs.schedule`).
"""

from __future__ import annotations

from .build import build_train_config, store_depth  # noqa: F401
from .config import LOG_MAX_LOGIT_SCALE, TrainResult, optimizer_groups, resolve_train_config  # noqa: F401
from .inputs import batch_inputs  # noqa: F401
from .run import run_train  # noqa: F401
from .scoring import score_split  # noqa: F401
from .session import RunData, TrainRun  # noqa: F401
from .step import TrainStep, distributed_batch_loss  # noqa: F401
