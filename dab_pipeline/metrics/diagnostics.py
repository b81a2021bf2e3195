"""Uncertainty diagnostics: variance asymmetry (Table 6), the local semantic neighbourhood (Table 7), and how
much of the bridge's shift depends on the pair (:func:`shift_decomposition`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.errors import ConfigError
from .retrieval import as_cost, as_gt, row_blocks


def variance_asymmetry(text_var: Any, bridged_var: Any | None, video_var: Any) -> dict[str, Any]:
    """Mean sigma^2 of text, bridged and video distributions and their ratios to text.

    Inputs are arrays of variances of any shape (e.g. the per-query mean
    sigma^2 of the ground-truth pair, (Q,)); ``bridged_var`` may be None for
    variants without a bridge.  Returns ``{"mean": {...}, "ratio": {...}}``
    keyed ``text``, ``bridge``, ``video``.
    """
    means: dict[str, float] = {}
    for name, values in (("text", text_var), ("bridge", bridged_var), ("video", video_var)):
        if values is None:
            continue
        arr = np.asarray(values, dtype=np.float64)
        if arr.size == 0:
            raise ConfigError(f"{name} variances are empty")
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ConfigError(f"{name} variances must be finite and non-negative")
        means[name] = float(np.mean(arr))
    if means["text"] <= 0:
        raise ConfigError("mean text variance is 0; ratios to text are undefined")
    ratios = {name: value / means["text"] for name, value in means.items()}
    return {"mean": means, "ratio": ratios}


def _topk_mask(block: np.ndarray, k: int) -> np.ndarray:
    """(b, V) bool mask of each row's k lowest costs, ties at the cut broken by index."""
    kth = np.partition(block, k - 1, axis=1)[:, k - 1 : k]  # (b, 1)
    below = block < kth
    at_cut = block == kth
    room = k - np.count_nonzero(below, axis=1, keepdims=True)  # (b, 1)
    return below | (at_cut & (np.cumsum(at_cut, axis=1) <= room))


