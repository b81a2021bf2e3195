"""The click commands.  Each resolves a stage config once, then calls the stage."""

from __future__ import annotations

from .common import OWN_WEIGHTS, _EXISTING, _EXTRACT_TIMEOUT, _PATH, _blocks_option, _console, _echo_run, _human_bytes, _metric_table, _quiet_shared_errors, _refuse_changes_on_resume, _resolve_pretrained, _store_depth, _v2t_label  # noqa: F401
from .extracting import _extract_summary, extract, inspect  # noqa: F401
from .training import _train_config, distill, train  # noqa: F401
from .evaluating import compare, evaluate  # noqa: F401
