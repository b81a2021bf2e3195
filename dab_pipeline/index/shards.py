"""A sharded index: one split's videos cut into N contiguous ranges, an index over each, searched as one.

``DIR/`` holds ``shards.json`` (the plan: the ranges, the factory, the vector kind, the fingerprint of the whole
split's videos, the run), ``trained.faiss`` (the trained, empty FAISS index every shard starts from: quantiser and
codebooks trained once, on the sample one index over the whole split trains on) and ``shard-000/`` ... (ordinary
index folders over their ranges). Each shard is built, and resumed, on its own (``dab index --shards N --shard I``),
on any machine that reads the store.

A search asks every shard for its candidates at the same nprobe, merges them by the index's own scores, then
re-scores the merged candidates exactly, as one index does: since the shards' inverted lists partition the lists
of one index trained the same way, the merged shortlist is the one index's (tested equal), up to the order of
videos whose quantised scores tie at the shortlist's edge (coarse codes such as PQ4x4 tie often; 8-bit codes
rarely). An HNSW graph does not partition so: ``--shards`` refuses HNSW factories.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Optional

import numpy as np

from ..core.errors import ConfigError, StoreError
from ..core.events import Event, ProgressCallback, null_progress
from ..core.fsutil import remove_path
from ..model import DABModel
from ..store import FeatureStore, average_query, split_rows, store_fingerprint
from .build import build_index, check_build_args, effective_refine, training_positions
from .faiss_index import VideoIndex, auto_factory, new_faiss_index, require_faiss
from .vectors import VECTOR_KINDS, video_vectors

__all__ = [
    "SHARDS_FILE",
    "ShardedIndex",
    "build_sharded_index",
    "merge_candidates",
    "read_plan",
    "shard_folder",
    "shard_ranges",
]

SHARDS_FILE = "shards.json"
TRAINED_FILE = "trained.faiss"
SHARDS_FORMAT = 1


def shard_ranges(n: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous ranges of ``n`` videos, as even as can be: [(start, stop), ...]."""
    bounds = [n * i // shards for i in range(shards + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def shard_folder(out: Path, i: int) -> Path:
    return Path(out) / f"shard-{i:03d}"


def build_sharded_index(
    store: FeatureStore,
    out: str | Path,
    *,
    shards: int,
    shard: Optional[int] = None,
    split: str = "test",
    vector: str = "segments",
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
) -> dict:
    """Index ``split``'s videos of ``store`` as ``shards`` shards into the folder ``out`` (``shard``: only that
    one); returns the plan (shards.json). Every argument is checked before anything is written or replaced."""
    out, faiss = Path(out), require_faiss()
    rows = split_rows(store, split)
    n, kind = len(rows), VECTOR_KINDS.get(vector)
    if n == 0:
        raise StoreError(f"{store.path}: split {split!r} has no encoded videos to index")
    if not 1 <= int(shards) <= n:
        raise ConfigError(f"--shards must be between 1 and the split's {n} videos, got {shards}")
    if shard is not None and not 0 <= int(shard) < int(shards):
        raise ConfigError(f"--shard must be between 0 and {int(shards) - 1} (of --shards {shards}), got {shard}")
    factory = auto_factory(n * kind.per_video, store.dim) if factory == "auto" else factory
    check_build_args(out / "shard", vector, kind, model, run, chunk, True, terms)  # the shards' own checks, first
    _check_partitionable(faiss, factory, store.dim)
    run = run or {"path": None, "checkpoint_sha256": None}
    settings = {"nprobe": nprobe, "ef_search": ef_search, "refine": effective_refine(factory, refine), "terms": terms}
    plan = _new_plan(store, rows, int(shards), split, vector, factory, settings, run)
    _check_plan(out, plan, replace=overwrite and shard is None)
    if overwrite and shard is None and out.exists():
        remove_path(out)  # every argument checked: start over
    out.mkdir(parents=True, exist_ok=True)
    trained = _trained_bytes(faiss, store, out, rows, vector, model, factory, chunk, progress)
    plan["trained_sha256"] = hashlib.sha256(trained).hexdigest() if trained is not None else None
    _publish_once(out / SHARDS_FILE, json.dumps(plan, indent=2).encode())
    _check_plan(out, plan, replace=False)  # another machine's plan, published first, must be this one
    _check_trained(out, plan)
    for i in range(int(shards)) if shard is None else [int(shard)]:
        folder = shard_folder(out, i)
        if (folder / "index.json").is_file() and not overwrite:
            progress(Event("info", message=f"{folder} is built: kept (--overwrite rebuilds it)"))
            continue
        a, b = plan["ranges"][i]
        progress(Event("info", message=f"shard {i} of {shards}: videos {a} to {b - 1}"))
        build_index(
            store, folder, split=split, vector=vector, model=model, run=run, factory=factory, chunk=chunk,
            nprobe=nprobe, ef_search=ef_search, refine=refine, terms=terms, overwrite=overwrite, progress=progress,
            rows=rows[a:b], trained=trained, record={"trained_sha256": plan["trained_sha256"]},
        )  # fmt: skip
    return plan


def _new_plan(
    store: FeatureStore, rows: np.ndarray, shards: int, split: str, vector: str, factory: str, settings: dict, run: dict
) -> dict:
    """shards.json's content (its ``trained_sha256`` is added once the trained file is there)."""
    return {
        "format": SHARDS_FORMAT,
        "shards": shards,
        "ranges": [list(r) for r in shard_ranges(len(rows), shards)],
        "count": len(rows),
        "split": split,
        "vector": vector,
        "factory": factory,
        "settings": settings,
        "store": {"path": str(store.path), "fingerprint": store_fingerprint(store, rows)},
        "run": run,
    }


def _check_trained(out: Path, plan: dict) -> None:
    """Refuse to build shards from a trained.faiss other than the one shards.json was planned with."""
    if (read_plan(out) or {}).get("trained_sha256") != plan["trained_sha256"]:
        raise ConfigError(
            f"{out / TRAINED_FILE} is not the file {out / SHARDS_FILE} was planned with (their sha256 differ): start "
            "the index over with --overwrite (without --shard)"
        )


def _check_partitionable(faiss, factory: str, dim: int) -> None:
    """A factory whose index splits into shards that search as one: flat, quantised codes, inverted lists; not a
    graph (HNSW, NSG) over every vector."""
    index = new_faiss_index(factory, dim)  # a bad factory string is refused here
    if faiss.try_extract_index_ivf(index) is None and any(tag in factory for tag in ("HNSW", "NSG")):
        raise ConfigError(f"--shards cannot split the graph of {factory!r}: use a Flat, PQ or IVF factory")


def _compared(plan: dict) -> dict:
    """What two plans of one index share: all but where the store is found and the run's path (the machines
    that build the shards may name them otherwise) and the trained file's hash (checked on its own)."""
    return {k: v for k, v in plan.items() if k not in ("store", "run", "trained_sha256")} | {
        "store": plan["store"]["fingerprint"],
        "run": (plan.get("run") or {}).get("checkpoint_sha256"),
    }


def read_plan(out: Path) -> Optional[dict]:
    """``out``'s shards.json, or None where there is none; a damaged one is a one-line ConfigError."""
    path = Path(out) / SHARDS_FILE
    if not path.is_file():
        return None
    try:
        plan = json.loads(path.read_text())
        plan["ranges"], plan["shards"], plan["count"], plan["store"]["fingerprint"]  # noqa: B018
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a dab shards.json ({type(exc).__name__}: {exc}); rebuild the index") from None
    if int(plan.get("format", 0)) > SHARDS_FORMAT:
        raise ConfigError(f"{path}: sharded index format {plan.get('format')}; this dab reads {SHARDS_FORMAT} or older")
    return plan


def _check_plan(out: Path, plan: dict, replace: bool) -> None:
    """Refuse to build into ``out`` when it holds something else than this index's shards (``replace``: an
    earlier sharded index there will be started over)."""
    saved = read_plan(out)
    if saved is None:
        ours = (SHARDS_FILE, TRAINED_FILE)
        others = (
            [p.name for p in out.iterdir() if not p.name.startswith((".", "shard-")) and p.name not in ours]
            if out.is_dir()
            else []
        )
        if others:
            raise ConfigError(
                f"{out} exists and is not a sharded dab index (it holds {others[0]}); choose another --out"
            )
        return
    if replace:
        return
    mine, theirs = _compared(plan), _compared(saved)
    differ = sorted(k for k in mine if mine[k] != theirs.get(k))
    if differ:
        raise ConfigError(
            f"{out} holds shards of another index ({', '.join(differ)} differ); build into another --out, or "
            "pass --overwrite (without --shard) to start it over"
        )


def _publish_once(path: Path, data: bytes) -> bool:
    """Write ``path`` unless it exists, atomically and exclusively (a hard link fails where the file is there):
    where several machines race, the first one's file stays and the others read it. Whether this call wrote it."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)


def _trained_bytes(
    faiss, store: FeatureStore, out: Path, rows: np.ndarray, vector: str, model, factory: str, chunk: int, progress
) -> Optional[bytes]:
    """trained.faiss's bytes: the factory's index trained on the sample one index over every row trains on (None:
    the factory needs no training). Written once (the first machine's stays); every shard reads these bytes."""
    path = out / TRAINED_FILE
    if not path.is_file():
        kind = VECTOR_KINDS.get(vector)
        index = new_faiss_index(factory, store.dim)
        pick = training_positions(faiss, index, len(rows) * kind.per_video)
        if pick is None:
            return None
        sample = _sample_vectors(store, rows, vector, model, pick, chunk)
        progress(Event("info", message=f"training the shards' index on {len(pick):,} vectors"))
        index.train(sample)
        _publish_once(path, faiss.serialize_index(index).tobytes())
    return path.read_bytes()


def _sample_vectors(store: FeatureStore, rows: np.ndarray, vector: str, model, pick: np.ndarray, chunk: int):
    """The vectors at positions ``pick`` (per_video a video) of ``rows``' videos, read ``chunk`` videos at a time
    -> (P, D) float32. (For the ``pooled`` kind a batch's float rounding may differ from the one index's chunks.)"""
    kind = VECTOR_KINDS.get(vector)
    avg = average_query(store) if kind.needs_run else None
    videos = np.unique(pick // kind.per_video)  # (U,) the sample's videos, ascending
    out = np.empty((len(pick), store.dim), np.float32)
    for c0 in range(0, len(videos), chunk):
        part = videos[c0 : c0 + chunk]
        frames, mask = store.read_videos(rows[part])  # (B, F, D), (B, F)
        vecs = video_vectors(vector, frames, mask, model, avg)  # (B, S, D)
        at = np.flatnonzero(np.isin(pick // kind.per_video, part))  # the sample positions of these videos
        out[at] = vecs[np.searchsorted(part, pick[at] // kind.per_video), pick[at] % kind.per_video]
    return out


def merge_candidates(
    found: list[tuple[np.ndarray, ...]], offsets: np.ndarray, n_cand: int
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The shards' candidates (scores, ids local to the shard, more arrays aligned with them...) each (M, n), merged
    into each query's ``n_cand`` best by score, ties by the lower position over every shard -> (scores, positions,
    [the other arrays, in the same order]), each (M, n_cand)."""
    # Not faiss's merge (merge_knn_results, which IndexShards uses; ResultHeap): it breaks a tie by its heap's order
    # (faiss 1.15: positions 9 and 10 of two shards at one score come out 10 first), where dab's rule is the lower
    # position over every shard, one order whatever the shard count; and it carries distances and labels only, where
    # a served shard's candidates come with their exact scores, merged alongside them (ServedShardedIndex).
    sc = np.concatenate([f[0] for f in found], axis=1)  # (M, N * n)
    i = np.concatenate([np.where(f[1] >= 0, f[1] + off, -1) for f, off in zip(found, offsets)], axis=1)
    sc = np.where(i >= 0, sc, -np.inf)
    order = np.lexsort((i, -sc), axis=-1)[:, :n_cand]  # best first, ties by the lower position
    rest = [
        np.take_along_axis(np.concatenate([f[j] for f in found], axis=1), order, 1) for j in range(2, len(found[0]))
    ]
    return np.take_along_axis(sc, order, 1), np.take_along_axis(i, order, 1), rest


class ShardedIndex(VideoIndex):
    """The shards of a sharded index as one :class:`VideoIndex`: the same search, the same answers."""

    def __init__(self, path: Path, plan: dict, shards: list[VideoIndex]) -> None:
        meta = dataclasses.replace(shards[0].meta, count=int(plan["count"]), store=plan["store"])
        super().__init__(path, meta, None, np.concatenate([s.rows for s in shards]))
        self.plan, self.shards = plan, shards
        self.offsets = np.cumsum([0] + [len(s.rows) for s in shards])  # (N + 1,) each shard's first vector

    def candidates(self, q: np.ndarray, n_cand: int, nprobe, ef_search) -> tuple[np.ndarray, np.ndarray]:
        """Every shard's ``n_cand`` best at the same nprobe, merged by the index's scores -> the ``n_cand`` best."""
        found = [s.candidates(q, n_cand, nprobe, ef_search) for s in self.shards]  # (M, n_cand) each
        sc, i, _ = merge_candidates(found, self.offsets, n_cand)
        return sc, i

    def exact_vectors(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (positions over every shard) of the shards' refine.f16 files -> (n, D) float32."""
        which = np.searchsorted(self.offsets, ids, side="right") - 1  # (n,) each id's shard
        out = np.empty((len(ids), self.meta.dim), np.float32)
        for j in np.unique(which):
            at = np.flatnonzero(which == j)
            out[at] = self.shards[j].exact_vectors(ids[at] - self.offsets[j])
        return out

    def video_terms(self, store_rows: np.ndarray) -> Optional[np.ndarray]:
        if not self.meta.terms:
            return None
        out = np.empty((len(store_rows), self.meta.dim), np.float16)
        starts = [s.video_rows[0] for s in self.shards[1:]]
        which = np.searchsorted(starts, store_rows, side="right")  # (n,) the shard whose range holds each row
        for j in np.unique(which):
            at = np.flatnonzero(which == j)
            out[at] = self.shards[j].video_terms(np.asarray(store_rows)[at])
        return out

    def identity_files(self) -> list[Path]:
        top = [self.path, self.path / SHARDS_FILE]
        top += [self.path / TRAINED_FILE] if (self.path / TRAINED_FILE).is_file() else []
        return top + [f for s in self.shards for f in s.identity_files()]

    def close(self) -> None:
        for s in self.shards:
            s.close()
