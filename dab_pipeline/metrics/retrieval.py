"""Ranks and recall metrics in both directions, and the labelled post-processing.

The post-processings (dual softmax, inverted softmax) are softmaxes over costs at a temperature of their own,
``postprocess_temperature`` (``dab evaluate --temperature``); it has nothing to do with the model's PAC
temperature ``tau`` that training learns or fixes (``DABModel.temperature()``, docs/model.md)."""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from ..core.choices import V2T_CONVENTIONS
from ..core.errors import ConfigError

RECALL_KS: tuple[int, ...] = (1, 5, 10, 50)


POSTPROCESS_NAMES: tuple[str, ...] = ("none", "dsl", "is")


# Rows (or columns) handled per block: bounds temporaries to a few tens of MB
# even for 30K x 1.5K matrices, while keeping numpy's per-call overhead small.
_BLOCK_ELEMS = 1 << 22


def as_cost(cost: Any, name: str = "cost") -> np.ndarray:
    arr = np.asarray(cost)
    if arr.ndim != 2:
        raise ConfigError(f"{name} must be a 2-D (Q, V) matrix, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ConfigError(f"{name} is empty (shape {arr.shape})")
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    if np.isnan(arr).any():
        # A NaN compares false with everything, which would silently rank it
        # best or worst depending on the comparison; refuse instead.
        raise ConfigError(f"{name} contains {int(np.isnan(arr).sum())} NaN entries")
    return arr


def as_gt(gt: Any, num_queries: int, num_videos: int) -> np.ndarray:
    arr = np.asarray(gt)
    if arr.ndim != 1 or arr.shape[0] != num_queries:
        raise ConfigError(
            f"gt must have shape ({num_queries},) to match cost ({num_queries}, {num_videos}), got {arr.shape}"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ConfigError(f"gt must hold integer video indices, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= num_videos):
        raise ConfigError(f"gt indices must lie in [0, {num_videos}), got range [{arr.min()}, {arr.max()}]")
    return arr


def as_1d(values: Any, name: str, dtype: Any = np.float64) -> np.ndarray:
    arr = np.asarray(values, dtype=dtype)
    if arr.ndim != 1:
        raise ConfigError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ConfigError(f"{name} is empty")
    return arr


def row_blocks(n: int, width: int) -> Iterator[slice]:
    step = max(1, _BLOCK_ELEMS // max(1, width))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def t2v_ranks(cost: Any, gt: Any) -> np.ndarray:
    """1-based text-to-video rank of each query's ground-truth video.

    ``rank[q] = 1 + #{v != gt[q] : cost[q, v] <= cost[q, gt[q]]}``: ties are
    broken pessimistically, so a query whose ground truth ties with another
    video does not get credit for an order the model did not express.

    cost (Q, V), gt (Q,) -> (Q,) int64 in [1, V].
    """
    c = as_cost(cost)
    q_count, v_count = c.shape
    g = as_gt(gt, q_count, v_count)
    ranks = np.empty(q_count, dtype=np.int64)
    for rows in row_blocks(q_count, v_count):
        block = c[rows]  # (b, V)
        gt_cost = block[np.arange(block.shape[0]), g[rows]]  # (b,)
        # The ground truth itself always satisfies <=, so the count is already 1-based.
        ranks[rows] = np.count_nonzero(block <= gt_cost[:, None], axis=1)
    return ranks


def v2t_ranks(cost: Any, gt: Any, convention: str = "videos") -> np.ndarray:
    """1-based video-to-text rank of each video that has at least one caption.

    ``convention`` (:data:`V2T_CONVENTIONS`) matters only where a video has several
    captions. ``"videos"`` (the default, X-Pool's and CLIP4Clip's): each video ranks the
    *other videos*, each counted once by its best caption, and its rank is where its own
    best caption falls among them (:func:`v2t_ranks_by_video`). ``"captions"`` (stricter):
    it ranks every caption of every other video, as below. Both agree when every video
    has one caption (MSR-VTT 1K-A).

    ``"captions"``: each video ranks all ``Q`` queries by its column of ``cost``; its rank is
    the best rank of any of its own captions.  With pessimistic ties this is
    ``1 + #{q : gt[q] != v and cost[q, v] <= min_{gt[q'] = v} cost[q', v]}``:
    captions of other videos that tie with the best own caption go first, ties
    between two own captions cost nothing (either order puts a positive first).

    cost (Q, V), gt (Q,) -> (V',) int64, V' = number of captioned videos, in
    video-index order (V' == V when every video has a caption).
    """
    if convention not in V2T_CONVENTIONS:
        raise ConfigError(f"unknown video-to-text convention {convention!r}; valid: {', '.join(V2T_CONVENTIONS)}")
    if convention == "videos":
        return v2t_ranks_by_video(cost, gt)
    c = as_cost(cost)
    q_count, v_count = c.shape
    g = as_gt(gt, q_count, v_count)
    best_own = np.full(v_count, np.inf, dtype=np.float64)  # (V,)
    own_cost = c[np.arange(q_count), g].astype(np.float64)  # (Q,)
    np.minimum.at(best_own, g, own_cost)
    has_caption = np.bincount(g, minlength=v_count) > 0  # (V,)

    ahead = np.zeros(v_count, dtype=np.int64)  # (V,) queries with cost <= best own
    own_ahead = np.zeros(v_count, dtype=np.int64)  # (V,) of which own captions
    for rows in row_blocks(q_count, v_count):
        le = c[rows] <= best_own[None, :]  # (b, V)
        ahead += np.count_nonzero(le, axis=0)
        rows_idx = np.arange(le.shape[0])
        np.add.at(own_ahead, g[rows], le[rows_idx, g[rows]].astype(np.int64))
    ranks = 1 + ahead - own_ahead
    return ranks[has_caption]


def v2t_ranks_by_video(cost: Any, gt: Any) -> np.ndarray:
    """Video-to-text ranks with every other video counted once, by its best caption.

    ``best[u, v] = min over u's captions q of cost[q, v]``; video v's rank is
    ``1 + #{u != v : best[u, v] <= best[v, v]}`` over the captioned videos u
    (pessimistic ties, as everywhere here). cost (Q, V), gt (Q,) -> (V',) int64 in
    video-index order, V' = captioned videos.
    """
    c = as_cost(cost)
    q_count, v_count = c.shape
    g = as_gt(gt, q_count, v_count)
    order = np.argsort(g, kind="stable")  # (Q,) captions grouped by their video
    videos, starts = np.unique(g[order], return_index=True)  # (V',) captioned videos, group starts
    ranks = np.empty(len(videos), dtype=np.int64)
    for cols in row_blocks(v_count, q_count):  # video columns in blocks: best is (V', b)
        best = np.minimum.reduceat(c[order, cols], starts, axis=0)  # (V', b)
        in_block = (videos >= cols.start) & (videos < cols.stop)  # which captioned videos are columns here
        pos = np.nonzero(in_block)[0]  # rows of best that are the block's own videos
        own = best[pos, videos[pos] - cols.start]  # (n,)
        ranks[pos] = np.count_nonzero(best[:, videos[pos] - cols.start] <= own[None, :], axis=0)  # own counts once
    return ranks


def retrieval_metrics(ranks: Any) -> dict[str, float]:
    """Recall@{1,5,10,50} (percent), median and mean rank, and RSum.

    ranks: (N,) 1-based ranks.  RSum = R@1 + R@5 + R@10 as in the paper's
    tables.  ``n`` is the number of ranked items.
    """
    r = as_1d(ranks, "ranks")
    if np.any(r < 1):
        raise ConfigError("ranks must be 1-based (all >= 1)")
    out: dict[str, float] = {}
    for k in RECALL_KS:
        out[f"R@{k}"] = 100.0 * float(np.mean(r <= k))
    out["MdR"] = float(np.median(r))
    out["MnR"] = float(np.mean(r))
    out["RSum"] = out["R@1"] + out["R@5"] + out["R@10"]
    out["n"] = int(r.shape[0])
    return out


def t2v_metrics(cost: Any, gt: Any) -> dict[str, float]:
    """Text-to-video metrics of a (Q, V) cost matrix."""
    return retrieval_metrics(t2v_ranks(cost, gt))


def v2t_metrics(cost: Any, gt: Any, convention: str = "videos") -> dict[str, float]:
    """Video-to-text metrics of a (Q, V) cost matrix (captionless videos skipped; see :func:`v2t_ranks`)."""
    return retrieval_metrics(v2t_ranks(cost, gt, convention))


def _check_postprocess_temperature(postprocess_temperature: float) -> float:
    t = float(postprocess_temperature)
    if not math.isfinite(t) or t <= 0:
        raise ConfigError(
            f"the post-processing temperature must be a positive finite number, got {postprocess_temperature!r}"
        )
    return t


def _check_axis(axis: int) -> int:
    if axis not in (0, 1):
        raise ConfigError(f"axis must be 0 or 1, got {axis!r}")
    return axis


class _LazyScaled:
    """View of ``-cost / T`` that materialises only the block being sliced."""

    def __init__(self, cost: np.ndarray, postprocess_temperature: float) -> None:
        self._cost = cost
        self._t = postprocess_temperature
        self.shape = cost.shape

    def __getitem__(self, key: Any) -> np.ndarray:
        return -self._cost[key].astype(np.float64) / self._t


def _log_normaliser(neg_scaled: _LazyScaled, axis: int) -> np.ndarray:
    """logsumexp of a (Q, V) matrix along ``axis``, computed in blocks of the other axis."""
    other = 1 - axis
    n_other = neg_scaled.shape[other]
    out = np.empty(n_other, dtype=np.float64)
    for sl in row_blocks(n_other, neg_scaled.shape[axis]):
        block = neg_scaled[:, sl] if axis == 0 else neg_scaled[sl, :]
        peak = np.max(block, axis=axis, keepdims=True)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        lse = np.log(np.sum(np.exp(block - peak), axis=axis, keepdims=True)) + peak
        out[sl] = lse.reshape(-1)
    return out


def _apply_log_prior(
    c: np.ndarray, normaliser: np.ndarray, postprocess_temperature: float, weight: float, axis: int
) -> np.ndarray:
    """cost' = weight * cost + T * logsumexp, broadcast along ``axis``; blockwise, input dtype."""
    out_dtype = c.dtype if c.dtype in (np.float32, np.float64) else np.float64
    out = np.empty(c.shape, dtype=out_dtype)
    norm = postprocess_temperature * normaliser
    if axis == 0:
        for sl in row_blocks(c.shape[0], c.shape[1]):
            out[sl] = weight * c[sl].astype(np.float64) + norm[None, :]
    else:
        for sl in row_blocks(c.shape[0], c.shape[1]):
            out[sl] = weight * c[sl].astype(np.float64) + norm[sl, None]
    return out


def dual_softmax(cost: Any, postprocess_temperature: float = 1.0, axis: int = 0) -> np.ndarray:
    """Dual-softmax (DSL) re-scoring; returns a cost of the same shape.

    With similarities ``s = -cost`` and ``axis=0`` (for text-to-video ranking)
    each video's column is turned into a prior over queries,
    ``p(q | v) = softmax_q(s / T)`` (``T``: ``postprocess_temperature``), and
    every pair is re-scored by ``p(v | q) * p(q | v)``.  A "hub" video that is close to many queries
    spreads its prior thin and drops in every row that is not its own.

    CAMoE multiplies the raw similarity by the prior, which only works for
    positive similarities; ours are negative KL costs, so the product of the
    two softmaxes is used in log space.  Within a row this ranks exactly like
    ``s / T + log p(q | v)``, and the returned cost is
    ``2 * cost + T * logsumexp_q(-cost / T)`` (shift-invariant in ``cost``).

    ``axis=1`` normalises over videos instead, for video-to-text ranking.
    Memory: one output matrix plus blocks of a few MB.
    """
    c = as_cost(cost)
    t = _check_postprocess_temperature(postprocess_temperature)
    ax = _check_axis(axis)
    normaliser = _log_normaliser(_LazyScaled(c, t), ax)
    return _apply_log_prior(c, normaliser, t, 2.0, ax)


def inverted_softmax(
    cost: Any, postprocess_temperature: float = 1.0, bank_cost: Any | None = None, axis: int = 0
) -> np.ndarray:
    """Querybank-normalised inverted softmax (QB-Norm style); returns a cost.

    Each gallery item (a video for ``axis=0``) is normalised by how strongly it
    attracts a bank of queries: ``s'(q, v) = s(q, v) / T - logsumexp_b(s(b, v) / T)``
    (``T``: ``postprocess_temperature``).
    ``bank_cost`` is the (B, V) cost of bank queries (e.g. training captions)
    against the same videos; without it the evaluated queries themselves are
    the bank, which is transductive and must be labelled as such (see
    :func:`evaluate_all`).  For ``axis=1`` the bank is (Q, B) bank videos.
    Returned cost: ``cost + T * logsumexp_b(-bank_cost / T)``.
    """
    c = as_cost(cost)
    t = _check_postprocess_temperature(postprocess_temperature)
    ax = _check_axis(axis)
    bank = c if bank_cost is None else as_cost(bank_cost, "bank_cost")
    if bank.shape[1 - ax] != c.shape[1 - ax]:
        raise ConfigError(f"bank_cost shape {bank.shape} does not match cost shape {c.shape} along axis {1 - ax}")
    normaliser = _log_normaliser(_LazyScaled(bank, t), ax)
    return _apply_log_prior(c, normaliser, t, 1.0, ax)


def _postprocess(
    cost: np.ndarray, name: str, postprocess_temperature: float, bank_cost: Any | None, axis: int
) -> np.ndarray:
    if name == "none":
        return cost
    if name == "dsl":
        return dual_softmax(cost, postprocess_temperature, axis=axis)
    if name == "is":
        return inverted_softmax(cost, postprocess_temperature, bank_cost=bank_cost, axis=axis)
    raise ConfigError(f"unknown post-processing {name!r}; valid: {', '.join(POSTPROCESS_NAMES)}")


def evaluate_all(
    cost: Any,
    gt: Any,
    *,
    postprocess: str = "none",
    postprocess_temperature: float = 1.0,
    bank_cost: Any | None = None,
    v2t_convention: str = "videos",
) -> dict[str, Any]:
    """Text-to-video and video-to-text metrics, with the post-processing and v2t convention named.

    ``v2t_convention`` (:func:`v2t_ranks`): ``"videos"`` (X-Pool's and CLIP4Clip's) or
    ``"captions"``; returned as ``"v2t_convention"``.

    ``postprocess``: ``"none"`` (default, what the paper reports), ``"dsl"``
    (:func:`dual_softmax`, normalised over the other axis for each direction)
    or ``"is"`` (:func:`inverted_softmax`; ``bank_cost`` (B, V) applies to
    text-to-video only, video-to-text then uses the evaluated videos as bank).
    ``postprocess_temperature``: the softmax temperature of ``"dsl"`` and ``"is"``, recorded in the label as
    ``"temperature"`` (the key metrics.json has always had).
    Returns ``{"t2v": {...}, "v2t": {...}, "postprocess": {...}}``.
    """
    c = as_cost(cost)
    g = as_gt(gt, *c.shape)
    if postprocess not in POSTPROCESS_NAMES:
        raise ConfigError(f"unknown post-processing {postprocess!r}; valid: {', '.join(POSTPROCESS_NAMES)}")
    label: dict[str, Any] = {"name": postprocess}
    if postprocess != "none":
        label["temperature"] = float(_check_postprocess_temperature(postprocess_temperature))
    if postprocess == "is":
        label["bank"] = "queries (transductive)" if bank_cost is None else "external"
    t2v_cost = _postprocess(c, postprocess, postprocess_temperature, bank_cost, axis=0)
    v2t_cost = _postprocess(c, postprocess, postprocess_temperature, None, axis=1)
    return {
        "t2v": t2v_metrics(t2v_cost, g),
        "v2t": v2t_metrics(v2t_cost, g, v2t_convention),
        "v2t_convention": v2t_convention,
        "postprocess": label,
    }
