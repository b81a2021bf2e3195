"""Claim-aware evaluation of runs on the procedural world (docs/quality.md, "Claim-aware evaluation").

Every caption of every video of a split is a query (the world's ``captions_all.csv``), and
its relevant videos are every video of the split its claim is true of
(``world.satisfies``), not only the one it was written for. Per query: AP, nDCG@10, P@1
(the best video is relevant), R@1 against the source video, the KL (cost) margin and,
for Gaussian runs, the text sigma^2 and log det Sigma_t (and, for low-rank runs, whether
U spans the ambiguity of the generic captions: :func:`u_span`). :func:`claim_row`
aggregates runs over seeds, per caption level, with the claim-aware AURC, the variance
and log-det calibration; :func:`bootstrap_rows` gives paired bootstrap intervals against
a reference row.

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


def score_run(
    run_dir: Optional[Path], store: Path, split: str, t: Optional[Truth] = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The (Q, V) costs of a run on a split of the eval store, and its text diagnostics (:func:`text_diagnostics`;
    none for zero-shot and cosine runs).

    ``run_dir`` None: zero-shot (negative cosine of the text and the mean of the frames).
    """
    from dab_pipeline.scoring import score_all

    if run_dir is None:
        with open_store(store) as st:
            sp = st.load_split(split)
            frames = torch.as_tensor(np.asarray(sp.frames, np.float32))
            mask = torch.as_tensor(np.asarray(sp.frame_mask)).float()[..., None]
            video = torch.nn.functional.normalize((frames * mask).sum(1) / mask.sum(1).clamp_min(1), dim=-1)
            text = torch.nn.functional.normalize(torch.as_tensor(np.asarray(sp.text, np.float32)), dim=-1)
        return -(text @ video.T).numpy(), {}
    run, text, frames, mask = _run_inputs(run_dir, store, split)
    with torch.no_grad():
        cost = score_all(run.model, text, frames, mask, dtype=run.config.score_dtype).cost
    return cost, text_diagnostics(run.model, text, frames, mask, t)


def _run_inputs(run_dir: Path, store: Path, split: str):
    """The loaded run and a split's texts (Q, D), frames (V, F, D) and frame mask (V, F) as its model reads them."""
    from dab_pipeline.runs.inputs import SplitArrays, score_inputs
    from dab_pipeline.runs.load import load_run

    run = load_run(run_dir, heads=True)
    tuned = run.heads is not None
    with open_store(store) as st:
        feats = SplitArrays(st.load_split(split, with_states=tuned), torch.device("cpu"), with_states=tuned)
    with torch.no_grad():
        text, frames = score_inputs(run.heads, feats, torch.device("cpu"), 0, feats.num_queries)
    return run, text, frames, feats.mask


def text_diagnostics(model, text: torch.Tensor, frames: torch.Tensor, mask: torch.Tensor, t: Optional[Truth]):
    """Per-query text diagnostics of a Gaussian model ({} for a cosine one).

    ``text_var`` (Q,): the mean sigma^2 over D; ``text_logdet`` (Q,): log det Sigma_t (``metrics.text_logdet``;
    the full low-rank determinant for lowrank:R, the sum of log sigma^2 for diag and for a mixture's moments);
    lowrank runs with a truth that has generic captions: ``u_span`` (n,) and ``u_span_chance`` (n,), from
    :func:`u_span`.
    """
    if not model.cfg.gaussian:
        return {}
    with torch.no_grad():
        ts = model.encode_text(text)
        lv = ts.logvar.double()  # (Q, D)
        out = {
            "text_var": ts.logvar.exp().mean(dim=-1).numpy(),  # (Q,)
            "text_logdet": M.text_logdet(lv.numpy(), None if ts.factor is None else ts.factor.double().numpy()),
        }
        if ts.factor is not None and t is not None:
            shares, chance = u_span(model, ts, model.encode_video(frames, mask), t)
            if shares.size:
                out |= {"u_span": shares, "u_span_chance": chance}
    return out


U_SPAN_CAPTIONS, U_SPAN_VIDEOS = 200, 50  # at most: generic captions sampled, relevant videos per caption


