"""All-pairs scoring of a split in bounded memory: the plain reference and the fast engine.

The per-pair work of DAB (text-conditioned pooling, video Gaussian, bridge) cannot
be factored into one embedding per side, so every (text, video) pair runs through
the model.  Two implementations share one result type:

* :func:`score_all_reference` calls the model block by block: texts in chunks of
  ``text_chunk`` and videos in chunks of ``video_chunk`` (the paper's 128 / 512),
  so the largest per-pair tensor is ``(text_chunk, video_chunk, D)`` whatever the
  split size.  It is the correctness reference; the engine must match it.
* :class:`Scorer` is the engine used by validation, ``dab train``'s final cost
  matrices, ``dab search`` and ``dab serve``: one model's engines, built once per
  (device, dtype, batch hint) and kept while it lives, its grids planned and tuned
  inside. ``Scorer(model, device=, dtype=, memory_budget=).score(text, frames, mask,
  gt=, k=, progress=, shortlist=)``; :func:`score_all` is that call on a
  throwaway Scorer. It computes the same function as the reference with the
  algebra taken out of the per-pair loop (docs/performance.md derives it):

  - per text, once: the pooling query, the text Gaussian, and the bridge's first
    step (its state is still the text Gaussian, so its projection is per text);
  - per video, once: keys, the value and output projections folded into one set
    of per-frame vectors, everything linear behind the pooling (``linear_proj``,
    the probabilistic heads, the token term ``W2 v_c``, the bridge's mu_v block)
    pushed through the LayerNorms onto per-frame bases, and the token branch;
  - per pair: attention weights, a few small batched products against those
    bases, the per-pair LayerNorm statistics, the sigma_v block of the bridge's
    first layer, then T' steps of large matrix products and the cost.

  Sub-blocks are sized from a memory budget (``planning.py``), never a ``(Q, V, D)``
  tensor for the split; ``dtype="bfloat16"`` runs the bridge's matrix products in
  bf16 (float32 accumulation, float32 states and cost); ``k`` returns each
  query's ranked best videos; ``shortlist=K`` scores only each query's K candidates
  of the first stage (``first_stage.py``: the cosine of the text and the frame
  mean; the others get ``+inf``).

:func:`first_stage` is the one candidate selection of both search paths: over
vectors in memory (:class:`ExactVectors`, what ``shortlist=K`` runs) or a ``dab
index`` (FAISS); K defaults to :data:`DEFAULT_SHORTLIST` (100) wherever one runs
without a K."""

from __future__ import annotations

from .blocks import OneDNN, Texts, Videos, pack_kept  # noqa: F401
from .bridge_probe import PROBE_SIDE, BridgeProbe, bridge_shifts, constant_bridge, probe_bridge, probe_grid  # noqa: F401
from .budget import default_memory_budget, engine_macs, pair_bytes, reference_macs  # noqa: F401
from .driver import score_all  # noqa: F401
from .engines import ENGINES, BridgeRunner, Engine, build_engine  # noqa: F401
from .first_stage import (  # noqa: F401
    DEFAULT_SHORTLIST,
    CandidateSource,
    ExactVectors,
    first_stage,
    frame_mean_vectors,
    text_vectors,
)
from .passes import topk_smallest  # noqa: F401
from .planning import inner_tiles, tune_blocks  # noqa: F401
from .reference import score_all_reference, score_query  # noqa: F401
from .result import SCORE_DTYPES, ScoreResult  # noqa: F401
from .scorer import Scorer  # noqa: F401

__all__ = [
    "Scorer",
    "ScoreResult",
    "score_all",
    "first_stage",
    "DEFAULT_SHORTLIST",
    "CandidateSource",
    "ExactVectors",
    "frame_mean_vectors",
    "text_vectors",
    "score_all_reference",
    "score_query",
    "default_memory_budget",
    "pair_bytes",
    "engine_macs",
    "reference_macs",
    "topk_smallest",
    "tune_blocks",
    "SCORE_DTYPES",
    "ENGINES",
    "Engine",
    "build_engine",
    "inner_tiles",
    "BridgeProbe",
    "PROBE_SIDE",
    "probe_bridge",
    "probe_grid",
    "bridge_shifts",
    "constant_bridge",
]
