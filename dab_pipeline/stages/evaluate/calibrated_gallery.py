"""The test queries scored against the gallery a run was calibrated on, for ``dab evaluate``'s calibration section.

A run's test costs rank each test query among the test split's videos, but a run calibrated with ``dab calibrate
--gallery all`` promises its probabilities, sets and risk answers for a search of *every* video: measured on the
test split's gallery they are measured where nothing was promised (a softmax over 100 videos is not one over 400).
Where the gallery calibrated on can still be read (the same store, the same videos: its fingerprint), the test
queries are scored against it here, as ``dab search --split <gallery>`` scores them, and the section is measured
there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ...calibration import Calibration, text_variance
from ...core.choices import DEFAULT_SCORE_DTYPE
from ...core.errors import DabError
from ...core.events import Event, ProgressCallback
from ...core.location import location
from ...runs.load import load_run
from ...runtime.capabilities import resolve_score_dtype
from ...runtime.devices import resolve_device
from ...scoring import Scorer
from ...store import open_store, split_rows, store_fingerprint

__all__ = ["GalleryCosts", "test_costs_on_calibrated_gallery"]


@dataclass(frozen=True)
class GalleryCosts:
    cost: np.ndarray  # (Q, V) each test query against every video of the gallery calibrated on
    gt: np.ndarray  # (Q,) each query's match: its column
    text_var: Optional[np.ndarray]  # (Q,) the run's text variance (a variance-normalised score reads it)
    texts: list[str]  # (Q,) the queries' captions (length groups)
    split: str  # the gallery's split
    query_ids: np.ndarray  # (Q,) the test captions' ids, in the cost file's order


def test_costs_on_calibrated_gallery(
    run_dir: Path,
    cal: Calibration,
    test_split: str,
    query_ids: np.ndarray,
    stores: Sequence[Any],
    progress: ProgressCallback,
) -> tuple[Optional[GalleryCosts], Optional[str]]:
    """(the test queries' costs against ``cal``'s gallery, None), or (None, why not) where it cannot be measured
    there: a calibration made through an index (its sets hold for searches through it), a store that cannot be read
    or whose gallery changed since; (None, None), quietly, where the gallery cannot hold the test queries (a run
    calibrated on its validation split: the section says the gallery is another). ``stores``: where to look for
    the store, in order (the one ``dab evaluate`` reads, then the one calibration.json names); the gallery's
    fingerprint decides which holds it."""
    gallery = cal.gallery
    if cal.provenance.get("index"):
        return None, "the run was calibrated through an index; the test split's costs rank every test video"
    split = gallery.get("split")
    if not split:
        return None, "calibration.json does not name the split of its gallery"
    tried = [where for where in [*stores, gallery.get("store")] if where]
    for where in dict.fromkeys(map(str, tried)):  # each place once, in order
        try:
            with open_store(location(where)) as store:
                rows = split_rows(store, split)
                if not np.isin(split_rows(store, test_split), rows).all():
                    return None, None  # the gallery does not hold the test videos: nothing to measure there
                if store_fingerprint(store, rows) != gallery.get("fingerprint"):
                    continue
                queries, videos = store.load_split(test_split), store.load_split(split)
                texts = [str(t) for t in store.caption_text[queries.caption_index]]
        except (DabError, OSError):  # a store moved or gone: the next place, else the test gallery
            continue
        return _score(run_dir, cal, queries, videos, texts, np.asarray(query_ids), split, progress)
    return None, f"no store at {', '.join(dict.fromkeys(map(str, tried)))} holds the gallery calibrated on, unchanged"


def _score(
    run_dir: Path,
    cal: Calibration,
    queries: Any,
    videos: Any,
    texts: list[str],
    query_ids: np.ndarray,
    split: str,
    progress: ProgressCallback,
) -> tuple[Optional[GalleryCosts], Optional[str]]:
    """The test ``queries`` scored against the gallery's ``videos`` on the device and at the precision the
    calibration was scored with (calibration.json's config), in the cost file's order of ``query_ids``."""
    order = _cost_file_order(np.asarray(queries.caption_ids).astype(str), query_ids.astype(str))
    match = queries.matches_in(videos)  # (Q,) -1: a video the gallery lacks
    if order is None or (match < 0).any():
        return None, f"the cost file's queries are not the captions of split {split!r}'s test videos"
    progress(
        Event(
            "info",
            message=f"calibration section: scoring the {len(order)} test queries against the "
            f"{len(videos.video_ids)} videos calibrated on (split {split!r}), as a search of that gallery does",
        )
    )
    made = cal.provenance.get("config") or {}
    device = resolve_device(str(made.get("device", "cpu")))
    run = load_run(run_dir, device)
    dtype = resolve_score_dtype(str(made.get("dtype", DEFAULT_SCORE_DTYPE)), device).dtype
    with Scorer(run.model, device=device, dtype=dtype) as scorer:
        cost = scorer.score(queries.text, videos.frames, videos.frame_mask).cost  # (Q, V)
    tv = text_variance(run.model, queries.text)  # (Q,) or None
    got = GalleryCosts(
        cost=np.asarray(cost, np.float64)[order],
        gt=match[order],
        text_var=None if tv is None else np.asarray(tv, np.float64)[order],
        texts=[texts[i] for i in order],
        split=split,
        query_ids=query_ids,
    )
    return got, None


def _cost_file_order(split_ids: np.ndarray, file_ids: np.ndarray) -> Optional[np.ndarray]:
    """(Q,) the rows of the split's captions in the cost file's order; None where the two are not the same set."""
    if len(split_ids) != len(file_ids) or set(split_ids.tolist()) != set(file_ids.tolist()):
        return None
    at: dict[Any, int] = {c: i for i, c in enumerate(split_ids.tolist())}
    return np.array([at[c] for c in file_ids.tolist()], np.int64)
