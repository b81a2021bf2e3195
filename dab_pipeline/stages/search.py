"""Free-text search of a feature store's videos with a trained run (``dab search``).

The query is encoded with the store's own CLIP (the model and weights named in
its manifest, so the query lands in the same feature space as the stored
captions), then scored against every video of one split with the run's best
checkpoint through :func:`dab_pipeline.scoring.score_all`, the same engine that
validation and ``dab train``'s test costs use.

Only runs trained on frozen CLIP features are supported: a run fine-tuned with
``trainable_blocks=K`` would need the query through its fine-tuned text head and
the frames through its vision head, and is refused with a :class:`ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from ..clip_models import check_store_weights, encode_texts, load_clip
from ..core.errors import ConfigError, StoreError, TrainingError, UnknownNameError, WeightsError
from ..model import DABModel
from ..runs.run_folder import RunFolder
from ..runtime.capabilities import resolve_score_dtype
from ..runtime.devices import resolve_device
from ..scoring import score_all
from ..store import open_store
from .train import TrainConfig, TrainHeads

__all__ = ["SearchHit", "SearchResult", "LoadedRun", "load_run", "encode_queries", "search", "load_descriptions"]


@dataclass(frozen=True)
class SearchHit:
    """One retrieved video."""

    rank: int  # 1-based
    video_index: int  # row of the video in the split
    video_id: str
    cost: float  # lower is better (KL / W2 for prob/dab, -cos for xpool/bridge)


@dataclass
class SearchResult:
    """A query's ranked videos and its confidence."""

    query: str
    hits: list[SearchHit]
    # best-vs-second-best cost gap over the whole split (the paper's top-1/top-2 KL
    # margin for KL runs); larger is more confident; None with fewer than 2 videos
    margin: Optional[float]
    # every video's cost for this query (V,) and the split's video ids, for result pages; may be
    # +inf outside a shortlist
    costs: Optional[np.ndarray] = None
    video_ids: Optional[np.ndarray] = None


@dataclass
class LoadedRun:
    """A run folder's configuration and its model with the checkpoint's weights (eval mode)."""

    run_dir: Path
    config: "object"  # the run's TrainConfig (stages/train.py), loaded lazily: importing search stays cheap
    model: DABModel
    checkpoint: Path
    heads: Optional[torch.nn.Module] = None  # the fine-tuned CLIP blocks (load_run(..., heads=True))


def load_run(run_dir: str | Path, device: str | torch.device = "cpu", checkpoint: str = "best.pt",
             heads: bool = False) -> LoadedRun:
    """Read ``run_dir/config.json`` and ``run_dir/checkpoints/<checkpoint>`` into an eval-mode model.

    ``heads``: also load a fine-tuned run's CLIP blocks (its store's CLIP weights must be
    available); without it a fine-tuned run is refused.
    Raises :class:`ConfigError` for a folder that is not a run or a fine-tuned run,
    :class:`TrainingError` when the checkpoint is missing or does not fit the config.
    """
    folder = RunFolder(run_dir)
    run = folder.path
    cfg = folder.load_config(TrainConfig)
    ck_path = folder.checkpoint(checkpoint)
    ck = folder.load_checkpoint(checkpoint)
    if ck is None:
        raise TrainingError(f"{ck_path} does not exist: the run has no {checkpoint} checkpoint yet (did it finish an epoch?)")
    tuned = cfg.trainable_blocks is not None or ck.get("heads") is not None
    if tuned and not heads:
        raise ConfigError(
            f"{run} fine-tunes the last {cfg.trainable_blocks} CLIP blocks; dab search supports runs on frozen "
            "CLIP features only (the query would need the run's fine-tuned text head and the frames its vision head)"
        )
    model = DABModel(cfg.model)
    try:
        model.load_state_dict(ck["model"])
    except (KeyError, RuntimeError) as exc:
        raise TrainingError(f"{ck_path} does not fit the run's model config: {str(exc).splitlines()[0]}") from None
    model.eval()
    model.to(device)
    loaded = LoadedRun(run_dir=run, config=cfg, model=model, checkpoint=ck_path)
    if tuned:
        with open_store(cfg.features) as st:
            manifest = st.manifest
        loaded.heads = TrainHeads(manifest, cfg.trainable_blocks, torch.device(device))
        loaded.heads.load_state_dict(ck["heads"])
        loaded.heads.to(device).eval()
    return loaded


