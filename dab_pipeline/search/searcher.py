"""Free-text search of a feature store's videos with a trained run: :class:`Searcher`.

The query is encoded with the store's own CLIP (the model and weights named in
its manifest, so the query lands in the same feature space as the stored
captions), then scored against every video of one split with the run's best
checkpoint through a :class:`dab_pipeline.scoring.Scorer`, the same engine that
validation and ``dab train``'s test costs use, kept with its engines between queries.

Only runs trained on frozen CLIP features are supported: a run fine-tuned with
``trainable_blocks=K`` would need the query through its fine-tuned text head and
the frames through its vision head, and is refused with a :class:`ConfigError`.

Both paths select candidates with :func:`dab_pipeline.scoring.first_stage`: with an index (``dab index``,
a FAISS first stage, K = ``DEFAULT_SHORTLIST`` unless given) a query reads only its shortlist's K videos
from the store and re-ranks them; without one, ``shortlist=K`` runs it over the split in memory (and no K
scores every video). :class:`Searcher` keeps the run, the store, its CLIP and the index loaded between
queries. It is library code because two stages use it: ``dab search`` (one-shot) and ``dab serve`` (loaded
once, many queries).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from ..calibration import UncertaintyRequest
from ..clip_models import encode_queries_short, unknown_words, unknown_words_line
from ..core.choices import DEFAULT_SCORE_DTYPE
from ..core.errors import ConfigError, StoreError
from ..core.fsutil import sha256_file
from ..core.location import StoreURL, location
from ..index import VECTOR_KINDS, VideoIndex, load_index, query_vectors
from ..runs.load import load_run
from ..runtime.capabilities import resolve_score_dtype
from ..runtime.devices import resolve_device
from ..scoring import DEFAULT_SHORTLIST, Scorer, first_stage, topk_smallest
from ..scoring.first_stage import check_shortlist
from ..store import open_store, split_rows, store_fingerprint
from .calibrated import CalibratedSearch
from .pairs import score_shortlists
from .query_encoder import load_query_clip
from .results import Ranked, SearchResult, check_queries, make_result, tick

__all__ = ["Searcher", "SearcherOptions", "open_searcher", "DEFAULT_SHORTLIST"]


class Searcher(CalibratedSearch):
    """What a search needs, loaded once: the run, the open store, the store's CLIP and, optionally, an index.

    With an ``index`` (``dab index``) a query reads only its shortlist's K videos from the store
    (``FeatureStore.read_videos``, sorted and coalesced) and re-ranks them with the run's full cost; without
    one, the split is loaded into memory once and every video is scored (or a cosine shortlist of it).
    ``search_batch`` answers queries that arrived together (a server's batch) in one call, each as alone.
    Not re-entrant: a server serialises calls (``lock``).
    """

    def __init__(
        self,
        run_dir: str | Path,
        store_path: str | Path,
        *,
        split: str = "test",
        index: "str | Path | VideoIndex | None" = None,
        device: str = "auto",
        dtype: str = DEFAULT_SCORE_DTYPE,
        warn: Callable[[str], None] = lambda message: None,
        encoder: bool = True,
    ) -> None:
        self.device = resolve_device(device)
        choice = resolve_score_dtype(dtype, self.device)
        self.warn = warn  # search() says here what a query's result also holds (its unknown words)
        if choice.warning:
            warn(choice.warning)
        self.dtype, self.split, self.store_path = choice.dtype, split, location(store_path)
        self.lock = threading.Lock()
        self.store = open_store(store_path)  # the store first: an incomplete one is refused before a model loads
        try:
            self.store.require_complete("dab search")
            self.rows = split_rows(self.store, split)  # (V,) store rows of the split's encoded videos
            if len(self.rows) == 0:
                raise StoreError(f"{store_path}: split {split!r} has no encoded videos to search")
            self.run = load_run(run_dir, self.device)
            d = self.run.model.cfg.embed_dim
            if self.store.dim != d:
                raise ConfigError(
                    f"{store_path} holds D={self.store.dim} features but the run's model has embed_dim={d}"
                )
            # the run's model never changes here: one Scorer keeps its engines between searches
            self._scorer = Scorer(self.run.model, device=self.device, dtype=self.dtype)
            self.index = None
            self._run_sha: Optional[str] = None  # the run's checkpoint sha256, where an index needs it
            self.terms = False  # the index's video terms are this run's: the re-rank reads them
            if index is not None:  # a folder, or an index already loaded (one served by its shards: dab serve --ray)
                self.index = index if isinstance(index, VideoIndex) else load_index(index)
                self._check_index(store_fingerprint(self.store, self.rows))
                self.terms = self._terms_usable(warn)
            self._load_calibration(warn)
            # encoder=False: ranks given text features only (benchmarks of stores without a CLIP)
            self.bundle = load_query_clip(self.store.manifest, self.device) if encoder else None
        except BaseException:
            self.store.close()
            raise
        self._feats = None  # the whole split, loaded on the first search without an index

    def first_stage_identity(self, shortlist: Optional[int], nprobe: Optional[int]) -> Optional[dict]:
        """What a search's first stage is (None without an index): the index (its folder and a digest of its
        index.json, which changes with any rebuild), the shortlist K and the nprobe in effect. A calibration made
        through an index records it; a search must match it for the calibration's guarantees to hold."""
        if self.index is None:
            return None
        meta = dict(self.index.meta.to_json())
        meta.pop("nprobe", None)  # the search's own, recorded apart
        digest = hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode("utf-8")).hexdigest()
        return {
            "path": str(self.index.path),
            "digest": digest,
            "shortlist": DEFAULT_SHORTLIST if shortlist is None else int(shortlist),
            "nprobe": int(self.index.meta.nprobe if nprobe is None else nprobe),
        }

    def first_stage_order(self, text: torch.Tensor | np.ndarray, shortlist: int, nprobe: Optional[int]) -> np.ndarray:
        """Each query's shortlist as positions in the split, in the first stage's order (M, K); -1 where the index
        gave fewer. The first K' of a shortlist of K are the shortlist of K' (the index ranks by one score)."""
        if self.index is None:
            raise ConfigError("a first stage's order needs an index")
        t = torch.as_tensor(np.asarray(text, np.float32)).to(self.device)
        cand = first_stage(
            query_vectors(self.index.meta.vector, t, self.run.model), self.index, shortlist, nprobe=nprobe
        )
        pos = np.searchsorted(self.rows, cand)  # (M, K)
        return np.where(cand >= 0, pos, -1)

    def _checkpoint_sha(self) -> str:
        if self._run_sha is None:
            self._run_sha = sha256_file(self.run.checkpoint)
        return self._run_sha

    def _check_index(self, fingerprint: str) -> None:
        assert self.index is not None
        meta = self.index.meta
        if meta.split != self.split:
            raise ConfigError(f"{self.index.path} indexes split {meta.split!r}, not {self.split!r}")
        self.index.check_store(fingerprint, self.store_path)
        if VECTOR_KINDS.get(meta.vector).needs_run and not self._index_of_this_run():
            raise ConfigError(
                f"{self.index.path} holds the {meta.vector!r} vectors of another run "
                f"({meta.run.get('path')}); rebuild it with `dab index --run {self.run.run_dir} ...`"
            )

    def _index_of_this_run(self) -> bool:
        """Whether the index records this run's checkpoint (its sha256, hashed once a Searcher)."""
        assert self.index is not None
        return self.index.meta.run.get("checkpoint_sha256") == self._checkpoint_sha()

    def _terms_usable(self, warn: Callable[[str], None]) -> bool:
        """Whether the index's video terms (``dab index --video-terms``) were made by this run; a warning where
        they were made by another (the re-rank then computes them)."""
        assert self.index is not None
        if not self.index.meta.terms:
            return False
        if not self._scorer.takes_video_terms():  # an index built before dab index refused such a run
            warn(
                f"{self.index.path} holds video terms, but this run's model is re-ranked by its own path, which "
                "computes them itself; searching without reading them"
            )
            return False
        if self._index_of_this_run():
            return True
        warn(
            f"{self.index.path} holds the video terms of another run ({self.index.meta.run.get('path')}); "
            f"searching without them (rebuild it with `dab index --run {self.run.run_dir} --video-terms ...`)"
        )
        return False

    def close(self) -> None:
        self._scorer.close()
        if self.index is not None:
            self.index.close()
        self.store.close()

    def __enter__(self) -> "Searcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def identity_files(self) -> list[Path]:
        """The files a search reads from disk while it runs (the store's, the index folder's): a server watches
        them (:class:`~dab_pipeline.core.filewatch.FileWatch`) so that it never answers from a changed one."""
        files = self.store.identity_files()
        if self.index is None:  # the split is read once into memory: a Zarr chunk damaged later is read never again
            files += self.store.chunk_files(("videos/frames", "videos/frame_mask"))
        if self.index is not None:
            files += self.index.identity_files()
        return files

    @property
    def num_videos(self) -> int:
        return len(self.rows)

    def encode(self, queries: Sequence[str]) -> torch.Tensor:
        """(M, D) float32 features of the queries, in the store's CLIP space."""
        if self.bundle is None:
            raise ConfigError("this Searcher was opened without its query encoder (encoder=False)")
        return encode_queries_short(self.bundle, list(queries))  # (M, D): the causal tower up to EOT only

    def search(
        self,
        queries: Sequence[str],
        k: int = 10,
        shortlist: Optional[int] = None,
        nprobe: Optional[int] = None,
        memory_budget: Optional[int] = None,
        uncertainty: Optional[UncertaintyRequest] = None,
    ) -> list[SearchResult]:
        """Each query's ``k`` videos, best first, with its top-1/top-2 margin (and, for a calibrated run, its
        calibrated probabilities; ``uncertainty``: a conformal set and a risk decision, docs/uncertainty.md).

        ``shortlist``: K videos re-ranked a query (with an index: default ``DEFAULT_SHORTLIST``, 100; without:
        None scores them all).
        """
        queries = check_queries(queries, k)
        if shortlist is not None:  # the API's entry, before a query is encoded (rank and the Scorer pass it on)
            check_shortlist(shortlist)
        # before the search, once: a request that cannot be met costs nothing
        stage = self.first_stage_identity(shortlist, nprobe)
        self.check_request(uncertainty, stage)
        text = self.encode(queries)  # (M, D)
        # unknown words first: a query none of whose words the model knows gets no calibrated numbers
        results = self._note_unknown_words(self.rank(queries, text, k, shortlist, nprobe, memory_budget), self.warn)
        assessed = self._assess(results, text, [uncertainty] * len(results), stage, checked=True)
        for r in assessed:
            if isinstance(r, ConfigError):
                raise r
        return results

    def search_batch(
        self,
        queries: Sequence[str],
        k: int | Sequence[int] = 10,
        shortlist: Optional[int] = None,
        nprobe: Optional[int] = None,
        timings: Optional[dict] = None,
        uncertainty: Optional[UncertaintyRequest] | Sequence[Optional[UncertaintyRequest]] = None,
    ) -> list[SearchResult | ConfigError]:
        """Queries that arrived together (a server's batch), each answered as :meth:`search` answers it alone.

        ``k``: one for all or one per query. A bad query (empty, ``k`` below 1) gets its ConfigError in
        its place and the others their results; the good ones are encoded in one batch and ranked together
        (:meth:`rank`). ``shortlist`` and ``nprobe`` are the batch's: a bad ``shortlist`` raises. A failed
        read of the store or the index raises too (the batch's, not a query's). ``uncertainty``: one request for
        all or one per query; a request that cannot be met is its query's ConfigError.
        """
        reqs = list(uncertainty) if isinstance(uncertainty, (list, tuple)) else [uncertainty] * len(queries)
        ks = [k] * len(queries) if isinstance(k, int) else [int(x) for x in k]
        if len(ks) != len(queries):
            raise ConfigError(f"{len(ks)} k values for {len(queries)} queries")
        if shortlist is not None:  # the API's entry, before a query is encoded (rank and the Scorer pass it on)
            check_shortlist(shortlist)
        out: list[SearchResult | ConfigError | None] = [None] * len(queries)
        for i, (q, k_i) in enumerate(zip(queries, ks)):
            try:
                check_queries([q], k_i)
            except ConfigError as exc:
                out[i] = exc
        good = [i for i, o in enumerate(out) if o is None]
        if good:
            texts = [str(queries[i]) for i in good]
            t0 = time.perf_counter()
            text = self.encode(texts)  # (M, D): one batch
            tick(timings if timings is not None else {}, "encode", t0)
            ranked = self._note_unknown_words(  # a server's results say it; no log line
                self.rank(texts, text, [ks[i] for i in good], shortlist, nprobe, None, timings)
            )
            stage = self.first_stage_identity(shortlist, nprobe)
            for i, res in zip(good, self._assess(ranked, text, [reqs[i] for i in good], stage)):
                out[i] = res
        assert all(o is not None for o in out)
        return out  # type: ignore[return-value]  # every place filled

    def _note_unknown_words(
        self, results: list[SearchResult], warn: Callable[[str], None] = lambda message: None
    ) -> list[SearchResult]:
        """Each result with the words of its query the store's CLIP cannot read (:func:`unknown_words`), said in
        one ``warn`` line a query."""
        if self.bundle is None:
            return results
        for res, words in zip(results, unknown_words(self.bundle, [r.query for r in results])):
            if words:
                res.unknown_words = words
                warn(unknown_words_line(res.query, words, self.bundle.requested_model or self.bundle.model_name))
        return results

    def rank(
        self,
        queries: Sequence[str],
        text: torch.Tensor | np.ndarray,
        k: int | Sequence[int] = 10,
        shortlist: Optional[int] = None,
        nprobe: Optional[int] = None,
        memory_budget: Optional[int] = None,
        timings: Optional[dict] = None,
    ) -> list[SearchResult]:
        """:meth:`search` for queries already encoded (``text`` (M, D)); ``k``: one for all or one per query;
        ``timings`` (a dict) gets the seconds spent in each step added to it: index, read, score.

        Several queries are ranked together: without an index in one Scorer call over the split; with one, each
        query's shortlist from one first-stage call, their union read once, and each query's own pairs scored
        through the engine's one-text path (``Scorer.score_queries``: what it would get alone), or where the
        model has none in one pass of aligned pairs (:func:`~dab_pipeline.search.pairs.score_shortlists`).
        """
        text = torch.as_tensor(np.asarray(text, np.float32))  # (M, D)
        ks = [int(k)] * len(queries) if isinstance(k, int) else [int(x) for x in k]
        timings = timings if timings is not None else {}
        if self.index is None:
            return self._search_split(list(queries), text, ks, shortlist, memory_budget)
        return self._rank_shortlists(
            list(queries),
            text,
            ks,
            DEFAULT_SHORTLIST if shortlist is None else shortlist,  # checked where it entered
            nprobe,
            timings,
        )

    def _rank_shortlists(
        self,
        queries: list[str],
        text: torch.Tensor,
        ks: list[int],
        shortlist: int,
        nprobe: Optional[int],
        timings: dict,
    ) -> list[SearchResult]:
        """With the index: each query's K-video shortlist, the union read once, each query scored on its own."""
        assert self.index is not None
        t0 = time.perf_counter()
        qv = query_vectors(self.index.meta.vector, text.to(self.device), self.run.model)  # (M, D)
        cand = first_stage(qv, self.index, shortlist, nprobe=nprobe)  # (M, K) store rows, -1: none
        t0 = tick(timings, "index", t0)
        rows = [np.unique(c[c >= 0]) for c in cand]  # each query's shortlist, sorted: the store reads coalesce
        union = rows[0] if len(rows) == 1 else np.unique(np.concatenate(rows))  # (U,)
        frames, mask = self.store.read_videos(union)  # (U, F, D), (U, F): the shortlists' videos, each once
        terms = self.index.video_terms(union) if self.terms else None  # (U, D) float16: the run's video terms
        t0 = tick(timings, "read", t0)
        costs = self._score_shortlists(text, frames, mask, [np.searchsorted(union, r) for r in rows], terms)
        tick(timings, "score", t0)
        out = []
        for q, r, cost, k in zip(queries, rows, costs, ks):
            res = Ranked(cost[None], *topk_smallest(cost[None], min(max(k, 2), len(r))))  # (1, K)
            out.append(make_result(q, res, 0, self.store.video_ids[r], np.searchsorted(self.rows, r), k, shortlist))
        return out

    def _score_shortlists(
        self,
        text: torch.Tensor,
        frames: np.ndarray,
        mask: np.ndarray,
        local: list[np.ndarray],
        terms: Optional[np.ndarray] = None,
    ) -> list[np.ndarray]:
        """Each query's costs over its shortlist (``local``: its places in ``frames``) -> [(K_i,) float32];
        ``terms``: the videos' cached token-branch terms (rows of ``frames``) or None."""
        if len(local) == 1:  # one query (the frames are its shortlist, in order): the Scorer's one-query path
            return [self._scorer.score_query(text[0], frames, mask, terms)]  # (K,)
        # each query through the engine's one-text path, as alone (3-5x cheaper a pair than the model's aligned path)
        costs = self._scorer.score_queries(text, frames, mask, local, terms)
        if costs is not None:
            return costs
        model = self.run.model
        was_training = model.training
        model.eval().to(self.device)
        try:
            return score_shortlists(
                model, text, torch.as_tensor(frames), torch.as_tensor(mask), local, dtype=self.dtype
            )
        finally:
            model.train(was_training)

    def _scorer_for(self, memory_budget: Optional[int]) -> Scorer:
        """The kept Scorer, or a new one where a search asks for another memory budget (then kept instead)."""
        if self._scorer.memory_budget != memory_budget:
            self._scorer.close()
            self._scorer = Scorer(self.run.model, device=self.device, dtype=self.dtype, memory_budget=memory_budget)
        return self._scorer

    def _search_split(
        self,
        queries: list[str],
        text: torch.Tensor,
        ks: list[int],
        shortlist: Optional[int],
        memory_budget: Optional[int],
    ) -> list[SearchResult]:
        """Without an index: every query of the batch against the split (or its shortlist) in one Scorer call."""
        if self._feats is None:
            self._feats = self.store.load_split(self.split)
        feats = self._feats
        n_v = len(feats.video_ids)
        res = self._scorer_for(memory_budget).score(
            text, feats.frames, feats.frame_mask, k=min(max([*ks, 2]), n_v), shortlist=shortlist
        )  # each query's best max(k) videos, best first: the first k are its top k
        return [
            make_result(q, res, i, feats.video_ids, np.arange(n_v), k, shortlist)
            for i, (q, k) in enumerate(zip(queries, ks))
        ]


@dataclass(frozen=True)
class SearcherOptions:
    """What a :class:`Searcher` opens and how it ranks: the options ``dab search``, ``dab serve`` and
    ``dab calibrate`` share, each config giving its own (``SearchConfig.searcher_options``, ...).

    ``index``: a ``dab index`` folder, or an index already loaded (``dab serve --ray``'s shards, served)."""

    run: str | Path
    features: str | Path | StoreURL
    split: str = "test"
    index: "str | Path | VideoIndex | None" = None
    device: str = "auto"
    dtype: str = DEFAULT_SCORE_DTYPE


def open_searcher(
    options: SearcherOptions, *, warn: Callable[[str], None] = lambda message: None, encoder: bool = True
) -> Searcher:
    """The :class:`Searcher` of ``options``: how the stages build one (``warn`` gets what the search says, a dtype
    run in float32 and a query's unknown words; ``encoder=False``: no CLIP, for texts already encoded)."""
    return Searcher(
        options.run,
        options.features,
        split=options.split,
        index=options.index,
        device=options.device,
        dtype=options.dtype,
        warn=warn,
        encoder=encoder,
    )
