"""The click commands.  Each resolves a stage config once, then calls the stage."""

from __future__ import annotations

import datetime as _dt
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import click

from ..choices import CLIP_DTYPES, DECODE_BACKENDS, DIST_COSTS, POSTPROCESS, STORE_DTYPES, V2T_CONVENTIONS, VARIANTS
from . import cli
from .progress import RichProgress

_PATH = click.Path(path_type=Path)
_EXISTING = click.Path(path_type=Path, exists=True)


def _console():
    from rich.console import Console

    return Console()


# How long a rank of `dab extract --distributed` waits in a collective: a rank that
# finished its share waits for the slowest one and for rank 0's HDF5 merge.
_EXTRACT_TIMEOUT = _dt.timedelta(hours=6)


@contextmanager
def _quiet_shared_errors(ctx):
    """An error that every rank raised is printed once, by rank 0, and every rank exits with its code.

    Rank 0 prints *before* the ranks leave together: torchrun stops the whole job
    as soon as one rank ends with an error, which could cut rank 0 short.
    """
    from ..distributed import is_shared_error
    from ..errors import DabError
    from . import UserError

    try:
        yield
    except DabError as err:
        if not is_shared_error(err):
            raise
        if ctx.is_main:
            UserError(err).show()
        ctx.barrier()
        raise SystemExit(err.exit_code) from None


# Models whose weights come with dab (dab-tiny generated, dab-world shipped): no --pretrained needed.
OWN_WEIGHTS = ("dab-tiny", "dab-tiny-quickgelu", "dab-world")


def _blocks_option(raw: Optional[str], depth) -> Optional[int]:
    """``--trainable-blocks K|all`` -> K; ``depth()`` gives the number of blocks "all" means."""
    if raw is None:
        return None
    if str(raw).strip().lower() == "all":
        return depth()
    try:
        return int(raw)
    except ValueError:
        raise click.BadParameter(f"expected a number of blocks or 'all', got {raw!r}",
                                 param_hint="--trainable-blocks") from None


def _store_depth(manifest: dict) -> int:
    """What ``trainable_blocks=all`` means for a store: its CLIP's depth (both towers alike)."""
    from ..clip_models import full_depth

    clip = manifest.get("clip", {})
    vision, text = clip.get("num_vision_layers"), clip.get("num_text_layers")
    if isinstance(vision, int) and vision == text:
        return vision
    return full_depth(str(manifest.get("model")))


def _resolve_pretrained(model: str, pretrained: Optional[str]) -> Optional[str]:
    if pretrained is None:
        return None if model in OWN_WEIGHTS else "openai"
    return None if pretrained.lower() in ("none", "") else pretrained


@cli.command()
@click.option("--dataset", required=True, help="Dataset format: msrvtt, msvd, vatex or folder.")
@click.option("--videos", type=_PATH, default=None, help="Folder holding the video files.")
@click.option("--annotations", type=_PATH, default=None, help="Annotation folder or file (captions and splits).")
@click.option("--out", type=_PATH, default=Path("store.h5"), show_default=True,
              help="Store to write: *.h5 (HDF5) or *.zarr (Zarr v3).")
@click.option("--model", default="ViT-B-32", show_default=True,
              help="open_clip architecture, or dab-world (the procedural world's CLIP) / dab-tiny (tests).")
@click.option("--pretrained", default=None,
              help="open_clip pretrained tag or a local weights file (default: openai; dab-world and dab-tiny: "
                   "their own weights).")
@click.option("--frames", type=int, default=12, show_default=True, help="Frames sampled per video.")
@click.option("--trainable-blocks", default=None, metavar="K|all",
              help="Also store the states entering the last K transformer blocks of both towers (fine-tuning in "
                   "stage two); all: every block (12 for ViT-B/32 and B/16).")
@click.option("--dtype", "compute_dtype", type=click.Choice(CLIP_DTYPES),
              default="auto", show_default=True,
              help="CLIP's dtype while encoding; auto: bf16 where the device multiplies bf16 natively (autocast "
                   "on CUDA 8.0+, the converted model on AMX / AVX512-BF16 CPUs: 1.4-2.6x faster), else float32 "
                   "(float16 on older GPUs); a resumed store keeps its dtype. bf16 asked on a CPU without it runs "
                   "float32, with a warning. Recorded in the manifest.")
