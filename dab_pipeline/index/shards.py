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
import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..core.errors import ConfigError
from ..core.events import Event, ProgressCallback, null_progress
from ..core.fsutil import atomic_write_bytes, atomic_write_text, remove_path, sha256_file
from ..model import DABModel
from ..store import FeatureStore
from .build import average_query, build_index, split_rows, store_fingerprint, training_positions
from .faiss_index import VideoIndex, auto_factory, load_index_folder, new_faiss_index, require_faiss
from .vectors import VECTOR_KINDS, video_vectors

__all__ = ["SHARDS_FILE", "ShardedIndex", "build_sharded_index", "load_index", "shard_ranges"]

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
    overwrite: bool = False,
    progress: ProgressCallback = null_progress,
    **options: Any,
) -> dict:
    """Index ``split``'s videos of ``store`` as ``shards`` shards into the folder ``out`` (``shard``: only that
    one); returns the plan (shards.json). ``options`` go to each shard's :func:`build_index` (chunk, nprobe,
    ef_search, refine, terms)."""
    out, faiss = Path(out), require_faiss()
    rows = split_rows(store, split)
    n, kind = len(rows), VECTOR_KINDS.get(vector)
    if not 1 <= int(shards) <= max(n, 1):
        raise ConfigError(f"--shards must be between 1 and the split's {n} videos, got {shards}")
    if shard is not None and not 0 <= int(shard) < int(shards):
        raise ConfigError(f"--shard must be between 0 and {int(shards) - 1} (of --shards {shards}), got {shard}")
    factory = auto_factory(n * kind.per_video, store.dim) if factory == "auto" else factory
    if "HNSW" in factory:
        raise ConfigError(f"--shards cannot split the graph of {factory!r}: use a Flat or IVF factory")
    run = run or {"path": None, "checkpoint_sha256": None}
    plan = {
        "format": SHARDS_FORMAT,
        "shards": int(shards),
        "ranges": [list(r) for r in shard_ranges(n, int(shards))],
        "count": n,
        "split": split,
        "vector": vector,
        "factory": factory,
        "store": {"path": str(store.path), "fingerprint": store_fingerprint(store, rows)},
        "run": run,
    }
    _open_plan(out, plan, overwrite and shard is None)
    trained = _trained_index(faiss, store, out, rows, vector, model, factory, progress)
    sha = sha256_file(trained) if trained is not None else None
    for i in range(int(shards)) if shard is None else [int(shard)]:
        folder = shard_folder(out, i)
        if (folder / "index.json").is_file() and not overwrite:
            progress(Event("info", message=f"{folder} is built: kept (--overwrite rebuilds it)"))
            continue
        a, b = plan["ranges"][i]
        progress(Event("info", message=f"shard {i} of {shards}: videos {a} to {b - 1}"))
        meta = build_index(
            store, folder, split=split, vector=vector, model=model, run=run, factory=factory, overwrite=overwrite,
            progress=progress, rows=rows[a:b], trained=trained, **options,
        )  # fmt: skip
        meta.build["trained_sha256"] = sha  # every shard of one index starts from the same trained file
        atomic_write_text(folder / "index.json", json.dumps(meta.to_json(), indent=2))
    return plan


def _open_plan(out: Path, plan: dict, replace: bool) -> None:
    """Write shards.json into ``out``, or check the one there asks for the same index (``replace``: start over)."""
    saved_path = out / SHARDS_FILE
    if out.exists() and replace:
        if not saved_path.is_file():
            raise ConfigError(f"{out} exists and is not a sharded dab index (no {SHARDS_FILE}); refusing to replace it")
        remove_path(out)
    if saved_path.is_file():
        saved = json.loads(saved_path.read_text())
        same = {k: v for k, v in saved.items() if k != "store"} == {k: v for k, v in plan.items() if k != "store"}
        if not same or saved["store"]["fingerprint"] != plan["store"]["fingerprint"]:
            differ = sorted(k for k in plan if k != "store" and saved.get(k) != plan[k])
            if saved.get("store", {}).get("fingerprint") != plan["store"]["fingerprint"]:
                differ.append("the store's videos")
            raise ConfigError(
                f"{out} holds shards of another index ({', '.join(differ)} differ); build into another --out, or "
                "pass --overwrite (without --shard) to start it over"
            )
        return
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not a sharded dab index (no {SHARDS_FILE}); choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(saved_path, json.dumps(plan, indent=2))


