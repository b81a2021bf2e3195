"""An index whose shards are served by other processes or machines (``dab serve --ray``: a deployment a shard).

:class:`ShardService` is what serves one shard: its index folder loaded, answering a batch of queries with its
candidates and, for an approximate index, their exact scores. :class:`ServedShardedIndex` is the
:class:`~dab_pipeline.index.shards.ShardedIndex` whose shards answer through a ``call`` (any transport: Ray Serve
handles, or plain objects in a test), merged as the one-process index merges them, so a search gives the same
shortlist. One difference, for speed: each shard re-scores its own candidates exactly (in parallel, where they are)
and the merge keeps those scores for the candidates that survive it; a candidate's exact score is the same number
wherever it is computed (:meth:`VideoIndex.exact_scores`, one row at a time), so the refined shortlist is too.

Nothing here imports Ray: the transport is the caller's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ..core.errors import ConfigError, StoreError
from ..core.filewatch import FileWatch
from .faiss_index import IndexMeta, VideoIndex
from .load import check_shards, load_index_folder
from .shards import ShardedIndex, merge_candidates, read_plan, shard_folder

__all__ = ["ShardCall", "ShardService", "ServedShardedIndex", "describe_folders", "shard_folders", "shard_identity"]

# (method, {shard: args}) -> {shard: its answer}: the shards asked together, answering in parallel where they can
ShardCall = Callable[[str, dict[int, tuple]], dict[int, Any]]


def shard_folders(path: str | Path) -> list[Path]:
    """The index folders a served index is made of: each shard's of a sharded index, else the folder itself."""
    plan = read_plan(Path(path))
    return [Path(path)] if plan is None else [shard_folder(Path(path), i) for i in range(int(plan["shards"]))]


def describe_folders(path: str | Path) -> list[dict]:
    """Each shard's :meth:`ShardService.describe`, read from its folder without loading its FAISS index: what a
    driver checks the run and the store against before it starts the services."""
    out = []
    for folder in shard_folders(path):
        meta_path = folder / "index.json"
        if not meta_path.is_file():
            raise ConfigError(f"{folder} is not a dab index folder (no index.json); build one with `dab index`")
        try:
            meta = IndexMeta.from_json(json.loads(meta_path.read_text()), meta_path).to_json()  # as describe() has it
            rows = np.load(folder / "rows.npy")
        except (OSError, ValueError, EOFError) as exc:
            why = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"{folder}: cannot read the index ({why})") from None
        out.append({"meta": meta, "rows": rows, "folder": str(folder)})
    return out


def shard_identity(described: dict) -> dict:
    """A shard build's identity from its :meth:`ShardService.describe`: its index.json and its rows' sha256."""
    rows = np.ascontiguousarray(described["rows"])
    return {"meta": described["meta"], "rows_sha256": hashlib.sha256(rows.tobytes()).hexdigest()}


class ShardService:
    """One shard, loaded: its candidates for a batch of queries. Its files are checked before each answer: a shard
    whose files changed since it was loaded answers a StoreError (the server then says 503), not old vectors."""

    def __init__(self, folder: str | Path, expect: Optional[dict] = None) -> None:
        self.index = load_index_folder(folder)
        self.watch = FileWatch(self.index.identity_files())
        if expect is not None and shard_identity(self.describe()) != expect:
            # a replica (re)started after the folder was rebuilt: its ids would map to rows the merging side
            # no longer holds
            self.index.close()
            raise StoreError(f"{folder} changed since the server started (rebuilt?); restart the server")

    def describe(self) -> dict:
        """What the merging side needs: the shard's index.json and its vectors' store rows."""
        return {"meta": self.index.meta.to_json(), "rows": self.index.rows, "folder": str(self.index.path)}

    def candidates(
        self, q: np.ndarray, n_cand: int, nprobe: Optional[int], ef_search: Optional[int], exact: bool
    ) -> tuple[np.ndarray, ...]:
        """q (M, D) -> scores, ids (local to the shard) and, with ``exact``, the candidates' exact scores, each
        (M, n_cand), best first by the index's scores (-1 ids, -inf scores where the shard holds fewer)."""
        self._check()
        q = np.ascontiguousarray(q, np.float32)  # (M, D): the exact scores of the same numbers the index searched
        sc, ids = self.index.candidates(q, n_cand, nprobe, ef_search)
        if not exact:
            return sc, ids
        out = np.full(ids.shape, -np.inf, np.float32)  # (M, n_cand)
        for m in range(len(q)):
            valid = ids[m] >= 0
            cand = np.unique(ids[m][valid])  # sorted: the reads go forward through the file
            out[m, valid] = self.index.exact_scores(q[m], cand)[np.searchsorted(cand, ids[m][valid])]
        return sc, ids, out

    def video_terms(self, store_rows: np.ndarray) -> Optional[np.ndarray]:
        self._check()
        return self.index.video_terms(np.asarray(store_rows))

    def _check(self) -> None:
        change = self.watch.changed()
        if change is not None:
            raise StoreError(f"{change} (index shard {self.index.path})")

    def close(self) -> None:
        self.index.close()


