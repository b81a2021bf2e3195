"""The examples page of `dab evaluate` (a seeded sample of queries with thumbnails), and the store's thumbnails,
first captions and query texts it shows (``dab search --html`` shows them too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

from ...core.location import location
from ...results.page import build_queries, render_page, select_queries
from ...runs.run_folder import RunFolder
from ...store import open_store
from .config import EvaluateConfig


def store_context(
    store_path: Optional[Path], video_ids: np.ndarray, query_ids: Optional[np.ndarray] = None
) -> tuple[dict[str, Optional[bytes]], dict[str, str], dict[str, str]]:
    """From a store (when it exists): thumbnails and first captions of these videos, texts of these queries."""
    if store_path is None or not location(store_path).exists():
        return {}, {}, {}
    with open_store(store_path) as st:
        pos = {str(v): i for i, v in enumerate(st.video_ids)}
        rows = sorted({pos[str(v)] for v in video_ids if str(v) in pos})
        thumbs = dict(zip((str(st.video_ids[r]) for r in rows), st.read_thumbnails(rows)))
        text, cids = st.caption_text, st.caption_ids
        first = st.first_caption_rows()  # (N,)
        captions = {str(st.video_ids[v]): str(text[c]) for v, c in enumerate(first) if c >= 0}
        wanted = {str(q) for q in query_ids} if query_ids is not None else set()
        texts = {str(cids[c]): str(text[c]) for c in range(len(cids)) if str(cids[c]) in wanted}
    return thumbs, captions, texts


def write_examples(
    path: Path, cfg: EvaluateConfig, cm, cost: np.ndarray, gt: np.ndarray, results: dict, store_path: Optional[Path]
) -> Path:
    """examples.html: a seeded sample of queries across the margin's range, with thumbnails."""
    picks = select_queries(cost, gt, cfg.examples, seed=cfg.seed)
    videos = np.asarray(cm.video_ids)
    thumbs, captions, texts = store_context(store_path, videos, np.asarray(cm.query_ids)[picks])
    qtext = [texts.get(str(q), str(q)) for q in np.asarray(cm.query_ids)]
    queries = build_queries(cost, picks, qtext, videos, gt=gt, thumbs=thumbs, captions=captions, plots=cfg.plots)
    run = results.get("run", {})
    t2v = results["t2v"]
    summary = [
        ("source", results["source"]),
        ("variant", str(run.get("variant", "-"))),
        ("recipe", _recipe_of(cfg)),
        ("queries x videos", f"{results['queries']} x {results['videos']}"),
        ("text-to-video", f"R@1 {t2v['R@1']:.1f}, R@5 {t2v['R@5']:.1f}, R@10 {t2v['R@10']:.1f}, MnR {t2v['MnR']:.1f}"),
        ("shown", f"{len(picks)} queries across the margin's range (seed {cfg.seed}), failures included"),
        ("thumbnails", "from " + str(store_path) if any(thumbs.values()) else "none in the store"),
    ]
    return render_page(
        path, f"dab examples: {Path(cfg.run).name if cfg.run else Path(results['source']).name}", summary, queries
    )


def _recipe_of(cfg: EvaluateConfig) -> str:
    if cfg.run is None or not RunFolder(cfg.run).is_run():
        return "-"
    return str(json.loads(RunFolder(cfg.run).config_path.read_text()).get("recipe") or "(none: the defaults)")
