"""common of :mod:`commands` (see the package docstring)."""

from __future__ import annotations

import datetime as _dt
from contextlib import contextmanager
from pathlib import Path
from typing import Optional
import click



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
    from ...runtime.distributed import is_shared_error
    from ...core.errors import DabError
    from .. import UserError

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
    from ...clip_models import full_depth

    clip = manifest.get("clip", {})
    vision, text = clip.get("num_vision_layers"), clip.get("num_text_layers")
    if isinstance(vision, int) and vision == text:
        return vision
    return full_depth(str(manifest.get("model")))


def _resolve_pretrained(model: str, pretrained: Optional[str]) -> Optional[str]:
    if pretrained is None:
        return None if model in OWN_WEIGHTS else "openai"
    return None if pretrained.lower() in ("none", "") else pretrained


def _human_bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _echo_run(res) -> None:
    """The run folder and its test numbers, as `dab train` and `dab distill` print them."""
    click.echo(f"run folder: {res.run_dir}")
    if res.test_metrics:
        m = res.test_metrics
        click.echo(f"test t2v: R@1 {m['R@1']:.1f}  R@5 {m['R@5']:.1f}  R@10 {m['R@10']:.1f}  "
                   f"MdR {m['MdR']:.1f}  MnR {m['MnR']:.1f}  (best epoch {res.best_epoch})")


def _refuse_changes_on_resume(saved, asked, out: Path) -> None:
    """--resume continues a run as it was configured; options that would change it are an error, not ignored."""
    from ...core.overrides import to_dict

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