@click.option("--store-dtype", type=click.Choice(STORE_DTYPES), default="float16", show_default=True)
@click.option("--train-views", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also store N augmented views of every training video (X-Pool's random resized crop + flip, "
                   "seeded per video and view); dab train draws one per video per epoch.")
@click.option("--batch-size", type=int, default=16, show_default=True, help="Videos per encoding batch.")
@click.option("--workers", type=int, default=2, show_default=True, help="Decoding worker processes.")
@click.option("--decoder", "decode_backend", type=click.Choice(DECODE_BACKENDS), default="pyav", show_default=True,
              help="pyav: exact frames from every container (sequential read); pyav-seek: seek to key frames "
                   "(long MP4/MKV/WebM videos); decord: decord's reader (clean MP4/MKV only). "
                   "See docs/extraction.md.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--option", "dataset_options", multiple=True, metavar="KEY=VALUE",
              help="Dataset loader option, e.g. train_split=7k or val_size=0 (repeatable).")
@click.option("--limit", type=int, default=None, help="Only the first N videos (a quick trial).")
@click.option("--overwrite", is_flag=True, help="Rebuild the store even if one exists with another configuration.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override any ExtractConfig field.")
@click.option("--distributed/--no-distributed", default=None,
              help="One rank of a torchrun job: each process encodes its share of the videos "
                   "(default: on when launched by torchrun). See docs/distributed.md.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def extract(dataset, videos, annotations, out, model, pretrained, frames, trainable_blocks, compute_dtype,
            store_dtype, train_views, batch_size, workers, decode_backend, device, dataset_options, limit, overwrite, overrides,
            distributed, quiet) -> None:
    """Decode videos, encode frames and captions with CLIP, and cache the features in a store.

    Running the same command again resumes: finished videos are skipped.
    Several processes: `torchrun --nproc-per-node N -m dab_pipeline.cli extract ...`.
    """
    from ..config import apply_overrides
    from ..clip_models import full_depth
    from ..stages.extract import ExtractConfig, run_extract

    try:
        cfg = ExtractConfig(
            dataset=dataset, out=out, videos=videos, annotations=annotations,
            dataset_options=tuple(dataset_options), model=model,
            pretrained=_resolve_pretrained(model, pretrained),
            frames=frames, trainable_blocks=_blocks_option(trainable_blocks, lambda: full_depth(model)),
            compute_dtype=compute_dtype,
            store_dtype=store_dtype, train_views=train_views, batch_size=batch_size, workers=workers, device=device,
            decode_backend=decode_backend, limit=limit, overwrite=overwrite,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    cfg = apply_overrides(cfg, overrides)
    from ..distributed import want_distributed

    if want_distributed(distributed):
        from ..distributed import distributed_session

        # gloo even on GPUs: extraction exchanges only small control messages (the
        # features go to the store), and gloo's long timeout covers ranks that
        # wait for a slower share or for rank 0's HDF5 merge.
        with distributed_session(cfg.device, backend="gloo", timeout=_EXTRACT_TIMEOUT) as ctx:
            with _quiet_shared_errors(ctx), RichProgress(quiet=quiet or not ctx.is_main) as prog:
                res = run_extract(cfg, progress=prog, dist=ctx)
            if not ctx.is_main:
                return
    else:
        with RichProgress(quiet=quiet) as prog:
            res = run_extract(cfg, progress=prog)
    _extract_summary(res)


def _extract_summary(res) -> None:
    msg = (f"{res.store}: {res.videos_ok} videos encoded, {res.videos_skipped} already done, "
           f"{res.videos_failed} failed, {res.videos_missing} missing; {res.captions} captions")
    done = res.videos_ok + res.videos_failed
    if done and res.video_seconds > 0:
        msg += f"; {done} videos in {res.video_seconds:.2f} s ({done / res.video_seconds:.1f} videos/s)"
    click.echo(msg + f"; {res.seconds:.2f} s in all")
    earlier = res.store_failed - res.videos_failed
    click.echo(f"store: {res.store_ok} ok, {res.store_failed} failed"
               + (f" ({earlier} in earlier runs)" if earlier > 0 else "")
               + f", {res.store_missing} missing; {len(res.warnings)} of this run's videos have decoder warnings")
    if res.failures:
        click.echo(f"failures (first {min(5, len(res.failures))}):", err=True)
        for vid, err in res.failures[:5]:
            click.echo(f"  {vid}: {err}", err=True)
    if res.warnings:
        click.echo(f"warnings (first {min(5, len(res.warnings))}; `dab inspect` lists all):", err=True)
        for vid, note in res.warnings[:5]:
            click.echo(f"  {vid}: {note}", err=True)


@cli.command()
@click.argument("store", type=_EXISTING)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest and summary as JSON.")
def inspect(store: Path, as_json: bool) -> None:
    """Print a store's manifest, counts per split and array sizes."""
    from rich.table import Table

    from ..store import open_store

    with open_store(store) as st:
        manifest = st.manifest
        summary = st.summary()
        warnings = st.warnings()
        failures = st.failures()
    if as_json:
        click.echo(json.dumps({"manifest": manifest, "summary": summary, "warnings": dict(warnings),
                               "failures": dict(failures)}, indent=2, default=str))
        return
    con = _console()
    t = Table(title=f"{store}", show_header=False)
    for key in ("model", "pretrained", "weights_sha256", "quick_gelu", "frames", "image_size", "compute_dtype",
                "store_dtype", "trainable_blocks", "decoder", "dataset", "dataset_options", "package_version",
                "created", "world_size"):
        if key in manifest:
            t.add_row(key, str(manifest[key]))
    con.print(t)
    s = Table(title="videos and captions per split")
    for col in ("split", "videos", "ok", "failed", "missing", "pending", "captions", "captions done"):
        s.add_column(col, justify="left" if col == "split" else "right")
    for split, c in summary.get("splits", {}).items():
        s.add_row(split, *[str(c.get(k, "")) for k in ("videos", "ok", "failed", "missing", "pending", "captions",
                                                        "captions_done")])
    con.print(s)
    arrays = summary.get("arrays", {})
    if arrays:
        a = Table(title="arrays")
        for col in ("name", "shape", "dtype", "bytes on disk"):
            a.add_column(col, justify="left" if col in ("name", "dtype") else "right")
        for name, info in arrays.items():
            a.add_row(name, "x".join(map(str, info.get("shape", []))), str(info.get("dtype", "")),
                      _human_bytes(info.get("stored_bytes")))
        con.print(a)
    for title, rows in (("failed videos", failures), ("decoder warnings", warnings)):
        if rows:
            w = Table(title=f"{title} ({len(rows)})")
            w.add_column("video")
            w.add_column("message")
            for vid, text in rows[:50]:
                w.add_row(vid, text)
            con.print(w)
            if len(rows) > 50:
                con.print(f"... and {len(rows) - 50} more (dab inspect --json lists all)")
    state = "complete" if summary.get("complete") else "incomplete (run the same extract command to resume)"
    con.print(f"{summary.get('backend')} store, {state}; file size {_human_bytes(summary.get('file_bytes'))}")


def _human_bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@cli.command()
@click.option("--features", type=_EXISTING, required=False, help="Feature store written by `dab extract`.")
@click.option("--out", type=_PATH, default=None, help="Run folder (default: runs/<store>-<variant>).")
@click.option("--recipe", default=None, metavar="NAME",
              help="Start from a shipped recipe: frozen (the default values: CLIP frozen), paper (Tables 1-3: all "
                   "12 CLIP blocks fine-tuned), paper-ablation (Tables 4-5), xpool (X-Pool's own recipe), world "
                   "(the procedural world). Options and --set override its values. See docs/reproducing.md.")
@click.option("--variant", type=click.Choice(VARIANTS), default=None,
              help="Model variant (paper Table 5): xpool baseline, prob, bridge or the full dab (default).")
@click.option("--cost", type=click.Choice(DIST_COSTS), default=None, help="Distributional cost (default kl).")
@click.option("--steps", type=int, default=None, help="Truncated bridge steps T' (default 32).")
@click.option("--epochs", type=int, default=None, help="Epochs (default 10).")
@click.option("--batch-size", type=int, default=None, help="Batch size (default 32).")
@click.option("--trainable-blocks", default=None, metavar="K|all",
              help="Fine-tune the last K CLIP blocks, or all of them (the store must have been extracted with "
                   "the same K).")
@click.option("--device", default=None, help="cpu, cuda, cuda:N or auto (default).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any TrainConfig field, e.g. --set lr=5e-5 --set model.dropout=0.4.")
@click.option("--resume", is_flag=True, help="Continue the stopped run in --out with its saved configuration.")
@click.option("--distributed/--no-distributed", default=None,
              help="One rank of a torchrun job (DistributedDataParallel; --batch-size is the global batch). "
                   "Default: on when launched by torchrun. See docs/distributed.md.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def train(features, out, recipe, variant, cost, steps, epochs, batch_size, trainable_blocks, device, overrides,
          resume, distributed, quiet) -> None:
    """Train DAB (or an ablation variant) on a cached store and write the test cost matrix.

    Several processes / GPUs: `torchrun --nproc-per-node N -m dab_pipeline.cli train ...`.
    """
    from ..distributed import want_distributed
    from ..stages.train import run_train

    use_dist = want_distributed(distributed)
    # Resolved on every rank alike (each reads the store manifest, or config.json on --resume).
    cfg = _train_config(features, out, recipe, variant, cost, steps, epochs, batch_size, trainable_blocks, device,
                        overrides, resume)
    if use_dist:
        from ..distributed import distributed_session

        with distributed_session(cfg.device) as ctx:  # nccl on CUDA, gloo on CPU
            with _quiet_shared_errors(ctx), RichProgress(quiet=quiet or not ctx.is_main) as prog:
                res = run_train(cfg, progress=prog, resume=resume, dist=ctx)
            if not ctx.is_main:
                return
    else:
        with RichProgress(quiet=quiet) as prog:
            res = run_train(cfg, progress=prog, resume=resume)
    _echo_run(res)


def _echo_run(res) -> None:
    """The run folder and its test numbers, as `dab train` and `dab distill` print them."""
    click.echo(f"run folder: {res.run_dir}")
    if res.test_metrics:
        m = res.test_metrics
        click.echo(f"test t2v: R@1 {m['R@1']:.1f}  R@5 {m['R@5']:.1f}  R@10 {m['R@10']:.1f}  "
                   f"MdR {m['MdR']:.1f}  MnR {m['MnR']:.1f}  (best epoch {res.best_epoch})")


def _train_config(features, out, recipe, variant, cost, steps, epochs, batch_size, trainable_blocks, device,
                  overrides, resume):
    from ..config import apply_overrides, load_config
    from ..recipes import load_recipe
    from ..stages.train import TrainConfig, resolve_train_config
    from ..store import open_store

    chosen = load_recipe(recipe) if recipe else None  # an unknown name fails here, listing the valid ones

    opts: list[str] = []
    for key, val in (("model.variant", variant), ("model.cost", cost), ("model.steps", steps),
                     ("epochs", epochs), ("batch_size", batch_size), ("trainable_blocks", trainable_blocks),
                     ("device", device)):
        if val is not None:
            opts.append(f"{key}={val}")
    opts.extend(overrides)
    if resume:
        if out is None:
            raise click.UsageError("--resume needs --out RUN_FOLDER")
        saved = load_config(TrainConfig, Path(out) / "config.json")
        if chosen is not None and chosen.name != saved.recipe:
            raise click.UsageError(f"--resume continues {out} with its saved configuration (recipe {saved.recipe!r}); "
                                   f"drop --recipe {recipe}, or start a new run with another --out")
        _refuse_changes_on_resume(saved, apply_overrides(saved, opts), Path(out))
        return saved
    if features is None:
        raise click.UsageError("--features STORE is required")
    with open_store(Path(features)) as st:
        manifest = st.manifest
    if chosen is not None:  # the recipe first: every option and --set below overrides it
        opts = [*chosen.overrides(manifest), *opts, f"recipe={chosen.name}"]
    opts = [f"trainable_blocks={_store_depth(manifest)}" if o.replace(" ", "").lower() == "trainable_blocks=all" else o
            for o in opts]
    var = next((o.split("=", 1)[1] for o in reversed(opts) if o.startswith("model.variant=")), None) or "dab"
    out = out or Path("runs") / f"{Path(features).name.split('.')[0]}-{var}"
    cfg = apply_overrides(TrainConfig(features=Path(features), out=Path(out)), opts)
    explicit = {o.split("=", 1)[0].strip() for o in opts}
    return resolve_train_config(cfg, manifest, explicit)


def _refuse_changes_on_resume(saved, asked, out: Path) -> None:
    """--resume continues a run as it was configured; options that would change it are an error, not ignored."""
    from ..config import to_dict

    def flat(d: dict, prefix: str = "") -> dict:
        items = {}
        for k, v in d.items():
            items.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return items

    a, b = flat(to_dict(saved)), flat(to_dict(asked))
    diff = [f"{k} (saved {a[k]!r}, given {b[k]!r})" for k in sorted(a) if a[k] != b.get(k)]
    if diff:
        raise click.UsageError(
            f"--resume continues {out} with its saved configuration; these options differ from it: "
            f"{', '.join(diff)}. Drop them, or start a new run with another --out")


def _v2t_label(res: dict) -> str:
    """The v2t row's name; the stricter per-caption convention says so (the default is the field's)."""
    return "video-to-text (every caption)" if res.get("v2t_convention") == "captions" else "video-to-text"


def _metric_table(title: str, rows: list[tuple[str, dict]]):
    from rich.table import Table

    cols = ["R@1", "R@5", "R@10", "R@50", "MdR", "MnR", "RSum"]
    t = Table(title=title)
    t.add_column("")
    for c in cols:
        t.add_column(c, justify="right")
    for name, m in rows:
        t.add_row(name, *[("-" if m.get(c) is None else f"{m[c]:.1f}") for c in cols])
    return t


@cli.command()
@click.option("--run", type=_EXISTING, default=None, help="Run folder written by `dab train`.")
@click.option("--costs", type=_EXISTING, default=None,
              help="Any cost/similarity file of the documented layout (h5, zarr, npz) instead of a run.")
@click.option("--features", type=_EXISTING, default=None, help="Store for the neighbourhood diagnostic.")
@click.option("--out", type=_PATH, default=None, help="Where to write metrics.json, report.md and plots.")
@click.option("--postprocess", type=click.Choice(POSTPROCESS), default="none", show_default=True,
              help="Optional post-processing: dual softmax (dsl) or inverted softmax (is); labelled in outputs.")
@click.option("--temperature", type=float, default=0.01, show_default=True, help="Post-processing temperature.")
@click.option("--v2t", "v2t", type=click.Choice(V2T_CONVENTIONS), default="videos", show_default=True,
              help="Video-to-text with several captions per video: rank the other videos by their best caption "
                   "(X-Pool, CLIP4Clip), or every caption of every other video (stricter). Labelled in outputs.")
@click.option("--examples", type=click.IntRange(min=0), default=24, show_default=True,
              help="Queries shown in examples.html (thumbnails of what was retrieved, across the confidence "
                   "range, failures included); 0: no page.")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print metrics.json to stdout instead of tables.")
def evaluate(run, costs, features, out, postprocess, temperature, v2t, examples, no_plots, as_json) -> None:
    """Retrieval metrics, uncertainty diagnostics and reports for a run (or any cost file)."""
    from ..stages.evaluate import EvaluateConfig, run_evaluate

    try:
        cfg = EvaluateConfig(run=run, costs=costs, features=features, out=out, postprocess=postprocess,
                             temperature=temperature, v2t=v2t, examples=examples, plots=not no_plots)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    with RichProgress(quiet=True) as prog:
        res = run_evaluate(cfg, progress=prog)
    if as_json:
        click.echo(json.dumps(res, indent=2, default=str))
        return
    con = _console()
    pp = res.get("postprocess", {})
    pp_name = pp.get("label") or pp.get("name", "none") if isinstance(pp, dict) else str(pp)
    con.print(_metric_table(f"{res['source']}  (postprocess: {pp_name})",
                            [("text-to-video", res["t2v"]), (_v2t_label(res), res["v2t"])]))
    sel = res.get("selective", {})
    for k in ("R@1", "R@5"):
        r = sel.get(k)
        if isinstance(r, dict):
            cov = ", ".join(f"{c} {v:.1f}" for c, v in r.get("at_coverage", {}).items())
            con.print(f"selective {k} by {sel.get('confidence', 'margin')}: AURC {r['aurc']:.3f} "
                      f"(random {r['aurc_random']:.3f}, optimal {r['aurc_optimal']:.3f}); {k} at coverage {cov}")
    var = res.get("variance")
    if var:
        con.print("mean sigma^2: " + ", ".join(f"{k} {v:.3f} (x{var['ratio'].get(k, float('nan')):.2f})"
                                               for k, v in var["mean"].items() if v is not None))
    nb = res.get("neighbourhood")
    if nb:
        con.print(f"semantic positives in top-{nb['topk']} (model / random): " + ", ".join(
            f"tau {r['tau']}: {r['model']:.2f} / {r['random']:.2f}" for r in nb["rows"]))
    con.print("wrote " + ", ".join(res.get("files", {}).values()))


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=_EXISTING)
@click.option("--out", type=_PATH, default=None, help="Also write the table as markdown to this file.")
def compare(runs, out) -> None:
    """One table of several evaluated runs (the paper's ablation tables)."""
    from rich.table import Table

    from ..config import atomic_write_text
    from ..errors import StoreError
    from ..report import compare_markdown, compare_table

    loaded = []
    for r in runs:
        p = Path(r) / "metrics.json" if Path(r).is_dir() else Path(r)
        if not p.exists():
            raise StoreError(f"{r}: no metrics.json; run `dab evaluate --run {r}` first")
        loaded.append((Path(r).name if Path(r).is_dir() else Path(r).parent.name, json.loads(p.read_text())))
    headers, rows = compare_table(loaded)
    t = Table(title="comparison (text-to-video)")
    for h in headers:
        t.add_column(h, justify="left" if h == headers[0] else "right")
    for row in rows:
        t.add_row(*row)
    _console().print(t)
    if out:
        atomic_write_text(Path(out), compare_markdown(loaded))
        click.echo(f"wrote {out}")


@cli.command()
@click.option("--run", "teacher", type=_EXISTING, required=True, help="A trained dab (or bridge) run: the teacher.")
@click.option("--out", type=_PATH, required=True, help="The student's run folder.")
@click.option("--student-steps", type=click.IntRange(min=1), default=1, show_default=True,
              help="Bridge steps S of the student (the teacher has T').")
@click.option("--epochs", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any DistillConfig field, e.g. --set lr=3e-4 --set rank_weight=0.")
@click.option("--resume", is_flag=True, help="Continue the stopped distillation in --out.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def distill(teacher, out, student_steps, epochs, overrides, resume, quiet) -> None:
    """Distill a trained bridge into S steps: an ordinary run folder, scored at the cost of S steps.

    The student copies the teacher's weights and trains its bridge alone to reach the teacher's
    state after T' steps (and its ranking of every batch pair) in S. See docs/model.md.
    """
    from ..config import apply_overrides
    from ..stages.distill import DistillConfig, run_distill

    cfg = apply_overrides(DistillConfig(teacher=teacher, out=out, student_steps=student_steps, epochs=epochs),
                          overrides)
    with RichProgress(quiet=quiet) as prog:
        res = run_distill(cfg, progress=prog, resume=resume)
    _echo_run(res)
