"""Retrieval quality of every variant on the procedural world, over seeds (docs/quality.md).

One command: build the world (a fixed preset), extract it once with ``dab-world``
(the world's own pretrained CLIP) through ``run_extract``, then train and evaluate
every variant through ``run_train`` and ``run_evaluate``, the stage functions the
CLI calls, and print, per world, two tables of mean +- std over seeds:

* the 1K-A-like table (one query per test video, against its source video):
  text-to-video R@1 / R@5 / R@10 / MnR, video-to-text R@1; selective prediction by
  the KL margin (paper Figure 4): AURC of R@1 against random ordering, R@1 at 25 %
  and 10 % coverage; the mean sigma^2 of text, bridged text and video (paper
  Table 6); and the bridge's pair-dependent share (docs/metrics.md);
* the claim-aware table (``claims.py``): every caption of every test video as a
  query, relevant = every test video its claim is true of: mAP (overall and per
  caption level), nDCG@10, P@1, R@1 against the source video, the AURC of "top-1
  relevant" by the KL margin, the Spearman correlation of text sigma^2 with the log
  number of relevant videos, and each row's difference to ``dab`` with a paired
  bootstrap 95 % interval over queries (seeds pooled).

Rows: the claim oracle (a model that knows which test videos each query is true
of and picks uniformly among them: the ceiling the world's ambiguity allows),
zero-shot (cosine of mean frame features, CLIP4Clip's baseline), the trained
variants, and the controls: ``prob-fixvar`` / ``dab-fixvar`` (variances frozen at
e^logvar_init) and ``dab-const`` (the drift replaced by one learned shift). The
recipe is the paper's (§4.1) where it fits; what the world needs instead is in
``RECIPE`` and docs/quality.md.

    python benchmarks/quality.py [--quick] [--world PRESET ...] [--world-set KEY=VALUE ...] [--seeds 1 2 3]
        [--variants ...] [--claims-split test|val|none] [--data-dir DIR] [--out DIR] [--epochs N]
        [--set KEY=VALUE ...] [--label SUFFIX]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from dab_pipeline.core.overrides import apply_overrides
from dab_pipeline.results.sweep import collect_run, mean_std
from dab_pipeline.runs.costfile import CostMatrix, write_costs
from dab_pipeline.stages.evaluate import EvaluateConfig, run_evaluate
from dab_pipeline.stages.extract import ExtractConfig, run_extract
from dab_pipeline.stages.sweep import SweepConfig, SweepPlan, SweepRow, run_sweep
from dab_pipeline.store import open_store
from dab_pipeline.world import WorldConfig, load_world, make_world, world_preset, world_videos
from dab_pipeline.world.generate import claim_from_dict
from dab_pipeline.world.grammar import satisfies
from dab_pipeline.world.recipe import world_recipe

sys.path.insert(0, str(Path(__file__).parent))
import claims as C  # noqa: E402  (claim-aware evaluation)

# The benchmark's recipe: the paper's §4.1 values, except where the world needs another
# (dab_pipeline/recipes/world.json says why; the demo trains with it too: --recipe world).
RECIPE: dict[str, Any] = world_recipe()
QUICK_EPOCHS = 10

# name -> (store: "frozen" | "k2", overrides on top of RECIPE)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "xpool": ("frozen", ["model.variant=xpool"]),
    "prob": ("frozen", ["model.variant=prob"]),
    "bridge": ("frozen", ["model.variant=bridge"]),
    "dab": ("frozen", ["model.variant=dab"]),  # KL, T'=32: the paper's model
    "dab-w2": ("frozen", ["model.variant=dab", "model.cost=w2"]),
    "dab-T1": ("frozen", ["model.variant=dab", "model.steps=1"]),
    "dab-T8": ("frozen", ["model.variant=dab", "model.steps=8"]),
    "dab-ft2": ("k2", ["model.variant=dab", "trainable_blocks=2"]),  # last 2 CLIP blocks fine-tuned
    # controls (docs/model.md): variances frozen at e^logvar_init; the drift replaced by one learned shift
    "prob-fixvar": ("frozen", ["model.variant=prob", "model.variance=fixed"]),
    "dab-fixvar": ("frozen", ["model.variant=dab", "model.variance=fixed"]),
    "dab-const": ("frozen", ["model.variant=dab", "model.drift=constant"]),
}
# the full run's rows (dab-ft2, 5.6x dab's time for no measured gain, runs with --variants)
FULL_VARIANTS = [
    "xpool",
    "prob",
    "prob-fixvar",
    "bridge",
    "dab",
    "dab-fixvar",
    "dab-const",
    "dab-w2",
    "dab-T1",
    "dab-T8",
]
QUICK_VARIANTS = ["xpool", "prob", "prob-fixvar", "dab-T8", "dab", "dab-fixvar", "dab-const"]
FULL_WORLDS, QUICK_WORLDS = ["benchmark", "uncertain"], ["quick", "uncertain-quick"]
REFERENCE = "dab"  # the row the claim-aware differences are taken against


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


def world_of(preset: str, sets: list[str]) -> tuple[str, WorldConfig]:
    """The named world with ``KEY=VALUE`` overrides (``ambiguity=0``), and its label (``quick-ambiguity0``)."""
    cfg = apply_overrides(world_preset(preset), sets)
    return preset + "".join("-" + item.replace("=", "").replace(".", "p") for item in sets), cfg


def build(
    label: str,
    cfg: WorldConfig,
    data_dir: Path,
    need_k2: bool,
    workers: int,
    train_views: int = 0,
    claims: bool = False,
) -> dict[str, Path]:
    """The world and its stores (reused when already complete); ``claims``: the eval stores too."""
    root = data_dir / f"world-{label}"
    t0 = time.time()
    captions = make_world(root, cfg, workers=workers)
    log(f"world {label}: {cfg.train}/{cfg.val}/{cfg.test} videos in {root} ({time.time() - t0:.0f} s)")
    stores = {"world": root, "frozen": data_dir / f"store-{label}.h5"}
    kinds = [("frozen", None, 0)] + ([("k2", 2, 0)] if need_k2 else [])
    if train_views:  # the trained variants read this one instead of the frozen store (zero-shot does not)
        kinds.append(("views", None, train_views))
    for kind, k, views in kinds:
        out = data_dir / f"store-{label}{'' if k is None else f'-k{k}'}{f'-views{views}' if views else ''}.h5"
        stores[kind] = out
        t0 = time.time()
        res = run_extract(
            ExtractConfig(
                dataset="folder",
                videos=root / "videos",
                annotations=captions,
                model="dab-world",
                pretrained=None,
                out=out,
                trainable_blocks=k,
                workers=workers,
                train_views=views,
            )
        )
        log(
            f"store {out.name}: {res.videos_ok} encoded, {res.videos_skipped} already there "
            f"({time.time() - t0:.0f} s, {out.stat().st_size / 2**20:.1f} MiB)"
        )
    if claims:
        stores["eval"] = C.eval_store(root, data_dir / f"store-{label}-eval.h5", workers)
        if need_k2:
            stores["eval-k2"] = C.eval_store(root, data_dir / f"store-{label}-k2-eval.h5", workers, trainable_blocks=2)
    return stores


def oracle(world_root: Path) -> dict[str, float]:
    """R@K of a model that knows each test query's claim and ranks the videos it is true of first, at random."""
    meta = load_world(world_root)
    test = [(vid, v) for vid, v in meta["videos"].items() if v["split"] == "test"]
    videos = world_videos(meta)
    shots = [videos[vid].shots for vid, _ in test]
    m = []
    for _, v in test:
        claim = claim_from_dict(v["captions"][v["test_query"]]["claim"])
        m.append(sum(satisfies(s, claim) for s in shots))
    m = np.asarray(m, np.float64)
    return {
        "R@1": float(np.mean(1 / m) * 100),
        "R@5": float(np.mean(np.minimum(1, 5 / m)) * 100),
        "R@10": float(np.mean(np.minimum(1, 10 / m)) * 100),
        "unique_queries": float(np.mean(m == 1) * 100),
        "mean_matches": float(np.mean(m)),
    }