class ServedShardedIndex(ShardedIndex):
    """A sharded (or a one-folder) index searched through its shards' services: the same shortlists as
    :func:`~dab_pipeline.index.load_index` gives in one process. ``described``: each shard's
    :meth:`ShardService.describe`; ``call`` asks them."""

    def __init__(self, path: str | Path, described: list[dict], call: ShardCall, plan: Optional[dict] = None) -> None:
        path = Path(path)  # plan: shards.json's, where this machine cannot read the index folder
        shards = [
            VideoIndex(Path(d["folder"]), IndexMeta.from_json(dict(d["meta"]), Path(d["folder"])), None, d["rows"])
            for d in described
        ]
        plan = plan or read_plan(path)
        if plan is not None:  # a sharded folder: its shards checked against its plan, as load_index checks them
            check_shards(path, plan, shards)
        else:
            plan = {"count": shards[0].meta.count, "store": shards[0].meta.store, "shards": 1}
        super().__init__(path, plan, shards)
        self.call = call

    def _best_vectors(
        self, q: np.ndarray, n_cand: int, refine_to: int, nprobe: Optional[int], ef_search: Optional[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        args = (q, n_cand, nprobe, ef_search, bool(refine_to))
        found = self.call("candidates", {i: args for i in range(len(self.shards))})
        if len(self.shards) == 1:  # one index: its own order, as the one-process index keeps it
            sc, ids, *rest = found[0]
        else:
            sc, ids, rest = merge_candidates([found[i] for i in range(len(self.shards))], self.offsets, n_cand)
        if not refine_to:
            return sc, ids
        return _refine_with(ids, rest[0], refine_to)

    def video_terms(self, store_rows: np.ndarray) -> Optional[np.ndarray]:
        if not self.meta.terms:
            return None
        store_rows = np.asarray(store_rows)
        out = np.empty((len(store_rows), self.meta.dim), np.float16)
        starts = [s.video_rows[0] for s in self.shards[1:]]
        which = np.searchsorted(starts, store_rows, side="right")  # (n,) the shard whose range holds each row
        asked = {int(j): (store_rows[which == j],) for j in np.unique(which)}
        for j, terms in self.call("video_terms", asked).items():
            out[which == j] = terms
        return out

    def identity_files(self) -> list[Path]:
        return []  # each shard's service watches its own files

    def close(self) -> None:
        pass  # the services own the files


def _refine_with(ids: np.ndarray, exact: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`VideoIndex._refined` given the candidates' exact scores: each query's ``want`` best by them, ties by
    the lower position (the order the one-process index re-scores them in) -> (scores, positions), (M, want)."""
    out_s = np.full((len(ids), want), -np.inf, np.float32)
    out_i = np.full((len(ids), want), -1, np.int64)
    for m in range(len(ids)):
        valid = ids[m] >= 0
        order = np.argsort(ids[m][valid], kind="stable")
        cand, ex = ids[m][valid][order], exact[m][valid][order]  # sorted by position, as np.unique gives them
        top = np.argsort(-ex, kind="stable")[:want]
        out_s[m, : len(top)], out_i[m, : len(top)] = ex[top], cand[top]
    return out_s, out_i
