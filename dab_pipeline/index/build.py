"""Building a video index from a store: streamed in chunks, resumable, published in one rename.

The vectors are computed chunk by chunk (``chunk`` videos read at a time, so memory is
bounded by one chunk plus the vectors, N x D float32 on disk through a memory map) into
a staging folder beside ``out``; a stopped build resumes from its last finished chunk
when the store, the vector kind and the run are unchanged.  The FAISS index is then
trained (IVF: on an evenly spaced sample), filled, and the folder renamed into place.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..core.errors import ConfigError, StoreError, WriteError
from ..core.events import Event, ProgressCallback, null_progress
from ..core.fsutil import atomic_write_text, publish, remove_path
from ..core.write_errors import check_free_space, named_write_errors, reserve_file
from ..model import DABModel
from ..store import FeatureStore, average_query, split_rows, store_fingerprint
from .faiss_index import REFINE_FILE, TERMS_FILE, IndexMeta, auto_factory, new_faiss_index, require_faiss
from .vectors import DEFAULT_VECTOR, VECTOR_KINDS, video_terms, video_vectors

__all__ = [
    "build_index",
    "check_build_args",
    "effective_refine",
    "staging_path",
    "training_positions",
]

RESUME_HINT = "free some space and run the same command again: the build resumes from its last finished chunk"
TRAIN_PER_LIST = 64


def staging_path(out: Path) -> Path:
    return out.parent / f".{out.name}.building"


def _staging(
    out: Path, state: dict, n: int, dim: int, videos: int
) -> tuple[Path, np.ndarray, Optional[np.ndarray], int]:
    """The staging folder's vector memmap, its video terms' memmap (``state["terms"]``: (videos, dim) float16, the
    index's terms.f16 itself, else None) and the first row still to compute (0 unless a matching build stopped)."""
    stage = staging_path(out)
    state_file = stage / "state.json"
    terms_file = stage / TERMS_FILE if state.get("terms") else None
    terms_bytes = videos * dim * 2
    done = 0
    if state_file.is_file():
        try:
            old = json.loads(state_file.read_text())
        except ValueError:
            old = {}
        terms_ok = terms_file is None or (terms_file.is_file() and terms_file.stat().st_size == terms_bytes)
        if {k: old.get(k) for k in state} == state and (stage / "vectors.npy").is_file() and terms_ok:
            done = int(old.get("done", 0))
    if done == 0:
        remove_path(stage)
        with named_write_errors(stage, RESUME_HINT):
            stage.mkdir(parents=True)
            np.lib.format.open_memmap(stage / "vectors.npy", mode="w+", dtype=np.float32, shape=(n, dim)).flush()
            if terms_file is not None:  # headerless, as the index keeps it: read a row at a time with pread
                np.memmap(terms_file, dtype=np.float16, mode="w+", shape=(videos, dim)).flush()
        # the maps' pages get their disk blocks now: on a full disk a store into a sparse page is a SIGBUS
        try:
            for path in [stage / "vectors.npy"] + ([terms_file] if terms_file is not None else []):
                reserve_file(path, path.stat().st_size, RESUME_HINT)
        except WriteError:
            remove_path(stage)  # what the reservation got is given back
            raise
    vecs = np.load(stage / "vectors.npy", mmap_mode="r+")
    terms = None if terms_file is None else np.memmap(terms_file, dtype=np.float16, mode="r+", shape=(videos, dim))
    return stage, vecs, terms, done


def build_index(
    store: FeatureStore,
    out: str | Path,
    *,
    split: str = "test",
    vector: str = DEFAULT_VECTOR,
    model: Optional[DABModel] = None,
    run: Optional[dict] = None,
    factory: str = "auto",
    chunk: int = 4096,
    nprobe: int = 32,
    ef_search: int = 64,
    refine: int = 4,
    terms: bool = False,
    overwrite: bool = False,
    progress: ProgressCallback = null_progress,
    rows: Optional[np.ndarray] = None,
    trained: Optional[bytes] = None,
    record: Optional[dict] = None,
) -> IndexMeta:
    """Index ``split``'s videos of an open, complete ``store`` into the folder ``out``; returns its metadata.

    ``model`` / ``run`` ({"path", "checkpoint_sha256"}): the run the index serves (needed by run-dependent
    vectors, recorded always). ``factory``: a FAISS factory string or "auto" (:func:`auto_factory`).
    ``refine``: for an approximate factory, keep the exact vectors (float16, ``refine.f16``) and re-score
    ``refine`` x K x S candidates a search of shortlist K (0: the quantised scores alone). ``terms``: also keep the
    run's token-branch term of each video (``terms.f16``, float16, D values a video; ``model`` needed), which a
    search with this run passes to the re-rank instead of computing it (``Scorer.score_query(..., terms)``).
    ``rows`` (a shard, :mod:`.shards`): index these store rows of the split only; ``trained``: start from this
    trained, empty FAISS index (serialised; every shard of a sharded index shares one) instead of training one;
    ``record``: more entries for index.json's ``build`` (written before the folder is published).
    """
    out = Path(out)
    kind = VECTOR_KINDS.get(vector)
    check_build_args(out, vector, kind, model, run, chunk, overwrite, terms)
    faiss = require_faiss()
    t0 = time.perf_counter()
    rows = _rows_to_index(store, split) if rows is None else np.asarray(rows, np.int64)
    n, dim, per = len(rows), store.dim, kind.per_video
    factory = auto_factory(n * per, dim) if factory == "auto" else factory
    index = _empty_index(faiss, factory, dim, trained)  # a bad factory string fails before any reading
    avg = average_query(store) if kind.needs_run else None
    fp = store_fingerprint(store, rows)
    run = run or {"path": None, "checkpoint_sha256": None}
    run_sha = run.get("checkpoint_sha256") if kind.needs_run or terms else None
    state = _resume_state(fp, vector, run_sha, n, dim, terms)
    stage, vecs, term_rows, done = _staging(out, state, n * per, dim, n)
    _compute_vectors(store, rows, vector, model, avg, vecs, term_rows, stage, state, done, chunk, per, progress)
    t_vec = time.perf_counter() - t0
    _fill(faiss, index, vecs, progress)
    refine = _refine_if_quantised(factory, refine, stage, vecs, progress)
    meta = IndexMeta(
        **dict(vector=vector, factory=factory, dim=dim, count=n, per_video=per, split=split, run=run, terms=terms),
        **dict(nprobe=nprobe, ef_search=ef_search, refine=refine, build=_build_record(faiss, t0, t_vec, chunk, record)),
        store={"path": str(store.path), "fingerprint": fp},
        avg_query=None if avg is None else [float(x) for x in avg],
    )
    del vecs, term_rows  # the staging vectors are dropped by _publish_index, once the index is written
    _publish_index(faiss, index, rows, per, meta, stage, out, overwrite)
    return meta


def _rows_to_index(store: FeatureStore, split: str) -> np.ndarray:
    """:func:`split_rows`, refusing a split with nothing to index."""
    rows = split_rows(store, split)
    if len(rows) == 0:
        raise StoreError(f"{store.path}: split {split!r} has no encoded videos to index")
    return rows


def _resume_state(fingerprint: str, vector: str, run_sha: Optional[str], n: int, dim: int, terms: bool) -> dict:
    """What a stopped build must share with this one for this one to resume it (state.json, less ``done``)."""
    return {"fingerprint": fingerprint, "vector": vector, "run": run_sha, "n": n, "dim": dim, "terms": terms}


def effective_refine(factory: str, refine: int) -> int:
    """The refine factor an index of ``factory`` keeps: ``refine`` where its codes lose precision, else 0."""
    quantised = any(tag in factory for tag in ("PQ", "SQ", "LSH", "RaBitQ"))
    return refine if quantised else 0


def _refine_if_quantised(factory: str, refine: int, stage: Path, vecs: np.ndarray, progress: ProgressCallback) -> int:
    """The refine factor the index keeps: ``refine`` for a quantised factory (its exact float16 vectors are written
    to ``stage``), else 0."""
    refine = effective_refine(factory, refine)
    if refine:
        with named_write_errors(stage / REFINE_FILE, RESUME_HINT):
            check_free_space(stage, len(vecs) * vecs.shape[1] * 2)
            _write_refine(stage / REFINE_FILE, vecs, progress)
    return refine


def _empty_index(faiss, factory: str, dim: int, trained: Optional[bytes]):
    """A new index of ``factory``, or the trained one serialised in ``trained``."""
    return (
        new_faiss_index(factory, dim) if trained is None else faiss.deserialize_index(np.frombuffer(trained, np.uint8))
    )


def _build_record(faiss, t0: float, t_vec: float, chunk: int, record: Optional[dict] = None) -> dict:
    """The index.json ``build`` entry: timings since ``t0``, the FAISS version, the chunk size (and ``record``)."""
    return (record or {}) | {
        "seconds": round(time.perf_counter() - t0, 3),
        "vector_seconds": round(t_vec, 3),
        "faiss": faiss.__version__,
        "chunk": chunk,
    }


def check_build_args(
    out: Path,
    vector: str,
    kind,
    model: Optional[DABModel],
    run: Optional[dict],
    chunk: int,
    overwrite: bool,
    terms: bool,
) -> None:
    """Refuse a build whose arguments cannot work before anything is read or written."""
    if kind.needs_run and model is None:
        raise ConfigError(f"the {vector!r} index vector is the run's own pooling: pass --run")
    if terms and (model is None or not (run or {}).get("checkpoint_sha256")):
        raise ConfigError("--video-terms keeps the run's token-branch term of each video: pass --run")
    if terms and getattr(model, "token_unc", None) is None:
        raise ConfigError(
            f"--video-terms: the run's model (variant {model.cfg.variant!r}) has no token branch; "
            "only prob and dab runs have video terms"
        )
    if chunk < 1:
        raise ConfigError(f"chunk must be a positive number of videos, got {chunk}")
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} already exists; pass --overwrite to replace it")
    if out.exists() and not (out / "index.json").is_file():
        raise ConfigError(f"{out} exists and is not a dab index folder (no index.json); refusing to overwrite it")