# --------------------------------------------------------------------------- runs


def zero_shot(store: Path, out: Path) -> dict[str, Any]:
    """Cosine of the mean (masked) frame feature and the caption feature, evaluated like any run."""
    with open_store(store) as st:
        split = st.load_split("test")
    frames = torch.as_tensor(np.asarray(split.frames, np.float32))  # (V, F, D)
    mask = torch.as_tensor(np.asarray(split.frame_mask)).float()[..., None]  # (V, F, 1)
    video = torch.nn.functional.normalize((frames * mask).sum(1) / mask.sum(1).clamp_min(1), dim=-1)  # (V, D)
    text = torch.nn.functional.normalize(torch.as_tensor(np.asarray(split.text, np.float32)), dim=-1)  # (Q, D)
    out.mkdir(parents=True, exist_ok=True)
    costs = out / "costs_test.h5"
    write_costs(
        costs,
        CostMatrix(
            cost=-(text @ video.T).numpy(),
            query_ids=np.asarray(split.caption_ids),
            video_ids=np.asarray(split.video_ids),
            gt=np.asarray(split.caption_video, np.int64),
            kind="cost",
            attrs={"variant": "zero-shot", "store": str(store)},
        ),
    )
    return run_evaluate(EvaluateConfig(costs=costs, out=out, plots=False))