def u_span(model, ts, vs, t: Truth, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Whether U spans the ambiguity: per sampled generic caption, the share of the spread of its relevant videos'
    means in span(U_t), and its chance level r / D (``metrics.subspace_share``), (n,) each.

    A generic caption is true of many videos; the means ``mu_v`` of the video Gaussians pooled for it (one per
    relevant video, ``model.pair_terms(..., grid=False)``) spread where those videos differ.  A U that models the
    caption's ambiguity points along that spread.  Seeded samples: at most :data:`U_SPAN_CAPTIONS` generic captions
    with two relevant videos or more, and :data:`U_SPAN_VIDEOS` of each one's relevant videos.
    """
    rng = np.random.default_rng(seed)
    generic = np.flatnonzero((t.levels == "generic") & (t.n_relevant >= 2))
    if generic.size > U_SPAN_CAPTIONS:
        generic = np.sort(rng.choice(generic, U_SPAN_CAPTIONS, replace=False))
    shares, chance = [], []
    for q in generic:
        rel = np.flatnonzero(t.relevant[q])
        if rel.size > U_SPAN_VIDEOS:
            rel = np.sort(rng.choice(rel, U_SPAN_VIDEOS, replace=False))
        with torch.no_grad():
            pairs = model.pair_terms(ts.select(torch.full((rel.size,), int(q))), vs.select(torch.as_tensor(rel)), False)
        got = M.subspace_share(pairs.video_mu.double().numpy(), ts.factor[q].double().numpy())  # (n, D), (D, R)
        shares.append(got["share"])
        chance.append(got["chance"])
    return np.asarray(shares, np.float64), np.asarray(chance, np.float64)


def run_queries(run_dir: Optional[Path], store: Path, split: str, t: Truth, cache_dir: Path) -> dict[str, np.ndarray]:
    """Per-query claim-aware results of a run (cached in ``cache_dir`` as claims-<split>.npz).

    A cache written before the text diagnostics had ``text_logdet`` (a Gaussian run's ``text_var`` alone) gets
    them added, from the texts and the run's model alone (the costs are not scored again).
    """
    cache = cache_dir / f"claims-{split}.npz"
    if cache.is_file():
        out = dict(np.load(cache))
        if run_dir is not None and "text_var" in out and "text_logdet" not in out:
            run, text, frames, mask = _run_inputs(run_dir, store, split)
            out |= text_diagnostics(run.model, text, frames, mask, t)
            _save(cache, out)
        return out
    t0 = time.time()
    cost, extras = score_run(run_dir, store, split, t)
    rel = M.relevance_metrics(cost, t.relevant, k=10)
    out = {
        "AP": rel["AP"],
        "nDCG@10": rel["nDCG@10"],
        "P@1": rel["P@1"],
        "R@1 source": (M.t2v_ranks(cost, t.source) == 1).astype(np.float64),
        "margin": M.kl_margin(cost),
        **extras,
    }
    _save(cache, out)
    log(f"  claims on {split}: {cost.shape[0]} x {cost.shape[1]} pairs scored in {time.time() - t0:.0f} s")
    return out


def _save(cache: Path, arrays: dict[str, np.ndarray]) -> None:
    """The cache written whole or not at all (a temporary file renamed into place)."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + ".partial.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(cache)


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
    for col, key in (("var calibration", "text_var"), ("logdet calibration", "text_logdet")):
        if all(key in r for r in per_seed):
            row[col] = agg([M.spearman(r[key], np.log(t.n_relevant)) for r in per_seed])
    if all("u_span" in r for r in per_seed):
        row["U span"] = agg([float(np.mean(r["u_span"])) for r in per_seed])
        row["U span chance"] = agg([float(np.mean(r["u_span_chance"])) for r in per_seed])
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
    "logdet calibration",
    "U span",
    "U span chance",
]
# shown only when a row has them (Gaussian runs; lowrank runs on a world with generic captions)
OPTIONAL_COLUMNS = ("logdet calibration", "U span", "U span chance")
_SOURCE = {
    "mAP": "AP",
    "mAP video": "AP video",
    "mAP shot": "AP shot",
    "mAP object": "AP object",
    "mAP generic": "AP generic",
}


def claim_markdown(rows: dict[str, dict[str, Any]], boot: dict[str, dict[str, Any]], reference: str) -> str:
    """The claim-aware table, then one line per row: its difference to the reference with the interval."""
    columns = [c for c in CLAIM_COLUMNS if c not in OPTIONAL_COLUMNS or any(c in row for row in rows.values())]
    lines = ["| variant | " + " | ".join(columns) + " |", "| --- |" + " ---: |" * len(columns)]
    for name, row in rows.items():
        cells = []
        for col in columns:
            agg = row.get(_SOURCE.get(col, col))
            if agg is None:
                cells.append("-")
                continue
            digits = 3 if col.startswith(("AURC", "var", "logdet", "U span")) else 1
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
