"""A FAISS index over one vector per video, saved as a folder with its provenance.

``INDEX/`` holds ``index.faiss`` (the FAISS index), ``rows.npy`` (the store row of
each index id) and ``index.json`` (what it was built from: the vector kind, the
factory string, the store's and the run's fingerprints, search defaults).  FAISS is
an optional extra (``pip install 'dab-pipeline[index]'``, faiss-cpu); importing this
module does not need it, building or loading an index does.

An approximate index (IVF-PQ) also keeps every vector in float16 on disk (``refine.f16``,
2 D bytes a vector: 4 GB for a million videos' segments, read with pread so it stays out of
the server's memory): a search takes ``refine`` x K x S candidates from the quantised codes (K: its
shortlist; at most 4,096 unless K x S is more) and re-scores them exactly. Without it, on the
million-video synthetic store, the PQ codes' top 100 held 85 % of the exact first stage's top 10
whatever nprobe (32 to 512); the quantisation, not the probing, lost them.

Factories: exact inner product (``Flat``) up to ``FLAT_MAX`` vectors, where one query
costs N x D multiply-adds (262k x 512: ~30 ms on two cores) and the float32 vectors
(0.5 GB) fit in memory; above it ``IVF{nlist},PQ{D/8}``: D/8 bytes a vector (a million
videos' 4M segment vectors in 256 MB, where Flat needs 8 GB), ``nprobe`` lists scanned
a query.  The measurements behind the choice are in docs/search.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..core.errors import ConfigError, StoreMismatchError

__all__ = [
    "FLAT_MAX",
    "IndexMeta",
    "VideoIndex",
    "auto_factory",
    "require_faiss",
    "new_faiss_index",
    "INDEX_FORMAT",
]

INDEX_FORMAT = 2  # 2: the terms field (terms.f16); format 1 folders read as terms=False
REFINE_MAX = 4096  # candidates re-scored a query, unless K x S (the shortlist's vectors) alone is more
REFINE_FILE = "refine.f16"  # (vectors, D) float16, row-major: the exact vectors of an approximate index
TERMS_FILE = (
    "terms.f16"  # (videos, D) float16, row-major, in the order of the indexed store rows: the run's video terms
)
FLAT_MAX = 262_144
DEFAULT_NPROBE = 32


def require_faiss():
    """The faiss module, or a one-line :class:`ConfigError` naming the extra to install."""
    try:
        import faiss
    except ImportError:
        raise ConfigError(
            "FAISS is not installed: `pip install 'dab-pipeline[index]'` (faiss-cpu) to build or load a video index"
        ) from None
    return faiss


def auto_factory(n: int, dim: int) -> str:
    """Exact up to :data:`FLAT_MAX` vectors; above it IVF with about 2 sqrt(N) lists (a power of two) and
    product-quantised codes of D/8 bytes (64 at D = 512: 4M vectors, a million videos' segments, in 256 MB)."""
    if n <= FLAT_MAX:
        return "Flat"
    nlist = 1 << max(4, round(math.log2(2 * math.sqrt(n))))
    m = max(1, dim // 8)
    while dim % m:
        m -= 1
    return f"IVF{nlist},PQ{m}"


def new_faiss_index(factory: str, dim: int):
    faiss = require_faiss()
    try:
        return faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else "invalid"
        raise ConfigError(f"FAISS cannot build the factory string {factory!r}: {first}") from None


@dataclass
class IndexMeta:
    """index.json: what an index was built from and how to search it."""

    vector: str
    factory: str
    dim: int
    count: int
    split: str
    store: dict  # {"path", "fingerprint"}
    run: dict  # {"path", "checkpoint_sha256"}
    per_video: int = 1  # vectors a video (ntotal = count x per_video)
    nprobe: int = DEFAULT_NPROBE
    ef_search: int = 64
    refine: int = 0  # approximate factories: re-score refine x K x S candidates (K: the shortlist) exactly
    avg_query: Optional[list] = None  # the pooled kind's average query (D floats)
    terms: bool = False  # terms.f16: the run's token-branch term of each video (dab index --video-terms)
    build: dict = field(default_factory=dict)  # seconds, faiss version, chunk
    format: int = INDEX_FORMAT

    def to_json(self) -> dict[str, Any]:
        """index.json's fields; an index without video terms is written as format 1 (no ``terms`` field), which an
        older dab reads too."""
        out = dict(self.__dict__)
        if not out.pop("terms"):
            out["format"] = min(int(out["format"]), 1)
        else:
            out["terms"] = True
        return out

    @classmethod
    def from_json(cls, data: dict, where: Path) -> "IndexMeta":
        if int(data.get("format", 0)) > INDEX_FORMAT:
            raise ConfigError(f"{where}: index format {data.get('format')}; this dab reads {INDEX_FORMAT} or older")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(f"{where}: not a dab index.json ({exc})") from None


class VideoIndex:
    """A loaded index: ``search(queries (M, D), shortlist)`` -> each query's K = ``shortlist`` best videos' store
    rows (M, K) (-1 where fewer exist) and their scores (a video's best vector)."""

    def __init__(self, path: Path, meta: IndexMeta, index: Any, rows: np.ndarray) -> None:
        self.path, self.meta, self.index, self.rows = path, meta, index, rows
        self._exact = None  # the float16 vectors of refine.f16, opened on first use
        self._terms = None  # terms.f16, opened on first use
        self.video_rows = rows[:: meta.per_video]  # (count,) the indexed videos' store rows, ascending

    def exact_vectors(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of refine.f16 -> (n, D) float32, read with pread: the file stays in the page cache,
        out of the server's resident memory (a memory map would count every page it touched)."""
        if self._exact is None:
            self._exact = open(self.path / REFINE_FILE, "rb", buffering=0)
        return _read_rows(self._exact.fileno(), ids, self.meta.dim).astype(np.float32)

    def video_terms(self, store_rows: np.ndarray) -> Optional[np.ndarray]:
        """The run's token-branch terms of the videos at ``store_rows`` (indexed ones) -> (n, D) float16, or None
        where the index keeps none (``dab index --video-terms``); read with pread, as refine.f16."""
        if not self.meta.terms:
            return None
        where = np.searchsorted(self.video_rows, store_rows)
        if len(where) and (where.max() >= len(self.video_rows) or (self.video_rows[where] != store_rows).any()):
            raise ConfigError(f"{self.path}: video terms asked for store rows this index does not hold")
        if self._terms is None:
            self._terms = open(self.path / TERMS_FILE, "rb", buffering=0)
        return _read_rows(self._terms.fileno(), where, self.meta.dim)

    def close(self) -> None:
        for name in ("_exact", "_terms"):
            fh = getattr(self, name)
            if fh is not None:
                fh.close()
                setattr(self, name, None)

    def search(
        self, queries: np.ndarray, shortlist: int, nprobe: Optional[int] = None, ef_search: Optional[int] = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """queries (M, D) -> (ids (M, K), scores (M, K)) of each query's K = min(shortlist, videos) best videos
        (store rows, -1 where the index finds fewer), best first. Called through
        :func:`~dab_pipeline.scoring.first_stage.first_stage`, which checks the shortlist."""
        q = np.ascontiguousarray(queries, dtype=np.float32)  # (M, D)
        if q.ndim != 2 or q.shape[1] != self.meta.dim:
            raise ConfigError(f"queries of shape {q.shape} for an index of D={self.meta.dim}")
        for name, value in (("nprobe", nprobe), ("ef_search", ef_search)):
            if value is not None and int(value) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value}")
        shortlist = int(min(shortlist, self.meta.count))
        per = self.meta.per_video
        # S vectors a video: the K * S best vectors hold at least K videos
        want = shortlist * per
        refine = self.meta.refine  # load_index checked that refine.f16 is there
        # the exact re-scoring reads each candidate (pread, ~3 us): at most REFINE_MAX beyond K x S
        n_cand = max(want, min(want * refine, REFINE_MAX)) if refine else want
        scores, ids = self._best_vectors(q, n_cand, want if refine else 0, nprobe, ef_search)
        rows = np.where(ids >= 0, self.rows[np.clip(ids, 0, None)], -1)
        if per == 1:
            return rows.astype(np.int64), scores
        out_rows = np.full((len(q), shortlist), -1, np.int64)
        out_scores = np.full((len(q), shortlist), -np.inf, np.float32)
        for i in range(len(q)):
            valid = rows[i] >= 0
            _, first = np.unique(rows[i][valid], return_index=True)  # a video's first hit is its best
            order = np.sort(first)[:shortlist]
            out_rows[i, : len(order)] = rows[i][valid][order]
            out_scores[i, : len(order)] = scores[i][valid][order]
        return out_rows, out_scores

    def _best_vectors(
        self, q: np.ndarray, n_cand: int, refine_to: int, nprobe: Optional[int], ef_search: Optional[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each query's ``n_cand`` best vectors by the index's scores, re-scored exactly and cut to the ``refine_to``
        best where it is not 0 -> (scores, vector ids), best first (a served index asks its shards: served.py)."""
        scores, ids = self.candidates(q, n_cand, nprobe, ef_search)  # (M, n_cand) each
        return self._refined(q, ids, refine_to) if refine_to else (scores, ids)

    def candidates(
        self, q: np.ndarray, n_cand: int, nprobe: Optional[int], ef_search: Optional[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The FAISS search: each query's ``n_cand`` best vectors by the index's own scores -> (scores, vector ids),
        each (M, n_cand), best first (-1 ids where it finds fewer)."""
        faiss = require_faiss()
        params = None
        ivf = faiss.try_extract_index_ivf(self.index)
        if ivf is not None:
            params = faiss.SearchParametersIVF(nprobe=int(nprobe or self.meta.nprobe))
        elif "HNSW" in self.meta.factory:
            params = faiss.SearchParametersHNSW(efSearch=int(max(ef_search or self.meta.ef_search, n_cand)))
        return self.index.search(q, n_cand, params=params)

    def identity_files(self) -> list[Path]:
        """The folder and the files a search reads (a server watches them for a change)."""
        folder = Path(self.path)
        return [folder, *sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))]

    def _refined(self, q: np.ndarray, ids: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
        """Re-score each query's approximate candidates with their exact vectors; keep the ``want`` best."""
        out_s = np.full((len(q), want), -np.inf, np.float32)
        out_i = np.full((len(q), want), -1, np.int64)
        for m in range(len(q)):
            cand = np.unique(ids[m][ids[m] >= 0])  # sorted: the reads go forward through the file
            exact = self.exact_scores(q[m], cand)  # (n,)
            top = np.argsort(-exact, kind="stable")[:want]
            out_s[m, : len(top)], out_i[m, : len(top)] = exact[top], cand[top]
        return out_s, out_i

    def exact_scores(self, query: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The inner products of ``query`` (D,) with the exact (float16) vectors ``ids`` -> (n,) float32."""
        # einsum, not `@`: numpy's BLAS would wake its thread pool for this small product, and its threads
        # spin for tens of ms afterwards, taking the cores from the re-rank that follows (measured at 1M
        # videos, K = 100, T' = 8: the re-rank took 97.8 ms a query after `@` here, 26.2 ms after einsum)
        return np.einsum("nd,d->n", self.exact_vectors(ids), query)  # (n,)

    def check_store(self, fingerprint: str, store_path: Path) -> None:
        if fingerprint != self.meta.store["fingerprint"]:
            raise StoreMismatchError(
                f"{self.path} was built from another store (or the store changed since): its fingerprint "
                f"{self.meta.store['fingerprint'][:12]} != {fingerprint[:12]} of {store_path}; rebuild it with "
                f"`dab index --features {store_path} --out {self.path} --overwrite`"
            )


def _read_rows(fd: int, ids: np.ndarray, d: int) -> np.ndarray:
    """Rows ``ids`` of a (n, d) float16 row-major file -> (len(ids), d) float16, one pread each."""
    row_bytes = 2 * d
    buf = bytearray(len(ids) * row_bytes)
    view = memoryview(buf)
    for j, i in enumerate(np.asarray(ids).tolist()):
        os.preadv(fd, [view[j * row_bytes : (j + 1) * row_bytes]], int(i) * row_bytes)
    return np.frombuffer(buf, np.float16).reshape(len(ids), d)