def encode_queries(manifest: dict, queries: Sequence[str], device: str | torch.device = "cpu") -> torch.Tensor:
    """Encode free-text queries with the CLIP model and weights the store was built with -> (M, D) float32.

    Raises :class:`WeightsError` (one line) when those weights are not available here
    or differ from the ones the store recorded.
    """
    name, pretrained = manifest.get("model"), manifest.get("pretrained")
    if not name:
        raise StoreError("the store's manifest names no CLIP model; cannot encode a query in its feature space")
    try:
        bundle = load_clip(name, pretrained, device=device, dtype="float32")
    except (WeightsError, UnknownNameError) as exc:
        raise WeightsError(
            f"dab search encodes the query with the store's CLIP model {name} (pretrained={pretrained!r}) and needs "
            f"its weights, which are not available here: {exc}"
        ) from None
    check_store_weights(bundle, manifest, "a query encoded with them would not match the stored features")
    return encode_texts(bundle, list(queries)).features.float()  # (M, D)


def search(
    run_dir: str | Path,
    store_path: str | Path,
    queries: Sequence[str],
    topk: int = 10,
    split: str = "test",
    device: str = "auto",
    *,
    dtype: str = "float32",
    shortlist: Optional[int] = None,
    memory_budget: Optional[int] = None,
    warn: Callable[[str], None] = lambda message: None,
) -> list[SearchResult]:
    """The ``topk`` videos of ``split`` for each free-text query, best first, with each query's margin.

    ``shortlist`` and ``memory_budget`` are passed to :func:`~dab_pipeline.scoring.score_all`;
    ``dtype`` (``float32``: exact, the default; ``bfloat16``; ``auto``) is resolved for the
    device first (:func:`dab_pipeline.runtime.capabilities.resolve_score_dtype`): bf16 asked where it
    is not native runs in float32 and ``warn`` gets the reason.
    """
    queries = [str(q) for q in queries]
    if not queries or any(not q.strip() for q in queries):
        raise ConfigError("dab search needs at least one non-empty query")
    if topk < 1:
        raise ConfigError(f"topk must be a positive integer, got {topk}")
    dev = resolve_device(device)
    choice = resolve_score_dtype(dtype, dev)
    if choice.warning:
        warn(choice.warning)
    dtype = choice.dtype
    with open_store(store_path) as store:  # the store first: an incomplete one is refused before a model loads
        store.require_complete("dab search")
    run = load_run(run_dir, dev)
    with open_store(store_path) as store:
        manifest = store.manifest
        feats = store.load_split(split)
    n_v = len(feats.video_ids)
    if n_v == 0:
        raise StoreError(f"{store_path}: split {split!r} has no encoded videos to search")
    d = run.model.cfg.embed_dim
    if feats.frames.shape[2] != d:
        raise ConfigError(f"{store_path} holds D={feats.frames.shape[2]} features but the run's model has embed_dim={d}")
    text = encode_queries(manifest, queries, dev)  # (M, D)
    res = score_all(run.model, text, feats.frames, feats.frame_mask, device=dev, dtype=dtype,
                    topk=min(max(topk, 2), n_v), shortlist=shortlist, memory_budget=memory_budget)
    assert res.topk_indices is not None and res.topk_costs is not None
    out = []
    for i, q in enumerate(queries):
        idx, costs = res.topk_indices[i], res.topk_costs[i]
        margin = float(costs[1] - costs[0]) if n_v >= 2 and np.isfinite(costs[:2]).all() else None
        hits = [SearchHit(rank=r + 1, video_index=int(j), video_id=str(feats.video_ids[j]), cost=float(c))
                for r, (j, c) in enumerate(zip(idx[:topk], costs[:topk]))]
        row = np.asarray(res.cost[i], np.float32) if res.cost is not None else None
        out.append(SearchResult(query=q, hits=hits, margin=margin, costs=row, video_ids=feats.video_ids))
    return out


def load_descriptions(path: str | Path) -> dict[str, str]:
    """Per-video descriptions to show beside search hits: JSON ``{video_id: text}`` or a CSV with
    columns ``video_id`` and ``description``."""
    import csv
    import json

    p = Path(path)
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(p.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ConfigError(f"{p}: expected a JSON object {{video_id: description}}")
            return {str(k): str(v) for k, v in data.items()}
        with open(p, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read descriptions {p}: {exc}") from None
    if rows and not {"video_id", "description"} <= set(rows[0]):
        raise ConfigError(f"{p}: a descriptions CSV needs the columns video_id and description")
    return {r["video_id"]: r["description"] for r in rows}
