"""``dab index``: a FAISS first stage over one vector per video of a store's split.

Writes the index folder (see :mod:`dab_pipeline.index`) with the resolved config
beside it (``config.json``); ``dab search --index`` and ``dab serve --index`` read it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from ..core.errors import ConfigError
from ..core.events import ProgressCallback, null_progress
from ..core.fsutil import atomic_write_text, sha256_file
from ..index import DEFAULT_VECTOR, VECTOR_KINDS, IndexMeta, build_index, build_sharded_index
from ..index.shards import read_plan, shard_folder
from ..runs.load import load_run
from ..scoring import Scorer
from ..store import open_store

__all__ = ["IndexConfig", "run_index"]


@dataclass(frozen=True)
class IndexConfig:
    """What ``dab index`` builds: ``vector`` (a name of :data:`VECTOR_KINDS`), ``factory`` ("auto" or a FAISS
    factory string), search defaults ``nprobe`` (IVF) and ``ef_search`` (HNSW), ``refine`` (quantised
    factories: candidates re-scored on exact float16 vectors, x K x S; 0 off), ``video_terms`` (keep the run's
    token-branch term of each video for the re-rank; needs ``run``)."""

    features: Path
    out: Path
    run: Optional[Path] = None
    split: str = "test"
    vector: str = DEFAULT_VECTOR
    factory: str = "auto"
    chunk: int = 4096
    nprobe: int = 32
    ef_search: int = 64
    refine: int = 4
    video_terms: bool = False
    overwrite: bool = False
    shards: int = 1  # >1: that many indexes over disjoint video ranges, searched as one (index.shards)
    shard: Optional[int] = None  # build only this shard (0-based) of ``shards``

    def __post_init__(self) -> None:
        VECTOR_KINDS.get(self.vector)  # an unknown name lists the valid ones
        for name in ("chunk", "nprobe", "ef_search"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if int(self.refine) < 0:
            raise ConfigError(f"refine must be 0 (off) or a positive integer, got {self.refine}")
        if int(self.shards) < 1:
            raise ConfigError(f"shards must be a positive integer, got {self.shards}")
        if self.shard is not None and not 0 <= int(self.shard) < int(self.shards):
            raise ConfigError(
                f"shard must be between 0 and {int(self.shards) - 1} (of {self.shards} shards), got {self.shard}"
            )


def run_index(cfg: IndexConfig, progress: ProgressCallback = null_progress) -> IndexMeta:
    """Build the index of ``cfg``; returns its metadata (index.json)."""
    model, run = None, None
    if cfg.run is not None:
        loaded = load_run(cfg.run, "cpu")
        model = loaded.model
        run = {"path": str(loaded.run_dir), "checkpoint_sha256": sha256_file(loaded.checkpoint)}
        if cfg.video_terms and model.token_unc is not None and not Scorer(model).takes_video_terms():
            raise ConfigError(
                f"--video-terms: {loaded.run_dir}'s model (variant {model.cfg.variant!r}, covariance "
                f"{model.cfg.covariance!r}) is re-ranked by its own path, which computes the terms itself and would "
                "never read them; build the index without --video-terms"
            )
    with open_store(cfg.features) as store:
        store.require_complete("dab index")
        if model is not None and store.dim != model.cfg.embed_dim:
            raise ConfigError(
                f"{cfg.features} holds D={store.dim} features but the run's model has embed_dim={model.cfg.embed_dim}"
            )
        options = dict(
            split=cfg.split, vector=cfg.vector, model=model, run=run, factory=cfg.factory, chunk=cfg.chunk,
            nprobe=cfg.nprobe, ef_search=cfg.ef_search, refine=cfg.refine, terms=cfg.video_terms,
            overwrite=cfg.overwrite, progress=progress,
        )  # fmt: skip
        if cfg.shards == 1 and cfg.shard is None:
            meta = build_index(store, cfg.out, **options)
        else:
            build_sharded_index(store, cfg.out, shards=cfg.shards, shard=cfg.shard, **options)
            meta = _sharded_meta(Path(cfg.out), cfg.shard)
    atomic_write_text(Path(cfg.out) / "config.json", json.dumps(asdict(cfg), indent=2, default=str))
    return meta


def _sharded_meta(out: Path, shard: Optional[int]) -> IndexMeta:
    """What a sharded build reports (read from the index.json files, no index loaded): the whole index's metadata
    once every shard is built, else the built shard's."""
    plan = read_plan(out)
    assert plan is not None  # build_sharded_index wrote it
    metas = [shard_folder(out, i) / "index.json" for i in range(plan["shards"])]
    if all(m.is_file() for m in metas):
        each = [IndexMeta.from_json(json.loads(m.read_text()), m) for m in metas]
        build = {"seconds": round(sum(m.build.get("seconds", 0.0) for m in each), 3), "shards": len(each)}
        return dataclasses.replace(each[0], count=plan["count"], store=plan["store"], build=build)
    assert shard is not None  # a build of every shard leaves every index.json
    return IndexMeta.from_json(json.loads(metas[shard].read_text()), metas[shard])
