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
      status.json            running / complete, with the final numbers"""

from __future__ import annotations

from .config import LOG_MAX_LOGIT_SCALE, TrainConfig, TrainResult, _seed_everything, epoch_length, epoch_order, epoch_views, lr_lambda, optimizer_groups, resolve_train_config  # noqa: F401
from .inputs import SplitArrays, TrainHeads, TrainStep, _batch_inputs, _score_inputs, text_state_batch, distributed_batch_loss, score_split  # noqa: F401
from .loop import _Data, _Run, _Trainer, _resolve_precision, _run_train, run_train  # noqa: F401