def train_values(variant: str, stores: dict[str, Path], epochs: int) -> dict[str, Any]:
    """The TrainConfig values of a trained variant: the recipe, its own settings, and the store it trains on."""
    kind, sets = VARIANTS[variant]
    if kind == "frozen" and "views" in stores:
        kind = "views"
    return {**RECIPE, "epochs": epochs, **dict(s.split("=", 1) for s in sets), "features": str(stores[kind])}


def quality_plan(variants: list[str], stores: dict[str, Path], seeds: list[int], epochs: int) -> SweepPlan:
    """The trained variants as one sweep: a row per variant (each on its store), every seed."""
    rows = tuple(SweepRow(v, train_values(v, stores, epochs)) for v in variants)
    return SweepPlan(name="quality", rows=rows, seeds=tuple(seeds))


def sweep_runs(
    variants: list[str], seeds: list[int], stores: dict[str, Path], runs_dir: Path, epochs: int, extra: list[str]
) -> None:
    """Train and evaluate what is missing, through `dab sweep`'s driver: a finished run of the same config is
    reused, a stopped one resumed, one of another config (a changed recipe) replaced (runs_dir is a cache)."""
    if not variants:
        return
    cfg = SweepConfig(
        features=stores["frozen"],
        out=runs_dir,
        plan=quality_plan(variants, stores, seeds, epochs),
        overrides=tuple(extra),
        layout="{row}-seed{seed}",
        cache=True,
    )
    res = run_sweep(cfg, progress=lambda e: log(e.message) if e.kind in ("info", "warning") else None)
    if res.failed:
        raise SystemExit("runs failed: " + "; ".join(f"{k}: {v}" for k, v in res.failed.items()))


def finished_run(out: Path) -> dict[str, Any]:
    """metrics.json of a finished run, with its training seconds."""
    got = collect_run(out)
    if got is None:
        raise SystemExit(f"{out} is not a finished, evaluated run")
    return got["metrics"] | {"seconds": got["metrics"]["train_seconds"]}


def one_run(
    variant: str, seed: int, stores: dict[str, Path], runs_dir: Path, epochs: int, extra: list[str]
) -> dict[str, Any]:
    """One variant and seed (zero-shot included), trained unless done: the sweep's driver for one run."""
    out = runs_dir / f"{variant}-seed{seed}"
    if variant == "zero-shot":
        return zero_shot_run(stores, out)
    sweep_runs([variant], [seed], stores, runs_dir, epochs, extra)
    return finished_run(out)


def zero_shot_run(stores: dict[str, Path], out: Path) -> dict[str, Any]:
    """Zero-shot has nothing to train: its cost file is written once, and evaluated."""
    want = {"store": str(stores["frozen"])}
    bench = out / "bench.json"
    if (out / "metrics.json").is_file() and bench.is_file() and json.loads(bench.read_text()).get("config") == want:
        return json.loads((out / "metrics.json").read_text()) | {"seconds": json.loads(bench.read_text())["seconds"]}
    t0 = time.time()
    res = zero_shot(stores["frozen"], out)
    seconds = time.time() - t0
    bench.write_text(json.dumps({"seconds": seconds, "config": want}, default=str))
    return res | {"seconds": seconds}


def run_claims(
    variant: str, seed: int, stores: dict[str, Path], runs_dir: Path, split: str, t: "C.Truth"
) -> dict[str, np.ndarray]:
    """Claim-aware per-query results of a finished run (cached in its folder)."""
    out = runs_dir / f"{variant}-seed{seed}"
    store = stores["eval-k2" if VARIANTS.get(variant, ("frozen",))[0] == "k2" else "eval"]
    return C.run_queries(None if variant == "zero-shot" else out, store, split, t, out)