def semantic_neighbourhood(
    cost: Any,
    gt: Any,
    video_features: Any,
    cosine_thresholds: Sequence[float] = (0.6, 0.7, 0.8, 0.9),
    k: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """Semantic positives among each query's top-k videos, versus random ranking.

    A *semantic positive* of query ``q`` at a cosine threshold ``c`` (one of
    ``cosine_thresholds``; the paper's Table 7 calls it tau, but it is no
    temperature) is a video ``v != gt[q]`` whose feature has cosine ``>= c``
    with the ground-truth video's feature.  The ground truth itself is never counted (its cosine is
    1; counting it would add R@k / 100 to every row and mix recall into a
    neighbourhood measure), but it does occupy its slot in the top-k list.
    Top-k is by lowest cost, ties broken by video index.

    Random baseline: under a uniformly random ranking each video is in the
    top-k with probability ``k / V``, so the expected count is exactly
    ``k / V * #positives(q)``, averaged over queries.  ``random_sampled`` draws
    one seeded random top-k per query as a check on that formula.

    cost (Q, V), gt (Q,), video_features (V, D) (frame-mean CLIP features).
    Returns ``{"k": k, "counts_gt": False, "rows": [{"cosine", "model",
    "random", "random_sampled", "ratio"}, ...]}``, a row per threshold (metrics.json
    wrote ``"topk"`` and ``"tau"`` before issue 62; report.md still reads them).
    """
    c = as_cost(cost)
    q_count, v_count = c.shape
    g = as_gt(gt, q_count, v_count)
    unit = _unit_features(video_features, c.shape)  # (V, D)
    k = int(k)
    if not 1 <= k <= v_count:
        raise ConfigError(f"k must be in [1, {v_count}], got {k}")
    thresholds = np.asarray([float(t) for t in cosine_thresholds], dtype=np.float64)  # (T,)
    if thresholds.size == 0:
        raise ConfigError("cosine_thresholds is empty")
    model_sum, random_sum, sampled_sum = _neighbourhood_counts(c, g, unit, thresholds, k, seed)

    rows_out = []
    for i, threshold in enumerate(thresholds):
        model = model_sum[i] / q_count
        rand = random_sum[i] / q_count
        rows_out.append(
            {
                "cosine": float(threshold),  # the threshold ("tau" in metrics.json before issue 62)
                "model": float(model),
                "random": float(rand),
                "random_sampled": float(sampled_sum[i] / q_count),
                "ratio": float(model / rand) if rand > 0 else None,
            }
        )
    return {"k": k, "counts_gt": False, "seed": int(seed), "rows": rows_out}


def _unit_features(video_features: Any, cost_shape: tuple[int, int]) -> np.ndarray:
    """(V, D) features, checked against the cost matrix, scaled to unit length."""
    feats = np.asarray(video_features, dtype=np.float64)
    if feats.ndim != 2 or feats.shape[0] != cost_shape[1]:
        raise ConfigError(
            f"video_features must have shape ({cost_shape[1]}, D) to match cost {cost_shape}, got {feats.shape}"
        )
    if not np.all(np.isfinite(feats)):
        raise ConfigError("video_features contain non-finite values")
    return feats / np.maximum(np.linalg.norm(feats, axis=1, keepdims=True), 1e-12)


def _neighbourhood_counts(
    c: np.ndarray, g: np.ndarray, unit: np.ndarray, thresholds: np.ndarray, k: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Semantic positives (cosine >= a threshold to the gt video, gt excluded) in the model's top-k, their exact
    random-ranking expectation and one seeded random top-k, summed over queries: (T,) each."""
    q_count, v_count = c.shape
    rng = np.random.default_rng(seed)
    model_sum, random_sum, sampled_sum = (np.zeros(thresholds.size) for _ in range(3))
    # Blocks are sized by the (b, V) cosine matrix, the largest temporary.
    for rows in row_blocks(q_count, v_count):
        block = c[rows]  # (b, V)
        b = block.shape[0]
        gt_b = g[rows]  # (b,)
        cos = unit[gt_b] @ unit.T  # (b, V) cosine of every video to the gt video
        not_gt = np.ones((b, v_count), dtype=bool)
        not_gt[np.arange(b), gt_b] = False
        chosen = _topk_mask(block, k)  # (b, V), exactly k True per row
        # A random ranking's top-k is a uniform k-subset: the k smallest of iid uniforms.
        noise = rng.random((b, v_count))
        sampled = noise <= np.partition(noise, k - 1, axis=1)[:, k - 1 : k]  # (b, V)
        for i, threshold in enumerate(thresholds):
            positive = (cos >= threshold) & not_gt  # (b, V)
            model_sum[i] += np.count_nonzero(positive & chosen)
            random_sum[i] += np.count_nonzero(positive) * k / v_count
            sampled_sum[i] += np.count_nonzero(positive & sampled)
    return model_sum, random_sum, sampled_sum


def shift_decomposition(shift: Any) -> dict[str, float]:
    """How much of a bridge's shift depends on the pair: shares of its sum of squares, on a full grid.

    ``shift`` (T, V, D): the bridged text minus the text, for every pair of T texts and V
    videos. Over the grid it splits as ``s_tv = m + a_t + b_v + e_tv`` (two-way analysis of
    variance, per feature): ``m`` the mean shift over every pair, ``a_t`` what depends on
    the text alone, ``b_v`` on the video alone, ``e_tv`` on the pair. The four parts are
    orthogonal, so their sums of squares add up to ``sum ||s_tv||^2``; the returned shares
    do too (``constant + text + video + interaction = 1``), and
    ``pair_dependent = 1 - constant``: the share of the squared shift that its mean over
    pairs does not explain. A bridge that moves every pair alike (a temperature) has
    ``pair_dependent = 0``; one that acts like a cross-encoder has a large ``interaction``.
    A shift that is zero everywhere gives NaN shares.
    """
    s = np.asarray(shift, dtype=np.float64)
    if s.ndim != 3 or min(s.shape) == 0:
        raise ConfigError(f"shift must be a non-empty (texts, videos, D) grid, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ConfigError("shift contains non-finite values")
    n_t, n_v, _ = s.shape
    m = s.mean(axis=(0, 1))  # (D,)
    a = s.mean(axis=1) - m  # (T, D)
    b = s.mean(axis=0) - m  # (V, D)
    e = s - m - a[:, None, :] - b[None, :, :]  # (T, V, D)
    parts = {
        "constant": n_t * n_v * float(m @ m),
        "text": n_v * float((a * a).sum()),
        "video": n_t * float((b * b).sum()),
        "interaction": float((e * e).sum()),
    }
    total = float((s * s).sum())
    out = {k: (v / total if total > 0 else float("nan")) for k, v in parts.items()}
    out["pair_dependent"] = 1.0 - out["constant"] if total > 0 else float("nan")
    return out


def lowrank_variance_share(logvar: Any, factor: Any) -> float:
    """The share of the text's total variance in the low-rank part of Sigma = diag(sigma^2) + U U^T, mean over texts.

    logvar (Q, D) log sigma^2, factor (Q, D, R) U -> mean over texts of trace(U U^T) / (trace(diag) + trace(U U^T)),
    with trace(U U^T) = ||U||_F^2 (no D x D matrix is formed).
    """
    lv = np.asarray(logvar, np.float64)
    u = np.asarray(factor, np.float64)
    if lv.ndim != 2 or u.ndim != 3 or u.shape[:2] != lv.shape or lv.shape[0] == 0:
        raise ConfigError(f"expected logvar (Q, D) and factor (Q, D, R) with Q > 0, got {lv.shape} and {u.shape}")
    low = (u * u).sum(axis=(1, 2))  # (Q,)
    return float(np.mean(low / (np.exp(lv).sum(axis=1) + low)))


def text_logdet(logvar: Any, factor: Any | None = None) -> np.ndarray:
    """log det Sigma_t per text: logvar (Q, D), factor (Q, D, R) or None -> (Q,).

    Diagonal (``factor`` None): ``sum_d logvar``.  Low rank, ``Sigma = S + U U^T`` with ``S = diag(e^logvar)``:
    the determinant lemma, ``sum_d logvar + log det(I + U^T S^-1 U)`` (an R x R determinant; no D x D matrix).
    """
    lv = np.asarray(logvar, np.float64)
    if lv.ndim != 2 or lv.shape[0] == 0 or not np.all(np.isfinite(lv)):
        raise ConfigError(f"expected finite logvar (Q, D) with Q > 0, got shape {lv.shape}")
    out = lv.sum(axis=1)  # (Q,)
    if factor is None:
        return out
    u = np.asarray(factor, np.float64)
    if u.ndim != 3 or u.shape[:2] != lv.shape or not np.all(np.isfinite(u)):
        raise ConfigError(f"expected a finite factor (Q, D, R) for logvar {lv.shape}, got shape {u.shape}")
    su = u * np.exp(-lv)[..., None]  # (Q, D, R)  S^-1 U
    core = np.eye(u.shape[2]) + np.einsum("qdr,qds->qrs", u, su)  # (Q, R, R)  I + U^T S^-1 U, eigenvalues >= 1
    sign, core_logdet = np.linalg.slogdet(core)  # (Q,) each
    assert np.all(sign > 0), "I + U^T S^-1 U is positive definite"
    return out + core_logdet


def mixture_weights(weight_logits: Any) -> dict[str, Any]:
    """How a mixture text's weight is shared among its K components: logits (Q, K) -> summary.

    ``weights``: each component's mean weight ``softmax(logits)_k`` over the texts, sorted descending (a component
    no text uses has ~0); ``ranked_weights``: the mean over texts of each text's weights sorted descending (the first
    entry: the mean weight of a text's heaviest component, 1/K when every text spreads evenly, 1 when each text
    uses one); ``entropy``: the mean over texts of the weights' entropy divided by log K, in [0, 1] (1: uniform).
    """
    z = np.asarray(weight_logits, np.float64)
    if z.ndim != 2 or z.shape[0] == 0 or z.shape[1] < 2 or not np.all(np.isfinite(z)):
        raise ConfigError(f"expected finite weight logits (Q, K) with Q > 0 and K >= 2, got shape {z.shape}")
    log_w = z - z.max(axis=1, keepdims=True)
    log_w -= np.log(np.exp(log_w).sum(axis=1, keepdims=True))  # (Q, K) log softmax
    w = np.exp(log_w)  # (Q, K)
    entropy = -(w * log_w).sum(axis=1) / np.log(z.shape[1])  # (Q,)
    return {
        "components": int(z.shape[1]),
        "weights": np.sort(w.mean(axis=0))[::-1].tolist(),
        "ranked_weights": np.sort(w, axis=1)[:, ::-1].mean(axis=0).tolist(),
        "entropy": float(entropy.mean()),
    }


def topk_videos(cost: Any, k: int) -> np.ndarray:
    """(Q, k) indices of each row's k lowest costs, in order, ties broken by the lower video index."""
    c = as_cost(cost)
    if not 1 <= k <= c.shape[1]:
        raise ConfigError(f"k must be in [1, {c.shape[1]}], got {k}")
    out = np.empty((c.shape[0], k), np.int64)
    for rows in row_blocks(*c.shape):
        out[rows] = np.argsort(c[rows], axis=1, kind="stable")[:, :k]  # (b, k)
    return out


