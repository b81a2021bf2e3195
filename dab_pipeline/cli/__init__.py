"""The ``dab`` command line: click commands over the stages.

Configs are resolved here, at the edge, from options and ``--set key=value``;
library errors (:class:`~dab_pipeline.core.errors.DabError`) become a one-line
message and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import click

from .. import __version__
from ..core.errors import DabError


class UserError(click.ClickException):
    """A DabError surfaced by click as ``Error: <message>`` with the error's exit code."""

    def __init__(self, err: DabError) -> None:
        super().__init__(str(err))
        self.exit_code = err.exit_code


# What Ctrl-C leaves, per command: everything finished so far is on disk.
_INTERRUPTED = {
    "extract": "interrupted; the videos encoded so far are kept: rerun the same command to resume",
    "train": "interrupted; resume from the last checkpoint with `dab train --resume --out RUN_FOLDER`",
}


class DabGroup(click.Group):
    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except DabError as err:
            raise UserError(err) from None
        except KeyboardInterrupt:
            click.echo(_INTERRUPTED.get(ctx.invoked_subcommand or "", "interrupted"), err=True)
            raise SystemExit(130) from None
        except OSError as err:
            # The file system said no (full disk, read-only, permissions) outside the places
            # that turn it into a DabError: one line naming the file, never a traceback.
            from ..store import os_reason  # deferred: start-up (h5py, zarr)

            where = f" ({err.filename})" if getattr(err, "filename", None) and err.filename not in str(err) else ""
            raise click.ClickException(f"{os_reason(err)}{where}") from None


@click.group(cls=DabGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dab")
def cli() -> None:
    """dab: Distribution-Alignment Bridge for uncertainty-aware text-to-video retrieval.

    \b
    dab extract   decode videos, encode frames and captions with CLIP, cache them in a store
    dab inspect   print a store's manifest, counts and sizes
    dab train     train DAB (or an ablation variant) on a store; writes a run folder
    dab evaluate  retrieval metrics, uncertainty diagnostics and reports for a run
    dab compare   one table for several runs
    dab calibrate probabilities of a match, conformal sets and risk control for a run
    dab search    top-k videos of a store for a free-text query
    dab index     a FAISS first stage over a store's videos, for search at scale
    dab serve     a search page and JSON API over a run, a store and an index
    dab distill   a trained T'-step bridge in S steps: an ordinary run folder, scored at S steps' cost
    dab sweep     train and evaluate every row of a grid or plan over seeds: one table with intervals
    """


def register_commands() -> None:
    # Command modules import the stages lazily, so `dab --help` never loads torch.
    from . import commands  # noqa: F401  # deferred: they import `cli` from this module, defined above


def main() -> None:
    register_commands()
    try:
        cli(prog_name="dab")
    except SystemExit as done:
        _exit_past_unclosed_hdf5(done)
        raise


def _exit_past_unclosed_hdf5(done: SystemExit) -> None:
    """End the process at once when an HDF5 file could not be closed after a failed write (a full disk).

    The failure has been reported in one line and the file holds what was written before it; HDF5's
    own clean-up at exit would try the same write again and crash (SIGSEGV) instead of exiting with
    the error's code."""
    import os
    import sys

    h5 = sys.modules.get("dab_pipeline.store.backend_h5")  # not imported: no HDF5 file was opened
    if h5 is None or not h5.unclosed_files():
        return
    code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


register_commands()