def _trained_index(
    faiss, store: FeatureStore, out: Path, rows: np.ndarray, vector: str, model, factory: str, progress
) -> Optional[Path]:
    """trained.faiss: the factory's index trained on the sample one index over every row would train on (None:
    the factory needs no training). Written once; later shards read it."""
    path = out / TRAINED_FILE
    if path.is_file():
        return path
    kind = VECTOR_KINDS.get(vector)
    index = new_faiss_index(factory, store.dim)
    pick = training_positions(faiss, index, len(rows) * kind.per_video)
    if pick is None:
        return None
    videos, which = np.unique(pick // kind.per_video, return_inverse=True)  # the sample's videos, once each
    avg = average_query(store) if kind.needs_run else None
    frames, mask = store.read_videos(rows[videos])  # (U, F, D), (U, F)
    vecs = video_vectors(vector, frames, mask, model, avg)  # (U, S, D)
    sample = vecs[which.reshape(-1), pick % kind.per_video]  # (P, D)
    progress(Event("info", message=f"training the shards' index on {len(pick):,} vectors"))
    index.train(np.ascontiguousarray(sample, dtype=np.float32))
    atomic_write_bytes(path, faiss.serialize_index(index).tobytes())
    return path


class ShardedIndex(VideoIndex):
    """The shards of a sharded index as one :class:`VideoIndex`: the same search, the same answers."""

    def __init__(self, path: Path, plan: dict, shards: list[VideoIndex]) -> None:
        meta = dataclasses.replace(shards[0].meta, count=int(plan["count"]), store=plan["store"])
        super().__init__(path, meta, None, np.concatenate([s.rows for s in shards]))
        self.plan, self.shards = plan, shards
        self.offsets = np.cumsum([0] + [len(s.rows) for s in shards])  # (N + 1,) each shard's first vector

    def _candidates(self, q: np.ndarray, n_cand: int, nprobe, ef_search) -> tuple[np.ndarray, np.ndarray]:
        """Every shard's ``n_cand`` best at the same nprobe, merged by the index's scores -> the ``n_cand`` best."""
        scores, ids = [], []
        for s, off in zip(self.shards, self.offsets):
            sc, i = s._candidates(q, n_cand, nprobe, ef_search)  # (M, n_cand) each
            scores.append(sc)
            ids.append(np.where(i >= 0, i + off, -1))
        sc, i = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)  # (M, N * n_cand)
        sc = np.where(i >= 0, sc, -np.inf)
        order = np.argsort(-sc, axis=1, kind="stable")[:, :n_cand]
        return np.take_along_axis(sc, order, 1), np.take_along_axis(i, order, 1)

    def _exact_vectors(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (positions over every shard) of the shards' refine.f16 files -> (n, D) float32."""
        which = np.searchsorted(self.offsets, ids, side="right") - 1  # (n,) each id's shard
        out = np.empty((len(ids), self.meta.dim), np.float32)
        for j in np.unique(which):
            at = np.flatnonzero(which == j)
            out[at] = self.shards[j]._exact_vectors(ids[at] - self.offsets[j])
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


def load_index(path: str | Path) -> VideoIndex:
    """An index folder written by `dab index`: one index, or the shards of one (``--shards``) as one."""
    p = Path(path)
    if not (p / SHARDS_FILE).is_file():
        return load_index_folder(p)
    plan = json.loads((p / SHARDS_FILE).read_text())
    if int(plan.get("format", 0)) > SHARDS_FORMAT:
        raise ConfigError(f"{p}: sharded index format {plan.get('format')}; this dab reads {SHARDS_FORMAT} or older")
    shards = []
    for i, (a, b) in enumerate(plan["ranges"]):
        folder = shard_folder(p, i)
        if not (folder / "index.json").is_file():
            raise ConfigError(
                f"{folder} is missing: build it with `dab index ... --out {p} --shards {plan['shards']} --shard {i}`"
            )
        shards.append(load_index_folder(folder))
        if shards[-1].meta.count != b - a:
            raise ConfigError(f"{folder} holds {shards[-1].meta.count} videos, the plan {b - a}: rebuild that shard")
    _check_same_build(p, plan, shards)
    return ShardedIndex(p, plan, shards)


def _check_same_build(p: Path, plan: dict, shards: list[VideoIndex]) -> None:
    """Shards of one index: the same trained file, factory, vector kind, run and search settings."""
    keys = ("factory", "vector", "dim", "per_video", "split", "refine", "terms", "nprobe", "ef_search")
    first = shards[0].meta
    for i, s in enumerate(shards):
        differ = [k for k in keys if getattr(s.meta, k) != getattr(first, k)]
        if s.meta.run.get("checkpoint_sha256") != plan["run"].get("checkpoint_sha256"):
            differ.append("run")
        if s.meta.build.get("trained_sha256") != first.build.get("trained_sha256"):
            differ.append("trained.faiss")
        if s.meta.factory != plan["factory"] or s.meta.vector != plan["vector"]:
            differ.append("the plan's factory or vector")
        if differ:
            raise ConfigError(
                f"{shard_folder(p, i)} was built otherwise than {shard_folder(p, 0)} ({', '.join(sorted(set(differ)))} "
                "differ): rebuild it with the same `dab index` options"
            )