def _compute_vectors(
    store: FeatureStore,
    rows: np.ndarray,
    vector: str,
    model: Optional[DABModel],
    avg: Optional[np.ndarray],
    vecs: np.ndarray,
    terms: Optional[np.ndarray],
    stage: Path,
    state: dict,
    done: int,
    chunk: int,
    per: int,
    progress: ProgressCallback,
) -> None:
    """Fill ``vecs`` (and ``terms``, where kept) from row ``done`` on, ``chunk`` videos at a time, recording each
    finished chunk in state.json."""
    n, dim = len(rows), vecs.shape[1]
    progress(Event("start", task="vectors", total=n))
    progress(Event("advance", task="vectors", n=done))
    for c0 in range(done, n, chunk):
        c1 = min(c0 + chunk, n)
        frames, mask = store.read_videos(rows[c0:c1])  # (B, F, D), (B, F)
        vecs[c0 * per : c1 * per] = video_vectors(vector, frames, mask, model, avg).reshape(-1, dim)
        if terms is not None:
            assert model is not None
            terms[c0:c1] = video_terms(model, frames, mask)
        with named_write_errors(stage / "vectors.npy", RESUME_HINT):
            vecs.flush()
            if terms is not None:
                terms.flush()
            atomic_write_text(stage / "state.json", json.dumps({**state, "done": c1}))
        progress(Event("advance", task="vectors", n=c1 - c0))
    progress(Event("end", task="vectors"))