def mixture_topk_components(component: Any, cost: Any, k: int = 10) -> dict[str, Any]:
    """How often a query's top-k videos are matched best by different text components (a mixture run).

    component (Q, V) int: the text component that matches each pair best (``PairTerms.component``); only each
    row's top-k entries are read, so a caller may fill the rest with -1.  cost (Q, V): the top-k are the k lowest
    costs, ties broken by the lower index (:func:`topk_videos`).  Returns ``{"k": k, "mixed_share": the share of
    queries whose top k hold more than one best component, "distinct_mean": the mean number of distinct best
    components in a query's top k}`` (1 and 0 when one component matches every retrieved video).
    """
    comp = np.asarray(component)
    c = as_cost(cost)
    if comp.shape != c.shape or not np.issubdtype(comp.dtype, np.integer):
        raise ConfigError(f"component must be an integer array of the cost's shape {c.shape}, got {comp.shape}")
    top = topk_videos(c, k)  # (Q, k)
    chosen = np.sort(np.take_along_axis(comp, top, axis=1), axis=1)  # (Q, k)
    if (chosen < 0).any():
        raise ConfigError("component has no entry (< 0) at some query's top-k videos")
    distinct = 1 + np.count_nonzero(np.diff(chosen, axis=1), axis=1)  # (Q,)
    return {"k": int(k), "mixed_share": float(np.mean(distinct > 1)), "distinct_mean": float(distinct.mean())}


