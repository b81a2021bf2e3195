"""Claim-aware evaluation of runs on the procedural world (docs/quality.md, "Claim-aware evaluation").

Every caption of every video of a split is a query (the world's ``captions_all.csv``), and
its relevant videos are every video of the split its claim is true of
(``world.satisfies``), not only the one it was written for. Per query: AP, nDCG@10, P@1
(the best video is relevant), R@1 against the source video, the KL (cost) margin and,
for Gaussian runs, the text sigma^2. :func:`claim_table` aggregates rows of runs over
seeds, per caption level, with the claim-aware AURC, the variance calibration and paired
bootstrap intervals against a reference row.

The queries live in an *eval store*: the val and test videos of the world with all their
captions, extracted once like the training store (``store-<world>-eval.h5``).
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from dab_pipeline import metrics as M
from dab_pipeline.stages.extract import ExtractConfig, run_extract
from dab_pipeline.store import open_store
from dab_pipeline.world import LEVELS, caption_claims, load_world, relevance_matrix, world_videos

PER_QUERY = ("AP", "nDCG@10", "P@1", "R@1 source")


def log(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the eval store and its truth


def eval_store(world_root: Path, out: Path, workers: int, trainable_blocks: Optional[int] = None) -> Path:
    """The val and test videos of a world with every caption, extracted with dab-world (reused when complete)."""
    rows_file = world_root / "captions_eval.csv"
    with open(world_root / "captions_all.csv", newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["split"] in ("val", "test")]
    text = "video_id,video,caption,split,level\n"  # the world's columns, val and test rows only
    if not rows_file.is_file() or rows_file.stat().st_size == 0:
        with open(rows_file, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=text.strip().split(","))
            w.writeheader()
            w.writerows(rows)
    t0 = time.time()
    res = run_extract(
        ExtractConfig(
            dataset="folder",
            videos=world_root / "videos",
            annotations=rows_file,
            model="dab-world",
            pretrained=None,
            out=out,
            trainable_blocks=trainable_blocks,
            workers=workers,
        )
    )
    log(
        f"eval store {out.name}: {res.videos_ok} encoded, {res.videos_skipped} already there "
        f"({time.time() - t0:.0f} s, {len(rows)} captions)"
    )
    return out


@dataclass
class Truth:
    """A split of an eval store against the world's claims."""

    levels: np.ndarray  # (Q,) caption level of each query
    relevant: np.ndarray  # (Q, V) bool
    source: np.ndarray  # (Q,) index of the video each caption was written for

    @property
    def n_relevant(self) -> np.ndarray:
        return self.relevant.sum(axis=1)


def truth(world_root: Path, store: Path, split: str) -> Truth:
    """Levels, relevance and source videos of ``split``'s captions (cached beside the store)."""
    cache = store.with_name(f"{store.stem}-{split}-truth.npz")
    if cache.is_file() and cache.stat().st_mtime >= store.stat().st_mtime:
        z = np.load(cache)
        return Truth(levels=z["levels"], relevant=z["relevant"], source=z["source"])
    meta = load_world(world_root)
    videos = world_videos(meta)
    with open_store(store) as st:
        sp = st.load_split(split)
        vids = [str(v) for v in sp.video_ids]
        cap_video = np.asarray(sp.caption_video, np.int64)
        texts = [str(st.caption_text[i]) for i in _caption_rows(st, sp)]
    claims, levels = caption_claims(meta, [vids[v] for v in cap_video], texts)
    t = Truth(levels=np.asarray(levels), relevant=relevance_matrix(claims, [videos[v] for v in vids]), source=cap_video)
    np.savez_compressed(cache, levels=t.levels, relevant=t.relevant, source=t.source)
    return t


def _caption_rows(st, sp) -> np.ndarray:
    """Store-wide caption rows of a split's captions, in the split's order."""
    pos = {str(c): i for i, c in enumerate(st.caption_ids)}
    return np.asarray([pos[str(c)] for c in sp.caption_ids], np.int64)


# --------------------------------------------------------------------------- per-query results of one run


def score_run(run_dir: Optional[Path], store: Path, split: str) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """The (Q, V) costs of a run on a split of the eval store, and its text sigma^2 (Q,) for Gaussian runs.

    ``run_dir`` None: zero-shot (negative cosine of the text and the mean of the frames).
    """
    from dab_pipeline.runs.inputs import SplitArrays, score_inputs
    from dab_pipeline.runs.load import load_run
    from dab_pipeline.scoring import score_all

    with open_store(store) as st:
        if run_dir is None:
            sp = st.load_split(split)
            frames = torch.as_tensor(np.asarray(sp.frames, np.float32))
            mask = torch.as_tensor(np.asarray(sp.frame_mask)).float()[..., None]
            video = torch.nn.functional.normalize((frames * mask).sum(1) / mask.sum(1).clamp_min(1), dim=-1)
            text = torch.nn.functional.normalize(torch.as_tensor(np.asarray(sp.text, np.float32)), dim=-1)
            return -(text @ video.T).numpy(), None
        run = load_run(run_dir, heads=True)
        tuned = run.heads is not None
        feats = SplitArrays(st.load_split(split, with_states=tuned), torch.device("cpu"), with_states=tuned)
    with torch.no_grad():
        text, frames = score_inputs(run.heads, feats, torch.device("cpu"), 0, feats.num_queries)
        cost = score_all(run.model, text, frames, feats.mask, dtype=run.config.score_dtype).cost
        var = None
        if run.model.cfg.probabilistic:
            var = run.model.encode_text(text).logvar.exp().mean(dim=-1).numpy()  # (Q,)
    return cost, var


