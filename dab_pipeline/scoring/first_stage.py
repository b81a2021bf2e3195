"""The first stage of a search: each query's K candidate videos, which DAB then re-ranks with its full cost.

One contract for both search paths. :func:`first_stage` takes unit query vectors (M, D) and a *source*,
anything with ``search(queries, k, **options) -> (ids (M, k) int64, scores (M, k) float32)``: the ids of
the k largest inner products, best first, -1 where the source holds fewer than k videos (tie order is the
source's). Two sources exist:

* :class:`ExactVectors`: unit vectors in memory, searched exactly. ``Scorer.score(shortlist=K)`` (and
  ``score_all``) uses it on the split it scores, with the ``mean`` vectors of ``index/vectors.py``: the
  cosine of the text and the mean of the video's real (raw) frames (:func:`frame_mean_vectors`,
  :func:`text_vectors`);
* ``index.VideoIndex`` (``dab index``, FAISS): the same search over the vectors of an index folder, of
  whichever kind it was built with (``search.Searcher`` maps queries with ``index.query_vectors``).

K defaults to :data:`DEFAULT_SHORTLIST` wherever a first stage runs without one: with an index a query's
shortlist is 100 videos unless ``--shortlist`` says otherwise. Without an index the whole split is in
memory and is scored exactly unless a shortlist is asked for.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.errors import ConfigError

__all__ = [
    "DEFAULT_SHORTLIST",
    "CandidateSource",
    "ExactVectors",
    "check_shortlist",
    "first_stage",
    "frame_mean_vectors",
    "text_vectors",
]

# Videos a query keeps for the re-rank: on the world's 500 test videos a shortlist of 100 keeps 95-96 % of
# full scoring's top 10 with the index's default vectors (docs/search.md, benchmarks/search_recall.py).
DEFAULT_SHORTLIST = 100


class CandidateSource(Protocol):
    """What :func:`first_stage` searches: an index, or vectors in memory."""

    def search(
        self, queries: np.ndarray, shortlist: int, **options: Any
    ) -> tuple[
        np.ndarray, np.ndarray
    ]: ...  # queries (M, D) -> ids (M, K) int64 (-1: none), scores (M, K) float32, best first


def check_shortlist(shortlist: Any) -> int:
    """``shortlist`` as an int >= 1, else the one ConfigError every entry point gives. Checked where it enters: a
    stage's config (SearchConfig, ServeSettings, CalibrateConfig: before anything loads), the Searcher's
    ``search`` and ``search_batch`` (before a query is encoded) and :func:`first_stage` (a caller of it, of
    ``Scorer.score`` or of ``score_all``); ``Searcher.rank`` and ``Scorer.score`` pass it on unchecked."""
    if isinstance(shortlist, bool) or not isinstance(shortlist, (int, np.integer)) or int(shortlist) < 1:
        raise ConfigError(f"shortlist must be a positive integer, got {shortlist}")
    return int(shortlist)


def first_stage(
    queries: np.ndarray | Tensor, source: CandidateSource, shortlist: Optional[int] = None, **options: Any
) -> np.ndarray:
    """Each query's ``shortlist`` (K, default :data:`DEFAULT_SHORTLIST`) candidate videos, best first -> (M, K')
    int64.

    ``queries`` (M, D) are unit vectors in ``source``'s space; K' = min(K, the videos it holds); an id is -1
    where a source returns fewer (an approximate index). ``options`` go to ``source.search`` (``nprobe``).
    """
    shortlist = DEFAULT_SHORTLIST if shortlist is None else check_shortlist(shortlist)
    ids, _ = source.search(queries, shortlist, **options)
    return np.asarray(ids, np.int64)


def frame_mean_vectors(frames: Tensor, mask: Tensor) -> Tensor:
    """frames (V, F, D), mask (V, F) bool -> (V, D) unit mean of each video's real frames (the ``mean`` kind)."""
    m = mask.to(frames.dtype)[..., None]  # (V, F, 1)
    mean = (frames * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)  # (V, D)
    return F.normalize(mean, dim=-1)


def text_vectors(text: Tensor) -> Tensor:
    """text (M, D) -> (M, D) unit vectors: the query side of every kind but ``pooled``."""
    return F.normalize(text, dim=-1)


class ExactVectors:
    """Unit video vectors (V, D) held on ``device`` and searched exactly, ``rows_per_block`` queries at a time."""

    def __init__(self, vectors: Tensor, device: torch.device, rows_per_block: int = 1024) -> None:
        self.vectors = vectors.to(device)  # (V, D)
        self.device, self.rows_per_block = device, max(1, int(rows_per_block))

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    def search(self, queries: np.ndarray | Tensor, shortlist: int, **options: Any) -> tuple[np.ndarray, np.ndarray]:
        """queries (M, D) unit -> (ids (M, K'), scores (M, K')) of the K' = min(shortlist, V) largest inner
        products."""
        if options:
            raise TypeError(f"exact vectors take no search options, got {sorted(options)}")
        q = queries if isinstance(queries, Tensor) else torch.from_numpy(np.asarray(queries, np.float32))
        k = min(int(shortlist), len(self))  # checked by first_stage, its caller
        ids, scores = np.empty((q.shape[0], k), np.int64), np.empty((q.shape[0], k), np.float32)
        for q0 in range(0, q.shape[0], self.rows_per_block):
            sim = q[q0 : q0 + self.rows_per_block].to(self.device) @ self.vectors.T  # (b, V)
            top = torch.topk(sim, k, dim=1)
            ids[q0 : q0 + len(sim)] = top.indices.cpu().numpy()
            scores[q0 : q0 + len(sim)] = top.values.float().cpu().numpy()
        return ids, scores
