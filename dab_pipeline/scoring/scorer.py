"""Scorer: one model's fast scoring, its engines built once and kept, its grids planned and tuned inside."""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.events import ProgressCallback, null_progress
from ..model import DABModel
from ..runtime.devices import resolve_device
from .covariance import needs_reference, score_nondiag, score_shortlist_nondiag
from .engines import Engine, build_engine
from .first_stage import ExactVectors, first_stage, frame_mean_vectors, text_vectors
from .one_query import as_float, frames_and_mask, one_query_inputs, score_pairs, score_rows
from .passes import diagnostics, score_candidates, score_grid, topk_smallest
from .placement import ModelPlacement
from .planning import Plan, even_cuts, plan_grid, tune_blocks
from .reference import score_query
from .result import SCORE_DTYPES, ScoreResult, as_tensor, prepare_inputs

__all__ = ["Scorer", "MAX_ENGINES"]

# Engines kept at once (one per batch hint, the grid size the bf16 products are packed for): a server asks
# one or two shapes; a script scoring many shapes should not keep a merged copy of the weights for each.
MAX_ENGINES = 4
# Videos a block of Scorer.score_query scores at once (~100 KB of work each at D = 512, F = 12)
ONE_QUERY_CHUNK = 1024


class Scorer:
    """Scores texts against videos with ``model``'s fast engine (the same function as the reference).

    Engines are built once per batch hint for this scorer's device and dtype (building one costs ~20-30 ms
    at D = 512, more than scoring a 100-video shortlist) and freed with the object (or :meth:`close`).
    They hold merged copies of the weights: when a weight changes in place (an optimiser step,
    ``load_state_dict``) or moves, the next call rebuilds them. Not thread-safe: a server serialises calls.

    * ``dtype``: "float32" (matches the reference to ~1e-6) or "bfloat16" (the bridge's matrix products in
      bf16 with float32 accumulation; states and cost in float32).
    * ``memory_budget``: bytes of per-pair work a sub-block may take (default
      :func:`~dab_pipeline.scoring.default_memory_budget` of ``device``); without one, large CPU grids use a
      sub-block size measured once per machine and shape (``scoring/tiles.py``).
    * ``text_chunk`` / ``video_chunk``: outer tiles (one progress step each); None derives them from the budget.

    The model is moved to ``device`` ("auto": CUDA when available) and run in eval mode during a call; its
    training flag is restored.
    """

    def __init__(
        self,
        model: DABModel,
        *,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        memory_budget: Optional[int] = None,
        text_chunk: Optional[int] = None,
        video_chunk: Optional[int] = None,
    ) -> None:
        if dtype not in SCORE_DTYPES:
            raise ConfigError(f"dtype={dtype!r} is invalid; valid: {' | '.join(SCORE_DTYPES)}")
        if memory_budget is not None and memory_budget < 1:
            raise ConfigError(f"memory_budget must be a positive number of bytes, got {memory_budget}")
        self.model, self.device, self.dtype = model, resolve_device(device), dtype
        self.memory_budget, self.text_chunk, self.video_chunk = memory_budget, text_chunk, video_chunk
        self.mm_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        self._engines: OrderedDict[int, Engine] = OrderedDict()  # batch hint -> engine, least recent first
        self._plans: dict[tuple[int, int, int, bool], Plan] = {}
        self._weights: Optional[object] = None  # the weights the engines were built from (_weights_key)
        self._placement = ModelPlacement(model, self.device)  # eval mode on the device; the weights' key

    def close(self) -> None:
        """Drop the engines (a later call builds them again)."""
        self._engines.clear()
        self._weights = None

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def score(
        self,
        text: np.ndarray | Tensor,
        frames: np.ndarray | Tensor,
        mask: np.ndarray | Tensor,
        *,
        gt: np.ndarray | Tensor | None = None,
        k: Optional[int] = None,
        progress: ProgressCallback | None = None,
        shortlist: Optional[int] = None,
    ) -> ScoreResult:
        """Every text against every video -> ScoreResult with cost (Q, V) float32, lower is better.

        text (Q, D), frames (V, F, D), mask (V, F) bool; ``gt`` (Q,): each query's ground-truth video (the
        per-query variance diagnostics, Table 6); ``k``: also each query's k best videos (indices and
        costs, best first); ``shortlist=K``: score only each query's K first-stage candidates
        (:mod:`~dab_pipeline.scoring.first_stage`, the cosine of the text and the frame mean), +inf
        elsewhere; None (the default) scores every pair. Emits "start" / "advance" / "end" events for task
        "score".
        """
        if k is not None and k < 1:
            raise ConfigError(f"k must be a positive integer, got {k}")
        progress = progress or null_progress  # a shortlist is checked by first_stage, which it goes to
        text_t, frames_t, mask_t, gt_t = prepare_inputs(
            self.model, text, frames, mask, gt, self.text_chunk, self.video_chunk
        )
        n_q, n_v, n_f = text_t.shape[0], frames_t.shape[0], frames_t.shape[1]
        was_training = self._place()
        try:
            if needs_reference(self.model):
                result = self._score_nondiag(text_t, frames_t, mask_t, gt_t, shortlist, progress)
                if k is not None:
                    result.topk_indices, result.topk_costs = topk_smallest(result.cost, k)
                return result
            plan = self._plan(n_q, n_v, n_f, exact=shortlist is None)
            info = plan.info()
            with torch.no_grad():
                eng = self._engine(min(plan.p_max, max(1, n_q * n_v)))
                info.update(_products(eng, self.device, self.dtype))
                ts = eng.texts(text_t.to(self.device))
                cost = self._costs(eng, ts, text_t, frames_t, mask_t, plan, shortlist, progress, info)
                result = ScoreResult(cost=cost, shortlist=info.get("shortlist"), info=info)
                if gt_t is not None and self.model.cfg.gaussian:
                    diagnostics(eng, ts, frames_t, mask_t, gt_t, self.device, plan, result)
            if k is not None:
                result.topk_indices, result.topk_costs = topk_smallest(cost, k)
            return result
        finally:
            self._restore(was_training)

    def score_query(
        self,
        text: np.ndarray | Tensor,
        frames: np.ndarray | Tensor,
        mask: np.ndarray | Tensor,
        terms: np.ndarray | Tensor | None = None,
    ) -> np.ndarray:
        """One query's costs over a few videos (its shortlist) -> (K,) float32.

        text (D,) or (1, D), frames (K, F, D), mask (K, F); ``terms`` (K, D): the videos' token-branch terms from
        :meth:`video_terms` (an index keeps them: ``dab index --video-terms``), or None to compute them. The engine's one-text path (``Engine.one_query``: no
        per-video bases, which one query cannot amortise; the keys' and values' projections moved onto the query
        and the pooled frames), in up to ``ONE_QUERY_CHUNK`` videos a block; the model's own path
        (:func:`~dab_pipeline.scoring.reference.score_query`) for a variant without one (xpool, the point
        bridge) or a model the engines do not cover (``dab`` low-rank or mixture). In bf16 every product before
        the bridge runs in bf16 too (the model's path under autocast did the same).
        """
        t, fr, mk = one_query_inputs(self.model, text, frames, mask)  # (1, D), (K, F, D), (K, F)
        out = self.score_queries(t, fr, mk, [np.arange(len(fr))], terms)
        if out is None:  # no one-text path for this model: its own
            was_training = self._place()
            try:
                return score_query(self.model, text, frames, mask, dtype=self.dtype)
            finally:
                self._restore(was_training)
        return out[0]

    def score_queries(
        self,
        text: np.ndarray | Tensor,
        frames: np.ndarray | Tensor,
        mask: np.ndarray | Tensor,
        shortlists: Sequence[np.ndarray],
        terms: np.ndarray | Tensor | None = None,
    ) -> Optional[list[np.ndarray]]:
        """Query i's costs over its own videos ``shortlists[i]`` (indices into ``frames``) -> [(K_i,) float32], each
        query through the engine's one-text path as :meth:`score_query` runs it alone (the same numbers, within the
        engine's tolerance); None where the model has no such path (the caller scores the pairs its own way).

        text (M, D), frames (U, F, D), mask (U, F): a batch of queries and the union of their shortlists (``dab
        serve``'s gathered queries on an index); the texts' state is computed once for the batch, and the batch's
        (query, video) pairs, each query's own shortlist only, go through the engine together, up to
        ``ONE_QUERY_CHUNK`` pairs a call (the bridge's weights then serve every query's rows at once); a mixture's
        queries one at a time. ``terms`` (U, D): the videos' token-branch terms (:meth:`video_terms`), or None.
        """
        t = as_float(text).reshape(len(shortlists), -1)  # (M, D)
        fr, mk = one_query_inputs(self.model, t[:1], frames, mask, cast=False)[1:]  # (U, F, D) as given, (U, F)
        vt = None if terms is None else as_tensor(terms)
        if vt is not None and tuple(vt.shape) != (fr.shape[0], fr.shape[2]):
            raise ValueError(
                f"terms {tuple(vt.shape)} must be one row of D values a video: {(fr.shape[0], fr.shape[2])}"
            )
        if needs_reference(self.model):
            return None
        was_training = self._place()
        try:
            lists = [np.asarray(r, np.int64).reshape(-1) for r in shortlists]
            pairs = sum(len(r) for r in lists)
            with torch.no_grad():  # engines kept per power of two of the block's videos (oneDNN packs for a size)
                eng = self._engine(1 << (max(min(pairs, ONE_QUERY_CHUNK), 1) - 1).bit_length())
                if not eng.has_one_query():
                    return None
                ts_all = eng.texts(t.to(self.device))
                dev, chunk = self.device, ONE_QUERY_CHUNK
                if len(lists) > 1 and eng.one_pairs(ts_all):
                    return score_pairs(eng, ts_all, fr, mk, lists, vt, dev, chunk)
                out = []
                for i, rows in enumerate(lists):  # a query a call, its one text for every video
                    ts = ts_all.take(slice(i, i + 1))
                    out.append(score_rows(eng, lambda a, b, ts=ts: ts, fr, mk, rows, vt, dev, chunk))
                return out
        finally:
            self._restore(was_training)

    def candidates(
        self,
        text: np.ndarray | Tensor,
        frames: np.ndarray | Tensor,
        mask: np.ndarray | Tensor,
        shortlist: Optional[int] = None,
    ) -> np.ndarray:
        """The first stage that ``score(shortlist=K)`` scores: each query's K videos, best first -> (Q, K')."""
        text_t, frames_t, mask_t, _ = prepare_inputs(self.model, text, frames, mask, None, None, None)
        plan = self._plan(text_t.shape[0], frames_t.shape[0], frames_t.shape[1], exact=False)
        return self._first_stage(text_t, frames_t, mask_t, shortlist, plan)

    def prepare(self, n_q: int, n_v: int, num_frames: int, exact: bool = True) -> dict:
        """Plan (and on CPU measure the sub-block size of) an n_q x n_v grid now, so that a timed
        :meth:`score` of that shape does not; -> the plan's info."""
        was_training = self._place()
        try:
            return self._plan(n_q, n_v, num_frames, exact).info()
        finally:
            self._restore(was_training)

    # ------------------------------------------------------------------ inside

    def video_terms(
        self, frames: np.ndarray | Tensor, mask: np.ndarray | Tensor, chunk: int = 1024
    ) -> Optional[np.ndarray]:
        """The videos' token-branch terms W1 h_bar + b1 (V, D) float32, ``chunk`` videos at a time: the part of a
        pair's cost that depends on the video alone, which :meth:`score_query` takes as ``terms`` instead of
        computing it (an index keeps them: ``dab index --video-terms``). None where the one-text path does not
        take them (:meth:`takes_video_terms`)."""
        fr, mk = frames_and_mask(self.model, frames, mask, cast=False)  # (V, F, D) as given, (V, F)
        if needs_reference(self.model):
            return None
        was_training = self._place()
        try:
            with torch.no_grad():
                eng = self._terms_engine()
                if eng is None:
                    return None
                out = np.empty((len(fr), fr.shape[2]), np.float32)
                for a, b in even_cuts(len(fr), chunk):
                    f_blk, m_blk = fr[a:b].to(self.device).float(), mk[a:b].to(self.device)
                    out[a:b] = eng.video_terms(f_blk, m_blk).cpu().numpy()
                return out
        finally:
            self._restore(was_training)

    def takes_video_terms(self) -> bool:
        """Whether :meth:`score_query` / :meth:`score_queries` use cached video terms for this model: its one-text
        path has a token branch. Where not (a model without one, or one the engines do not cover: ``dab`` low-rank
        or mixture, prob low-rank), :meth:`video_terms` returns None and given terms are not read."""
        if needs_reference(self.model):
            return False
        was_training = self._place()
        try:
            with torch.no_grad():
                return self._terms_engine() is not None
        finally:
            self._restore(was_training)

    def _terms_engine(self) -> Optional[Engine]:
        """The engine whose one-text path takes video terms (the one a block of ``ONE_QUERY_CHUNK`` uses), or None."""
        eng = self._engine(ONE_QUERY_CHUNK)
        return eng if eng.has_one_query() and hasattr(eng, "video_terms") else None

    def _place(self) -> bool:
        """The model in eval mode on this scorer's device for a call -> its training flag before (:meth:`_restore`)."""
        return self._placement.place()

    def _restore(self, was_training: bool) -> None:
        self._placement.restore(was_training)

    def _score_nondiag(
        self,
        text_t: Tensor,
        frames_t: Tensor,
        mask_t: Tensor,
        gt_t: Optional[Tensor],
        shortlist: Optional[int],
        progress: ProgressCallback,
    ) -> ScoreResult:
        """A non-diagonal covariance (lowrank:R): the model's own path in bounded blocks (scoring/covariance.py)."""
        if shortlist is None:
            return score_nondiag(self.model, text_t, frames_t, mask_t, gt_t, self.device, self.memory_budget, progress)
        plan = self._plan(text_t.shape[0], frames_t.shape[0], frames_t.shape[1], exact=False)
        cand = self._first_stage(text_t, frames_t, mask_t, shortlist, plan)  # (Q, K): the shortlist checked there
        shortlist = min(shortlist, frames_t.shape[0])
        cost = score_shortlist_nondiag(self.model, text_t, frames_t, mask_t, cand)
        return ScoreResult(cost=cost, shortlist=shortlist, info={"engine": f"reference ({self.model.cfg.covariance})"})

    def _plan(self, n_q: int, n_v: int, n_f: int, exact: bool) -> Plan:
        """The tiles of a grid, kept per shape; an exact grid's sub-block size is measured where that pays."""
        key = (n_q, n_v, n_f, exact)
        if key not in self._plans:
            if len(self._plans) >= 64:  # a server sees few shapes; a script that sees many keeps none for long
                self._plans.clear()
            cfg, dev = self.model.cfg, self.device
            exact = exact and not needs_reference(self.model)  # no engine to measure for a non-diagonal model
            best = tune_blocks(self.model, n_q, n_v, n_f, dev, self.dtype, self.memory_budget) if exact else None
            self._plans[key] = plan_grid(
                cfg,
                n_q,
                n_v,
                n_f,
                dev,
                self.dtype,
                self.memory_budget,
                self.text_chunk,
                self.video_chunk,
                pairs_cap=best,
            )
        return self._plans[key]

    def _engine(self, hint: int) -> Engine:
        """The engine for sub-blocks of about ``hint`` pairs: kept, or built (and the oldest dropped)."""
        weights = self._placement.key  # taken by _place at the start of this call
        if weights != self._weights:  # stale merged copies: rebuild every engine from the current weights
            self._engines.clear()
            self._weights = weights
        eng = self._engines.get(hint)
        if eng is None:
            eng = self._engines[hint] = build_engine(self.model, self.device, self.mm_dtype, batch_hint=hint)
            while len(self._engines) > MAX_ENGINES:
                self._engines.popitem(last=False)
        self._engines.move_to_end(hint)
        return eng

    def _costs(
        self,
        eng: Engine,
        ts,
        text_t: Tensor,
        frames_t: Tensor,
        mask_t: Tensor,
        plan: Plan,
        shortlist: Optional[int],
        progress: ProgressCallback,
        info: dict,
    ) -> np.ndarray:
        """The (Q, V) cost matrix: every pair, or each query's shortlist (+inf elsewhere)."""
        n_q, n_v = text_t.shape[0], frames_t.shape[0]
        if shortlist is None:
            cost = np.empty((n_q, n_v), dtype=np.float32)
            score_grid(eng, ts, frames_t, mask_t, cost, self.device, plan, progress, info)
            return cost
        cost = np.full((n_q, n_v), np.inf, dtype=np.float32)
        cand = self._first_stage(text_t, frames_t, mask_t, shortlist, plan)  # (Q, K): the shortlist checked there
        info["shortlist"] = min(shortlist, n_v)
        score_candidates(eng, ts, frames_t, mask_t, cand, cost, self.device, plan, progress, info)
        return cost

    def _first_stage(
        self, text_t: Tensor, frames_t: Tensor, mask_t: Tensor, shortlist: Optional[int], plan: Plan
    ) -> np.ndarray:
        """Each query's candidates by the cosine of the text and the frame mean (the ``mean`` vectors)."""
        n_q, n_v = text_t.shape[0], frames_t.shape[0]
        if not (n_q and n_v):
            return np.empty((n_q, 0), np.int64)
        rows = max(1, plan.p_max // max(1, n_v) * 8)  # queries a (rows, V) similarity block holds
        videos = ExactVectors(frame_mean_vectors(frames_t, mask_t), self.device, rows_per_block=rows)
        return first_stage(text_vectors(text_t), videos, shortlist)


def _products(eng: Engine, dev: torch.device, dtype: str) -> dict:
    """What runs the products: the AMX bridge (its products with SiLU and the update in their epilogues), oneDNN
    with the fused (or eager) kernels, or ATen in the matmul dtype."""
    if eng.onednn is not None and eng.kernels is not None:
        kern = eng.kernels
        products = "amx" if eng.bridge_runner is not None and eng.bridge_runner.amx is not None else "onednn"
        return {"products": products, "kernels": kern.name if kern.fused else f"eager ({kern.reason})"}
    # ATen's products in mm_dtype (on a CPU without native bf16, bf16 ones are emulated: slow)
    return {"products": f"aten {dtype}" if dev.type == "cpu" else f"{dev.type} {dtype}"}
