"""training of :mod:`commands` (see the package docstring)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
import click
from ...core.choices import DIST_COSTS, VARIANTS
from .. import cli
from ..progress import RichProgress

from .common import _EXISTING, _PATH, _echo_run, _quiet_shared_errors, _refuse_changes_on_resume, _store_depth


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
    from ...runtime.distributed import want_distributed
    from ...stages.train import run_train

    use_dist = want_distributed(distributed)
    # Resolved on every rank alike (each reads the store manifest, or config.json on --resume).
    cfg = _train_config(features, out, recipe, variant, cost, steps, epochs, batch_size, trainable_blocks, device,
                        overrides, resume)
    if use_dist:
        from ...runtime.distributed import distributed_session

        with distributed_session(cfg.device) as ctx:  # nccl on CUDA, gloo on CPU
            with _quiet_shared_errors(ctx), RichProgress(quiet=quiet or not ctx.is_main) as prog:
                res = run_train(cfg, progress=prog, resume=resume, dist=ctx)
            if not ctx.is_main:
                return
    else:
        with RichProgress(quiet=quiet) as prog:
            res = run_train(cfg, progress=prog, resume=resume)
    _echo_run(res)


def _train_config(features, out, recipe, variant, cost, steps, epochs, batch_size, trainable_blocks, device,
                  overrides, resume):
    from ...core.overrides import apply_overrides
    from ...recipes import load_recipe
    from ...runs.folder import RunFolder
    from ...stages.train import TrainConfig, resolve_train_config
    from ...store import open_store

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
        saved = RunFolder(out).load_config(TrainConfig)
        if chosen is not None and chosen.name != saved.recipe:
            raise click.UsageError(f"--resume continues {out} with its saved configuration (recipe {saved.recipe!r}); "
                                   f"drop --recipe {recipe}, or start a new run with another --out")
        # a run folder is relocatable: a copied or moved run resumes where --out points, never where it was made
        saved = dataclasses.replace(saved, out=Path(out))
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
    from ...core.overrides import apply_overrides
    from ...stages.distill import DistillConfig, run_distill

    cfg = apply_overrides(DistillConfig(teacher=teacher, out=out, student_steps=student_steps, epochs=epochs),
                          overrides)
    with RichProgress(quiet=quiet) as prog:
        res = run_distill(cfg, progress=prog, resume=resume)
    _echo_run(res)
