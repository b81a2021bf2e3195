"""Every named choice a config accepts and the CLI offers, in one place.

Plain tuples that import no torch, so the CLI can build its options from them without
loading it; the configs validate against the same tuples, so the two can never disagree.
"""

from __future__ import annotations

from .variants import CONTROL_NAMES, VARIANT_CHOICES, VARIANT_NAMES

VARIANTS = VARIANT_NAMES  # variants.py: the four rows of Table 5a (what a ModelConfig holds)
# what `dab train --variant` and a sweep's variant= accept: the variants, then the controls (prob-fixvar,
# dab-fixvar, dab-const), each a variant with some model values (variants.py), never stored by name
CONTROLS = CONTROL_NAMES
VARIANT_OPTIONS = VARIANT_CHOICES
DIST_COSTS = ("kl", "w2")  # distributional costs of the prob / dab variants
# controls (docs/model.md): the Gaussians' variances learned, or fixed at e^logvar_init; the bridge's
# drift network, or one learned shift for every pair
VARIANCE_MODES = ("learned", "fixed")
DRIFTS = ("mlp", "constant")
# the bridge's training study (docs/model.md): what the drift network sees, how the step sizes are normalised
DRIFT_INPUTS = ("paper", "residual")
CHI_NORMS = ("minmax", "sum")
CLIP_DTYPES = ("auto", "float32", "bfloat16", "float16", "autocast-bf16")  # CLIP's compute dtype (extract)
STORE_DTYPES = ("float16", "float32")  # dtype of the stored features
SCORE_DTYPES = ("auto", "float32", "bfloat16")  # the scoring engine's product dtype (train, search)
# the one default of dab train's test costs, dab search, dab serve and the Python API: a query's confidence is one
# number wherever it is read (bf16 moves a margin by up to ~20 %), and a threshold chosen on a run's costs applies
DEFAULT_SCORE_DTYPE = "float32"
AMP_MODES = ("auto", "bf16", "none")  # training autocast
COST_FORMATS = ("auto", "h5", "zarr")  # the cost file's backend
# what picks best.pt: a text-to-video metric on the validation split, or "last" (the last epoch: the
# protocol that trains on every training video with no validation split and never selects on test)
SELECT_METRICS = ("R@1", "R@5", "R@10", "RSum", "MnR", "MdR", "last")
EPOCH_MODES = ("captions", "videos")  # what one training epoch visits
# the cosine variants' logit scale: with the new modules (lr, weight decay), or X-Pool's: CLIP's own
# parameter at clip_lr, no weight decay, clamped at 100
LOGIT_SCALE_GROUPS = ("new", "clip")
POSTPROCESS = ("none", "dsl", "is")  # evaluate: cost-matrix post-processing
# what a cost file holds: costs (lower is better) or similarities (higher is better); `dab evaluate --kind` says it
# for a bare .npy matrix, which cannot
COST_KINDS = ("cost", "similarity")
# video-to-text with several captions per video: other videos ranked by their best caption (X-Pool,
# CLIP4Clip), or every caption of every other video (stricter)
V2T_CONVENTIONS = ("videos", "captions")
DECODE_BACKENDS = ("pyav", "pyav-seek", "decord")  # video decoders (dab_pipeline.video)
# uncertainty (docs/uncertainty.md): the conformal scores a retrieval set is built with, and the maps
# `dab calibrate` fits (logistic over every feature, isotonic over the margin)
CONFORMAL_SCORES = ("lac", "aps", "raps", "normalized")
DEFAULT_CONFORMAL_SCORE = "aps"  # by the rule of docs/quality.md, measured 2026-12-06 (issue 47)
# the probability maps (logistic over every feature, isotonic over the margin, temperature scaling of the softmax
# over the first K0 costs, the raw softmax itself) and `dab calibrate --method`: one of them, or auto (the one of
# lowest cross-validated log loss on the fitting half, issue 60)
PROBABILITY_MAPS = ("logistic", "isotonic", "temperature", "softmax")
CALIBRATION_METHODS = ("auto", *PROBABILITY_MAPS)
DEFAULT_CALIBRATION_METHOD = "auto"
# the most videos one `dab serve` query may ask for (its page and API's k; -k above it is refused at start)
SERVE_MAX_K = 100