def _publish_index(
    faiss, index, rows: np.ndarray, per: int, meta: IndexMeta, stage: Path, out: Path, overwrite: bool
) -> None:
    """Write the index and its rows into ``stage``, drop the resume files, and rename the folder to ``out``."""
    # the vectors stay until the index is written: a build that fails here resumes past its chunks
    with named_write_errors(stage / "index.faiss", RESUME_HINT):
        faiss.write_index(index, str(stage / "index.faiss"))
        np.save(stage / "rows.npy", np.repeat(rows, per))  # the store row of each vector
    (stage / "vectors.npy").unlink()
    (stage / "state.json").unlink()
    atomic_write_text(stage / "index.json", json.dumps(meta.to_json(), indent=2))
    publish(stage, out, overwrite=overwrite)


def _write_refine(path: Path, vecs: np.ndarray, progress: ProgressCallback, chunk: int = 65_536) -> None:
    """The exact vectors as float16 rows, for re-scoring an approximate index's candidates."""
    with open(path, "wb") as fh:
        for a in range(0, len(vecs), chunk):
            fh.write(np.ascontiguousarray(vecs[a : a + chunk], dtype=np.float16).tobytes())
    progress(Event("info", message=f"wrote {path.name} ({path.stat().st_size / 1e9:.2f} GB)"))


def training_positions(faiss, index, n: int) -> Optional[np.ndarray]:
    """The positions, among ``n`` vectors, of the evenly spaced sample an untrained ``index`` trains on
    (TRAIN_PER_LIST a list for IVF); None where the index needs no training."""
    if index.is_trained:
        return None
    ivf = faiss.try_extract_index_ivf(index)
    want = TRAIN_PER_LIST * (ivf.nlist if ivf is not None else 256)
    pick = np.unique(np.linspace(0, n - 1, min(n, want)).astype(np.int64))
    if ivf is not None and len(pick) < ivf.nlist:
        raise ConfigError(
            f"an IVF index of {ivf.nlist} lists needs at least as many videos; got {n} (use a smaller nlist, or Flat)"
        )
    return pick


def _fill(faiss, index, vecs: np.ndarray, progress: ProgressCallback, add_chunk: int = 65_536) -> None:
    """Train the index (where it is not: on :func:`training_positions`' sample) and add every vector."""
    n = len(vecs)
    pick = training_positions(faiss, index, n)
    if pick is not None:
        progress(Event("info", message=f"training the index on {len(pick):,} vectors"))
        index.train(np.ascontiguousarray(vecs[pick]))
    progress(Event("start", task="index", total=n))
    for a in range(0, n, add_chunk):
        index.add(np.ascontiguousarray(vecs[a : a + add_chunk]))
        progress(Event("advance", task="index", n=min(add_chunk, n - a)))
    progress(Event("end", task="index"))