def subspace_share(spread: Any, factor: Any, center: bool = True) -> dict[str, Any]:
    """The share of the squared spread of vectors that lies in span(U): ``||P_U X||_F^2 / ||X||_F^2``.

    spread (n, D) the vectors X (their mean is subtracted first with ``center``), factor (D, R) U.  ``P_U`` is the
    orthogonal projector on span(U), from an orthonormal basis of it (the left singular vectors of U above a relative
    tolerance, so a rank-deficient U counts its true rank r).  ``chance`` = r / D: the share of an isotropic spread
    (no preferred direction) in any r-dimensional subspace.  A spread of zero (one vector, centred) gives NaN.
    Returns ``{"share", "chance", "rank"}``.
    """
    x = np.asarray(spread, np.float64)
    u = np.asarray(factor, np.float64)
    if x.ndim != 2 or u.ndim != 2 or x.shape[1] != u.shape[0] or x.shape[0] == 0 or u.shape[1] == 0:
        raise ConfigError(f"expected spread (n, D) and factor (D, R) with n, R > 0, got {x.shape} and {u.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(u))):
        raise ConfigError("spread and factor must be finite")
    if center:
        x = x - x.mean(axis=0, keepdims=True)
    left, sv, _ = np.linalg.svd(u, full_matrices=False)  # (D, R), (R,)
    rank = int(np.count_nonzero(sv > sv.max(initial=0.0) * max(u.shape) * np.finfo(np.float64).eps))
    total = float((x * x).sum())
    inside = float(((x @ left[:, :rank]) ** 2).sum())  # ||P_U X^T||_F^2 = ||X B||_F^2, B the (D, r) basis
    share = inside / total if total > 0 else float("nan")
    return {"share": share, "chance": rank / u.shape[0], "rank": rank}