def run_queries(run_dir: Optional[Path], store: Path, split: str, t: Truth, cache_dir: Path) -> dict[str, np.ndarray]:
    """Per-query claim-aware results of a run (cached in ``cache_dir`` as claims-<split>.npz)."""
    cache = cache_dir / f"claims-{split}.npz"
    if cache.is_file():
        return dict(np.load(cache))
    t0 = time.time()
    cost, var = score_run(run_dir, store, split)
    rel = M.relevance_metrics(cost, t.relevant, k=10)
    out = {
        "AP": rel["AP"],
        "nDCG@10": rel["nDCG@10"],
        "P@1": rel["P@1"],
        "R@1 source": (M.t2v_ranks(cost, t.source) == 1).astype(np.float64),
        "margin": M.kl_margin(cost),
    }
    if var is not None:
        out["text_var"] = var
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(cache, **out)
    log(f"  claims on {split}: {cost.shape[0]} x {cost.shape[1]} pairs scored in {time.time() - t0:.0f} s")
    return out


# --------------------------------------------------------------------------- the table


def claim_row(per_seed: list[dict[str, np.ndarray]], t: Truth) -> dict[str, Any]:
    """Mean +- std over seeds of every claim-aware number of one row."""

    def agg(values: list[float]) -> dict[str, Any]:
        return {
            "mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "values": [float(v) for v in values],
        }

    row: dict[str, Any] = {}
    for name in PER_QUERY:
        row[name] = agg([100 * r[name].mean() for r in per_seed])
        for level in LEVELS:
            sel = t.levels == level
            if sel.any():
                row[f"{name} {level}"] = agg([100 * r[name][sel].mean() for r in per_seed])
    row["AURC"] = agg([M.aurc(r["margin"], r["P@1"]) for r in per_seed])
    row["AURC random"] = agg([M.aurc_random(r["P@1"]) for r in per_seed])
    if all("text_var" in r for r in per_seed):
        row["var calibration"] = agg([M.spearman(r["text_var"], np.log(t.n_relevant)) for r in per_seed])
    return row


def bootstrap_rows(
    per_query: dict[str, list[dict[str, np.ndarray]]], reference: str, metrics=("AP", "nDCG@10", "P@1"), seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Each row's difference to ``reference`` with a paired bootstrap 95 % interval over queries (seeds pooled)."""
    out: dict[str, dict[str, Any]] = {}
    ref = per_query.get(reference)
    if ref is None:
        return out
    for name, runs in per_query.items():
        if name == reference:
            continue
        out[name] = {
            m: M.paired_bootstrap(100 * np.stack([r[m] for r in runs]), 100 * np.stack([r[m] for r in ref]), seed=seed)
            for m in metrics
        }
    return out


CLAIM_COLUMNS = [
    "mAP",
    "mAP video",
    "mAP shot",
    "mAP object",
    "mAP generic",
    "nDCG@10",
    "P@1",
    "R@1 source",
    "AURC",
    "AURC random",
    "var calibration",
]
_SOURCE = {
    "mAP": "AP",
    "mAP video": "AP video",
    "mAP shot": "AP shot",
    "mAP object": "AP object",
    "mAP generic": "AP generic",
}


def claim_markdown(rows: dict[str, dict[str, Any]], boot: dict[str, dict[str, Any]], reference: str) -> str:
    """The claim-aware table, then one line per row: its difference to the reference with the interval."""
    lines = ["| variant | " + " | ".join(CLAIM_COLUMNS) + " |", "| --- |" + " ---: |" * len(CLAIM_COLUMNS)]
    for name, row in rows.items():
        cells = []
        for col in CLAIM_COLUMNS:
            agg = row.get(_SOURCE.get(col, col))
            if agg is None:
                cells.append("-")
                continue
            digits = 3 if col.startswith(("AURC", "var")) else 1
            m, s, n = agg["mean"], agg["std"], len(agg["values"])
            if m != m:  # NaN: a Spearman correlation with a constant variance
                cells.append("n/a (constant)")
                continue
            cells.append(f"{m:.{digits}f}" if n == 1 else f"{m:.{digits}f} ± {s:.{digits}f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if boot:
        lines += [
            "",
            f"Differences to `{reference}` (points; paired bootstrap 95 % interval over queries, seeds "
            "pooled; * = the interval excludes 0):",
            "",
        ]
        lines += [
            "| variant | " + " | ".join(f"{m} - {reference}" for m in ("mAP", "nDCG@10", "P@1")) + " |",
            "| --- | ---: | ---: | ---: |",
        ]
        for name, per_metric in boot.items():
            cells = [
                f"{b['diff']:+.1f} [{b['low']:+.1f}, {b['high']:+.1f}]{' *' if b['excludes_zero'] else ''}"
                for b in (per_metric["AP"], per_metric["nDCG@10"], per_metric["P@1"])
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        outside = [
            f"{n} ({m if m != 'AP' else 'mAP'} {b['diff']:+.1f})"
            for n, pm in boot.items()
            for m, b in pm.items()
            if b["excludes_zero"]
        ]
        lines += [
            "",
            "Outside the noise: "
            + (", ".join(outside) if outside else f"no difference to `{reference}` is outside the bootstrap interval")
            + ".",
        ]
    return "\n".join(lines)


def save_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")
