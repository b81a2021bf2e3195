"""The inputs of the diagnostics that run a model (the bridge report, the covariance report): the run loaded with
its fine-tuned heads and the cost file's split read from the store, in the cost file's query order."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ...core.errors import DabError
from ...core.events import Event, ProgressCallback
from ...core.location import location
from ...runs.inputs import SplitArrays, score_inputs
from ...runs.load import LoadedRun, load_run
from ...store import open_store


def split_inputs(
    run: Path, cm, store_path: Optional[Path], test_split: str, device, progress: ProgressCallback, purpose: str
) -> Optional[tuple[LoadedRun, SplitArrays, str]]:
    """The loaded run, the cost file's split read from the store, and that split's name; None (with a warning
    naming ``purpose``) when the store is missing, the run does not load, or the split does not hold the cost
    file's queries in order."""
    if store_path is None or not location(store_path).exists():
        progress(Event("warning", message=f"store {store_path} not found: skipping {purpose}"))
        return None
    try:
        loaded = load_run(run, heads=True)
    except DabError as exc:
        progress(Event("warning", message=f"skipping {purpose}: {exc}"))
        return None
    split = str((cm.attrs or {}).get("split") or test_split)
    with open_store(store_path) as st:
        st.require_complete(f"dab evaluate ({purpose} read the split)")
        tuned = loaded.heads is not None
        feats = SplitArrays(st.load_split(split, with_states=tuned), device, with_states=tuned)
    if [str(c) for c in feats.caption_ids] != [str(q) for q in cm.query_ids]:
        progress(
            Event(
                "warning",
                message=f"the {split!r} split of {store_path} does not hold the cost file's "
                f"queries in its order: skipping {purpose}",
            )
        )
        return None
    return loaded, feats, split


def model_inputs(
    run: Path, cm, store_path: Optional[Path], test_split: str, progress: ProgressCallback, purpose: str
) -> Optional[tuple[LoadedRun, SplitArrays, str, torch.Tensor, torch.Tensor]]:
    """:func:`split_inputs` on the CPU, and the split's texts (Q, D) and frames (V, F, D) as the run's model takes
    them (through its fine-tuned heads, where it has them); None where split_inputs gives None."""
    device = torch.device("cpu")
    found = split_inputs(run, cm, store_path, test_split, device, progress, purpose)
    if found is None:
        return None
    loaded, feats, split = found
    with torch.no_grad():
        text, frames = score_inputs(loaded.heads, feats, device, 0, feats.num_queries)  # (Q, D), (V, F, D)
    return loaded, feats, split, text, frames
