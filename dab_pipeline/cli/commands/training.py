"""training of :mod:`commands` (see the package docstring)."""

from __future__ import annotations

import click

from ...core.choices import DIST_COSTS, VARIANT_OPTIONS
from .. import cli
from ..progress import RichProgress
from .options import EXISTING, PATH, STORE, typed_values
from .output import echo_run, quiet_shared_errors


@cli.command()
@click.option("--features", type=STORE, required=False, help="Feature store written by `dab extract`.")
@click.option("--out", type=PATH, default=None, help="Run folder (default: runs/<store>-<variant>).")
@click.option(
    "--recipe",
    default=None,
    metavar="NAME",
    help="Start from a shipped recipe: frozen (the default values: CLIP frozen), paper (Tables 1-3: all "
    "12 CLIP blocks fine-tuned), paper-ablation (Tables 4-5), xpool (X-Pool's own recipe), clip4clip, tmass, "
    "hvpnet (the peers' recipes for DiDeMo, ActivityNet, LSMDC, Charades...), world (the procedural world). "
    "Options and --set override its values. See docs/reproducing.md.",
)
@click.option(
    "--variant",
    type=click.Choice(VARIANT_OPTIONS),
    default=None,
    help="Model variant (paper Table 5): xpool baseline, prob, bridge or the full dab (default); or a "
    "control (docs/model.md): prob-fixvar, dab-fixvar (variances fixed), dab-const (one learned "
    "shift instead of the drift network), each recorded as its variant and model values.",
)
@click.option("--cost", type=click.Choice(DIST_COSTS), default=None, help="Distributional cost (default kl).")
@click.option("--steps", type=int, default=None, help="Truncated bridge steps T' (default 32).")
@click.option("--epochs", type=int, default=None, help="Epochs (default 10).")
@click.option("--batch-size", type=int, default=None, help="Batch size (default 32).")
@click.option(
    "--trainable-blocks",
    default=None,
    metavar="K|all|none",
    help="Fine-tune the last K CLIP blocks, or all of them (the store must have been extracted with "
    "the same K); none: CLIP frozen (overrides a recipe that fine-tunes).",
)
@click.option("--seed", type=int, default=None, help="Training seed (default 24, the paper's).")
@click.option("--device", default=None, help="cpu, cuda, cuda:N or auto (default).")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override any TrainConfig field, e.g. --set lr=5e-5 --set model.dropout=0.4.",
)
@click.option("--resume", is_flag=True, help="Continue the stopped run in --out with its saved configuration.")
@click.option(
    "--distributed/--no-distributed",
    default=None,
    help="One rank of a torchrun job (DistributedDataParallel; --batch-size is the global batch). "
    "Default: on when launched by torchrun. See docs/distributed.md.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def train(
    features,
    out,
    recipe,
    variant,
    cost,
    steps,
    epochs,
    batch_size,
    trainable_blocks,
    seed,
    device,
    overrides,
    resume,
    distributed,
    quiet,
) -> None:
    """Train DAB (or an ablation variant) on a cached store and write the test cost matrix.

    Several processes / GPUs: `torchrun --nproc-per-node N -m dab_pipeline.cli train ...`.
    """
    from ...runtime.distributed import want_distributed  # deferred: `dab --help` must not import torch
    from ...stages.train import build_train_config, run_train  # deferred: `dab --help` must not import torch

    use_dist = want_distributed(distributed)
    # Resolved on every rank alike (each reads the store manifest, or config.json on --resume). Only what was
    # typed: on --resume every other value is the saved one, never a default taken as a change.
    options = typed_values(
        click.get_current_context(),
        {
            "model.variant": "variant",
            "model.cost": "cost",
            "model.steps": "steps",
            "epochs": "epochs",
            "batch_size": "batch_size",
            "trainable_blocks": "trainable_blocks",
            "seed": "seed",
            "device": "device",
        },
    )
    cfg = build_train_config(features, out, recipe=recipe, options=options, overrides=overrides, resume=resume)
    if use_dist:
        from ...runtime.distributed import distributed_session  # deferred: `dab --help` must not import torch

        with distributed_session(cfg.device) as ctx:  # nccl on CUDA, gloo on CPU
            with quiet_shared_errors(ctx), RichProgress(quiet=quiet or not ctx.is_main) as prog:
                res = run_train(cfg, progress=prog, resume=resume, dist=ctx)
            if not ctx.is_main:
                return
    else:
        with RichProgress(quiet=quiet) as prog:
            res = run_train(cfg, progress=prog, resume=resume)
    echo_run(res)


@cli.command()
@click.option("--run", "teacher", type=EXISTING, required=True, help="A trained dab (or bridge) run: the teacher.")
@click.option("--out", type=PATH, required=True, help="The student's run folder.")
@click.option(
    "--student-steps",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Bridge steps S of the student (the teacher has T').",
)
@click.option("--epochs", type=click.IntRange(min=1), default=5, show_default=True)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override any DistillConfig field, e.g. --set lr=3e-4 --set rank_weight=0.",
)
@click.option("--resume", is_flag=True, help="Continue the stopped distillation in --out.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def distill(teacher, out, student_steps, epochs, overrides, resume, quiet) -> None:
    """Distill a trained bridge into S steps: an ordinary run folder, scored at the cost of S steps.

    The student copies the teacher's weights and trains its bridge alone to reach the teacher's
    state after T' steps (and its ranking of every batch pair) in S. See docs/model.md.
    """
    from ...stages.distill import build_distill_config, run_distill  # deferred: `dab --help` must not import torch

    # only what was typed: the shown defaults are DistillConfig's own, and on --resume every value not typed
    # is the saved one (a default is not a change)
    options = typed_values(click.get_current_context(), {"student_steps": "student_steps", "epochs": "epochs"})
    cfg = build_distill_config(teacher, out, options=options, overrides=overrides, resume=resume)
    with RichProgress(quiet=quiet) as prog:
        res = run_distill(cfg, progress=prog, resume=resume)
    echo_run(res)
