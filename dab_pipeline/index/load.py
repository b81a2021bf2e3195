"""Loading an index folder written by `dab index`: one index (:func:`load_index_folder`: its files checked against
its index.json), or a sharded one's shards (:func:`load_index`: each checked against shards.json) as one index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError
from .faiss_index import REFINE_FILE, TERMS_FILE, IndexMeta, VideoIndex, require_faiss
from .shards import SHARDS_FILE, ShardedIndex, read_plan, shard_folder

__all__ = ["check_shards", "load_index", "load_index_folder"]


def load_index(path: str | Path) -> VideoIndex:
    """An index folder written by `dab index`: one index, or the shards of one (``--shards``) as one."""
    p = Path(path)
    plan = read_plan(p)
    if plan is None:
        return load_index_folder(p)
    shards = []
    for i, (a, b) in enumerate(plan["ranges"]):
        folder = shard_folder(p, i)
        again = f"`dab index ... --out {p} --shards {plan['shards']} --shard {i}`"
        if not (folder / "index.json").is_file():
            raise ConfigError(f"{folder} is missing: build it with {again}")
        try:
            shards.append(load_index_folder(folder))
        except ConfigError as exc:
            raise ConfigError(
                f"{str(exc).split('; rebuild')[0]}; rebuild that shard with {again[:-1]} --overwrite`"
            ) from None
    check_shards(p, plan, shards)
    return ShardedIndex(p, plan, shards)


def check_shards(p: Path, plan: dict, shards: list[VideoIndex]) -> None:
    """Every shard of the plan there, over its range, and built as the plan says (ConfigError naming the shard)."""
    if len(shards) != len(plan["ranges"]):
        raise ConfigError(f"{p}: {len(shards)} shards, {p / SHARDS_FILE} says {len(plan['ranges'])}")
    for i, ((a, b), s) in enumerate(zip(plan["ranges"], shards)):
        if s.meta.count != b - a:
            raise ConfigError(
                f"{shard_folder(p, i)} holds {s.meta.count} videos, the plan {b - a}: rebuild it with "
                f"`dab index ... --out {p} --shards {plan['shards']} --shard {i}`"
            )
    _check_same_build(p, plan, shards)


def _check_same_build(p: Path, plan: dict, shards: list[VideoIndex]) -> None:
    """Every shard built as the plan says: its trained file, factory, vector kind, run and search settings."""
    want = {"factory": plan["factory"], "vector": plan["vector"], "split": plan["split"], **plan.get("settings", {})}
    for i, s in enumerate(shards):
        differ = [k for k, v in want.items() if getattr(s.meta, k) != v]
        if s.meta.run.get("checkpoint_sha256") != (plan.get("run") or {}).get("checkpoint_sha256"):
            differ.append("run")
        if s.meta.build.get("trained_sha256") != plan.get("trained_sha256"):
            differ.append("trained.faiss")
        if differ:
            raise ConfigError(
                f"{shard_folder(p, i)} was built otherwise than {p / SHARDS_FILE} says ({', '.join(sorted(set(differ)))} "
                f"differ): rebuild it with `dab index ... --out {p} --shards {plan['shards']} --shard {i} --overwrite`"
            )


def load_index_folder(path: str | Path) -> VideoIndex:
    """Read one index folder written by :func:`dab_pipeline.index.build.build_index` (a sharded index's shards are
    such folders; :func:`load_index` reads either)."""
    faiss = require_faiss()
    p = Path(path)
    meta_path = p / "index.json"
    if not meta_path.is_file():
        raise ConfigError(f"{p} is not a dab index folder (no index.json); build one with `dab index`")
    try:
        meta = IndexMeta.from_json(json.loads(meta_path.read_text()), meta_path)
        rows = np.load(p / "rows.npy")
        index = faiss.read_index(str(p / "index.faiss"))
    except (OSError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{p}: cannot read the index ({str(exc).strip().splitlines()[-1]})") from None
    if index.ntotal != meta.count * meta.per_video or len(rows) != index.ntotal:
        raise ConfigError(
            f"{p}: damaged index ({index.ntotal} vectors, {len(rows)} rows, index.json says "
            f"{meta.count}); rebuild it with `dab index ... --overwrite`"
        )
    want = index.ntotal * meta.dim * 2
    have = (p / REFINE_FILE).stat().st_size if (p / REFINE_FILE).is_file() else None
    if meta.refine and have != want:
        raise ConfigError(
            f"{p}: damaged index ({REFINE_FILE} is {'missing' if have is None else f'{have:,} bytes'}, "
            f"expected {want:,}); rebuild it with `dab index ... --overwrite`, or set refine to 0 "
            "in index.json to search the codes alone"
        )
    have = (p / TERMS_FILE).stat().st_size if (p / TERMS_FILE).is_file() else None
    if meta.terms and have != meta.count * meta.dim * 2:
        raise ConfigError(
            f"{p}: damaged index ({TERMS_FILE} is {'missing' if have is None else f'{have:,} bytes'}, expected "
            f"{meta.count * meta.dim * 2:,}); rebuild it with `dab index ... --video-terms --overwrite`"
        )
    return VideoIndex(p, meta, index, rows)