def row_values(res: dict[str, Any]) -> dict[str, Optional[float]]:
    sel = res.get("selective", {}).get("R@1", {})
    var = (res.get("variance") or {}).get("mean", {})
    bridge = res.get("bridge") or {}
    share = bridge.get("pair_dependent_share", {})
    pct = lambda v: None if v is None else 100 * v
    return {
        "pair-dep mu": pct(share.get("mu")),
        "pair-dep logvar": pct(share.get("logvar")),
        "const R@1": (bridge.get("constant_control") or {}).get("R@1"),
        "t2v R@1": res["t2v"]["R@1"],
        "t2v R@5": res["t2v"]["R@5"],
        "t2v R@10": res["t2v"]["R@10"],
        "t2v MnR": res["t2v"]["MnR"],
        "v2t R@1": res["v2t"]["R@1"],
        "AURC": sel.get("aurc"),
        "AURC random": sel.get("aurc_random"),
        "R@1 @25%": sel.get("at_coverage", {}).get("25%"),
        "R@1 @10%": sel.get("at_coverage", {}).get("10%"),
        "var text": var.get("text"),
        "var bridge": var.get("bridge"),
        "var video": var.get("video"),
        "seconds": res.get("seconds"),
    }


COLUMNS = [
    "t2v R@1",
    "t2v R@5",
    "t2v R@10",
    "t2v MnR",
    "v2t R@1",
    "AURC",
    "AURC random",
    "R@1 @25%",
    "R@1 @10%",
    "var text",
    "var bridge",
    "var video",
    "pair-dep mu",
    "pair-dep logvar",
    "const R@1",
    "seconds",
]


def aggregate(per_seed: list[dict[str, Optional[float]]]) -> dict[str, Any]:
    out = {}
    for col in COLUMNS:
        vals = [r[col] for r in per_seed if r.get(col) is not None]
        out[col] = mean_std(vals) if vals else None
    return out


def _cell(agg: Optional[dict], col: str) -> str:
    if agg is None:
        return "-"
    digits = 3 if col.startswith(("AURC", "var")) else (0 if col == "seconds" else 1)
    m, s, n = agg["mean"], agg["std"], len(agg["values"])
    return f"{m:.{digits}f}" if n == 1 else f"{m:.{digits}f} ± {s:.{digits}f}"


def markdown(table: dict[str, Any], oracle_row: dict[str, float]) -> str:
    lines = ["| variant | " + " | ".join(COLUMNS) + " |", "| --- |" + " ---: |" * len(COLUMNS)]
    o = {"t2v R@1": oracle_row["R@1"], "t2v R@5": oracle_row["R@5"], "t2v R@10": oracle_row["R@10"]}
    lines.append("| oracle (claims) | " + " | ".join(f"{o[c]:.1f}" if c in o else "-" for c in COLUMNS) + " |")
    for name, agg in table.items():
        lines.append(f"| {name} | " + " | ".join(_cell(agg[c], c) for c in COLUMNS) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "commit": commit,
    }


