"""Retrieval metrics and uncertainty diagnostics, as pure numpy functions.

Conventions (see docs/metrics.md for the full discussion):

* ``cost`` is a ``(Q, V)`` matrix, lower is better; ``gt`` is ``(Q,)`` int, the
  index of each query's ground-truth video.  Several queries may share a video
  (MSVD, VATEX): every caption is one text-to-video query.
* Ranks are 1-based and ties are broken **pessimistically**: the ground truth
  is placed after every competitor whose cost is ``<=`` its own.  A constant
  cost matrix therefore scores R@1 = 0, never 100.
* Recalls are percentages; AURC and risks are fractions in ``[0, 1]``.
* Post-processing (dual softmax, inverted softmax) is off by default and, when
  used through :func:`evaluate_all`, is always named in the output.

Nothing here imports torch: the evaluation stage converts once and the
functions stay testable on hand-written matrices."""

from __future__ import annotations

from ..core.choices import V2T_CONVENTIONS  # noqa: F401  (re-exported)
from .diagnostics import (  # noqa: F401
    lowrank_variance_share,
    mixture_topk_components,
    mixture_weights,
    semantic_neighbourhood,
    shift_decomposition,
    subspace_share,
    text_logdet,
    topk_videos,
    variance_asymmetry,
)
from .relevance import ranked_relevance, relevance_metrics  # noqa: F401
from .retrieval import (  # noqa: F401
    POSTPROCESS_NAMES,
    RECALL_KS,
    dual_softmax,
    evaluate_all,
    inverted_softmax,
    retrieval_metrics,
    t2v_metrics,
    t2v_ranks,
    v2t_metrics,
    v2t_ranks,
    v2t_ranks_by_video,
)
from .selective import (  # noqa: F401
    accuracy_at_coverage,
    aurc,
    aurc_optimal,
    aurc_random,
    aurc_random_mc,
    kl_margin,
    risk_coverage,
    selective_report,
    threshold_outcome,
)
from .stats import average_ranks, paired_bootstrap, spearman  # noqa: F401

__all__ = [
    "RECALL_KS",
    "t2v_ranks",
    "v2t_ranks",
    "v2t_ranks_by_video",
    "V2T_CONVENTIONS",
    "retrieval_metrics",
    "t2v_metrics",
    "v2t_metrics",
    "evaluate_all",
    "dual_softmax",
    "inverted_softmax",
    "POSTPROCESS_NAMES",
    "kl_margin",
    "risk_coverage",
    "aurc",
    "aurc_random",
    "aurc_random_mc",
    "aurc_optimal",
    "accuracy_at_coverage",
    "selective_report",
    "threshold_outcome",
    "variance_asymmetry",
    "semantic_neighbourhood",
    "shift_decomposition",
    "lowrank_variance_share",
    "text_logdet",
    "mixture_weights",
    "mixture_topk_components",
    "topk_videos",
    "subspace_share",
    "ranked_relevance",
    "relevance_metrics",
    "paired_bootstrap",
    "average_ranks",
    "spearman",
]