def run_world(
    label: str, wcfg: WorldConfig, variants: list[str], seeds: list[int], args, epochs: int
) -> dict[str, Any]:
    """Every variant and seed on one world: both tables, printed and returned."""
    claims_split = None if args.claims_split == "none" else args.claims_split
    stores = build(
        label,
        wcfg,
        args.data_dir,
        need_k2="dab-ft2" in variants,
        workers=args.workers,
        train_views=args.train_views,
        claims=claims_split is not None,
    )
    orc = oracle(stores["world"])
    log(f"oracle: R@1 {orc['R@1']:.1f} ({orc['unique_queries']:.0f}% of test queries true of one test video only)")
    runs_dir = args.data_dir / f"runs-{label}{args.label}{f'-views{args.train_views}' if args.train_views else ''}"
    truth = C.truth(stores["world"], stores["eval"], claims_split) if claims_split else None
    table, per_run, claim_rows, per_query = {}, {}, {}, {}
    sweep_runs([v for v in variants if v != "zero-shot"], seeds, stores, runs_dir, epochs, args.overrides)
    for variant in variants:
        rows, queries = [], []
        for seed in [0] if variant == "zero-shot" else seeds:
            out = runs_dir / f"{variant}-seed{seed}"
            res = zero_shot_run(stores, out) if variant == "zero-shot" else finished_run(out)
            vals = row_values(res)
            rows.append(vals)
            per_run[f"{variant}/seed{seed}"] = vals
            msg = f"{label} {variant} seed {seed}: t2v R@1 {vals['t2v R@1']:.1f} MnR {vals['t2v MnR']:.2f}"
            if truth is not None:
                queries.append(run_claims(variant, seed, stores, runs_dir, claims_split, truth))
                msg += f"; claim-aware mAP {100 * queries[-1]['AP'].mean():.1f}"
            log(msg + f" ({vals['seconds']:.0f} s)")
        table[variant] = aggregate(rows)
        if truth is not None:
            claim_rows[variant], per_query[variant] = C.claim_row(queries, truth), queries
    boot = C.bootstrap_rows(per_query, args.reference) if truth is not None else {}
    text = markdown(table, orc)
    if truth is not None:
        text += (
            f"\n\nClaim-aware ({claims_split} split: {len(truth.levels)} queries, every caption of every "
            f"{claims_split} video; relevant = every {claims_split} video its claim is true of, "
            f"{truth.n_relevant.mean():.1f} on average):\n\n" + C.claim_markdown(claim_rows, boot, args.reference)
        )
    return {
        "world": label,
        "config": dataclasses.asdict(wcfg),
        "oracle": orc,
        "table": table,
        "runs": per_run,
        "claims": {
            "split": claims_split,
            "rows": claim_rows,
            "bootstrap": boot,
            "queries": None if truth is None else int(len(truth.levels)),
        },
        "markdown": text,
    }


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help=f"the worlds {QUICK_WORLDS}, seed 1, variants {QUICK_VARIANTS}"
    )
    ap.add_argument(
        "--world",
        nargs="+",
        default=None,
        help=f"world presets (default: {' '.join(FULL_WORLDS)}; quick: {' '.join(QUICK_WORLDS)})",
    )
    ap.add_argument(
        "--world-set",
        dest="world_sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field of every world (e.g. ambiguity=0); the world's folders get a suffix",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default 1 2 3; quick: 1)")
    ap.add_argument(
        "--variants",
        nargs="+",
        default=None,
        help=f"of: zero-shot {' '.join(VARIANTS)} (default: zero-shot {' '.join(FULL_VARIANTS)}; "
        f"quick: zero-shot {' '.join(QUICK_VARIANTS)})",
    )
    ap.add_argument(
        "--claims-split",
        default="test",
        choices=["test", "val", "none"],
        help="the split of the claim-aware table (val for model selection; none: skip it)",
    )
    ap.add_argument("--reference", default=REFERENCE, help="the row the claim-aware differences are taken against")
    ap.add_argument("--epochs", type=int, default=None, help=f"default {RECIPE['epochs']}")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra TrainConfig override for every trained variant (a sweep)",
    )
    ap.add_argument("--label", default="", help="suffix of the run folders (keeps sweeps apart)")
    ap.add_argument(
        "--train-views",
        type=int,
        default=0,
        help="train the frozen variants on a store with N augmented views per training video",
    )
    ap.add_argument("--data-dir", type=Path, default=Path("bench_data"), help="world, stores, runs (reused)")
    ap.add_argument("--out", type=Path, default=None, help="write quality.md / quality.json here")
    ap.add_argument("--workers", type=int, default=2, help="world writing and decoding processes")
    args = ap.parse_args(argv)
    presets = args.world or (QUICK_WORLDS if args.quick else FULL_WORLDS)
    seeds = args.seeds or ([1] if args.quick else [1, 2, 3])
    variants = args.variants or (["zero-shot"] + (QUICK_VARIANTS if args.quick else FULL_VARIANTS))
    bad = [v for v in variants if v != "zero-shot" and v not in VARIANTS]
    if bad:
        ap.error(f"unknown variants {bad}; valid: zero-shot, {', '.join(VARIANTS)}")
    epochs = args.epochs or (QUICK_EPOCHS if args.quick else RECIPE["epochs"])
    t_start = time.time()
    worlds = [world_of(p, args.world_sets) for p in presets]
    results = [run_world(label, wcfg, variants, seeds, args, epochs) for label, wcfg in worlds]
    result = {
        "worlds": results,
        "seeds": seeds,
        "epochs": epochs,
        "recipe": RECIPE,
        "overrides": args.overrides,
        "machine": machine(),
        "wall_seconds": time.time() - t_start,
    }
    text = "\n\n".join(f"## {r['world']} world\n\n{r['markdown']}" for r in results)
    print(text)
    print(
        f"\nworlds {', '.join(r['world'] for r in results)}, seeds {seeds}, {epochs} epochs; wall time "
        f"{result['wall_seconds'] / 60:.1f} min on {result['machine']['cpu']} ({result['machine']['cores']} cores)"
    )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "quality.md").write_text(text + "\n")
        (args.out / "quality.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
