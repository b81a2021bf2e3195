"""The calibrated part of a search (:class:`CalibratedSearch`, a base of :class:`~dab_pipeline.search.Searcher`):
the run's calibration.json, read once, and each result's calibrated probabilities, conformal set and risk
decision (:mod:`dab_pipeline.calibration`, docs/uncertainty.md)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from ..calibration import (
    UncertaintyRequest,
    assess,
    conformal_threshold,
    gallery_mismatch,
    read_run_calibration,
    text_variance,
)
from ..clip_models import query_words
from ..core.errors import ConfigError
from ..core.location import StoreURL, location
from ..store import split_rows, store_fingerprint
from .results import SearchResult

__all__ = ["CalibratedSearch", "first_stage_mismatch"]


def first_stage_mismatch(cal, first_stage: Optional[dict]) -> Optional[str]:
    """One line where a search's first stage is not the one ``cal`` was calibrated through (issue 60): a
    calibration made through an index holds only for searches through that index at that shortlist and nprobe;
    None where it matches, or where the calibration scored every video (a shortlist then marks its numbers)."""
    made = cal.provenance.get("index")
    if not made:
        return None
    how = f"--index {made['path']} --shortlist {made['shortlist']} --nprobe {made['nprobe']}"
    if first_stage is None:
        return f"this run was calibrated through an index: search with {how}, or calibrate again without --index"
    if first_stage["digest"] != made["digest"]:
        return (
            f"{first_stage['path']} is not the index this run was calibrated through ({made['path']}): calibrate again"
        )
    for key in ("shortlist", "nprobe"):
        if first_stage[key] != made[key]:
            return (
                f"this run was calibrated through its index at {key} {made[key]}, not {first_stage[key]}: search with "
                f"{how}, or calibrate again at this {key}"
            )
    return None


class CalibratedSearch:
    """What a Searcher does with its run's calibration; it sets ``run``, ``store``, ``rows`` and ``split`` and
    provides ``_checkpoint_sha``."""

    calibration = None
    calibration_problem: Optional[str] = None
    gallery_note: Optional[str] = None  # where the gallery searched is not the one calibrated on
    calibrate_here: Optional[str] = None  # with gallery_note: the `dab calibrate` that would make it, where one can

    def _load_calibration(self, warn: Callable[[str], None]) -> None:
        """The run's calibration.json where it has one made for its checkpoint (else ``calibration_problem`` says
        why not); one warning line where the gallery searched is not the one it was calibrated on."""
        self.calibration, self.calibration_problem, self.gallery_note, self.calibrate_here = None, None, None, None
        if not (self.run.run_dir / "calibration.json").exists():
            return
        self.calibration, self.calibration_problem = read_run_calibration(self.run.run_dir, self._checkpoint_sha())
        if self.calibration_problem:
            warn(self.calibration_problem)
        elif self.calibration is not None:
            other = gallery_mismatch(
                self.calibration, self.split, len(self.rows), store_fingerprint(self.store, self.rows)
            )
            if other:
                warn(other)
                self.gallery_note, self.calibrate_here = other, self._calibrate_command()

    def _calibrate_command(self) -> Optional[str]:
        """The `dab calibrate` that calibrates this run on the gallery searched, or None where that gallery cannot
        be calibrated on: `dab calibrate` searches its split's queries in the gallery, so the gallery must hold
        every video of that split (a gallery of split 'test' lacks the 'val' videos) and the split its captions."""
        assert self.calibration is not None
        split = self.calibration.provenance.get("split")
        if not split or split not in self.store.splits():  # unsaid, or a store without those queries (a library)
            return None
        videos = split_rows(self.store, split)  # (V,) store rows of the calibration queries' videos
        captions = self.store.in_split(split, "caption") & self.store.caption_done()  # (C,) bool
        if len(videos) == 0 or not np.isin(videos, self.rows).all() or not captions.any():
            return None
        run = self.run.run_dir
        features = "" if _same_place(self.run.config.features, self.store_path) else f" --features {self.store_path}"
        queries = "" if split == self.run.config.val_split else f" --split {split}"  # not calibrate's default
        return f"dab calibrate --run {run}{features}{queries} --gallery {self.split}"

    def check_request(
        self, request: Optional[UncertaintyRequest], first_stage: Optional[dict] = None, served: bool = False
    ) -> None:
        """A one-line ConfigError where ``request`` cannot be met: a run without a usable calibration, a score it
        lacks, a coverage its calibration holds too few queries for, a first stage (index, shortlist, nprobe:
        ``first_stage``, a search's :meth:`first_stage_identity`) other than the one it was calibrated through.
        ``served``: the request came to `dab serve`, whose user restarts a server rather than searching again."""
        if request is None or not request.active:
            return
        if self.calibration is None:
            run = self.run.run_dir
            raise ConfigError(
                self.calibration_problem or f"{run} has no calibration.json: make it with `dab calibrate --run {run}`"
            )
        # a server checks a request before its batch, not knowing the shortlist yet: reassess checks it with the
        # result's own first stage (first_stage None with an index means "not known here", not "no index")
        other = (
            None
            if first_stage is None and self.index is not None
            else first_stage_mismatch(self.calibration, first_stage)
        )
        if other:
            raise ConfigError(other)
        if self.gallery_note:  # a set or a risk decision promised for another gallery: refused (issue 60)
            raise ConfigError(self._other_gallery_refusal(served))
        if request.coverage is not None:
            conformal_threshold(self.calibration, request.coverage, request.score)

    def _other_gallery_refusal(self, served: bool = False) -> str:
        """The one line refusing a set or a risk decision on a gallery other than the one calibrated on, and the
        ways out: search that gallery, or calibrate this run on this one where it can be (it holds the videos of
        the calibration's queries: :meth:`_calibrate_command`). `dab search`'s (issue 61, item 4) fits 120
        columns with "Error: " for a run path of about 20 characters: the warning above already described the two
        galleries, and the hint repeats no path the command line holds, only a store other than the one
        calibrated on. ``served``: said to a server's user, the server's own way out (restart it)."""
        assert self.calibration is not None
        run, g, calibrate = self.run.run_dir, self.calibration.gallery, self.calibrate_here
        other_store = g.get("store") is not None and not _same_place(g["store"], self.store_path)
        if not other_store and g.get("split") == self.split:  # the same gallery since changed: only calibrating
            if calibrate is None:
                split = self.calibration.provenance.get("split")
                return f"this gallery changed since {run} was calibrated on it and lacks split {split!r} to calibrate"
            changed = "this gallery changed since the calibration"  # the run's path is in the command
            return f"{changed}: run `{calibrate}`, then restart the server" if served else f"{changed}: {calibrate}"
        where = (f"--features {g['store']} " if other_store else "") + f"--split {g.get('split')}"
        if served:
            line = (
                f"{run} was calibrated on another gallery than this server's (split {self.split!r}): restart it "
                f"with `dab serve {where}` for sets and risk decisions"
            )
            return line if calibrate is None else f"{line}, or after `{calibrate}`"
        if calibrate is None:
            return f"{run} was calibrated on another gallery: search {where}"
        return f"calibrated on another gallery: search {where}, or {calibrate}"  # the run's path is in the command

    def _assess(
        self,
        results: list[SearchResult],
        text: torch.Tensor,
        requests: Sequence[Optional[UncertaintyRequest]],
        first_stage: Optional[dict] = None,
        checked: bool = False,
    ) -> list[SearchResult | ConfigError]:
        """Each result with its calibrated probabilities (a calibrated run) and the set and risk decision its
        request asks for; in its place the ConfigError of a request that cannot be met (:meth:`check_request`, once
        a request: not again where the caller ``checked`` it before the search)."""
        out: list[SearchResult | ConfigError] = list(results)
        tv = text_variance(self.run.model, text) if self.calibration is not None else None  # (M,) or None
        for i, (r, q) in enumerate(zip(results, requests)):
            try:
                if not checked:
                    self.check_request(q, first_stage)
                if self.calibration is not None:
                    r.text_var = None if tv is None else float(tv[i])
                    self._answer(r, q, first_stage)
            except ConfigError as exc:
                out[i] = exc
        return out

    def reassess(
        self, result: SearchResult, request: Optional[UncertaintyRequest], first_stage: Optional[dict] = None
    ) -> SearchResult:
        """``result`` (of this Searcher) with its calibrated answer to ``request`` (a server asks per query after
        the batch); a one-line ConfigError where the request cannot be met."""
        if first_stage is None and self.index is not None:  # a server's query: the shortlist it was ranked with
            first_stage = self.first_stage_identity(result.shortlist, None)
        self.check_request(request, first_stage)
        return self._answer(result, request, first_stage)

    def _answer(
        self, result: SearchResult, request: Optional[UncertaintyRequest], first_stage: Optional[dict] = None
    ) -> SearchResult:
        """``result`` with its calibrated answer to ``request``, already checked (:meth:`check_request`);
        ``first_stage``: the identity of the first stage it was ranked through (None: found here)."""
        if self.calibration is not None:
            tv = None if result.text_var is None else np.array([result.text_var])
            u = assess(self.calibration, [result.costs], tv, request, texts=[result.query])[0]
            why = self._not_calibrated(result, first_stage)
            if why:  # the numbers are shown marked, and decide nothing (issue 61, item 2)
                kind, line = why
                u = replace(u, caveat=line, caveat_kind=kind, answered=None)
                if kind == "unknown_words":  # numbers of no query: no set either, as for a request without one
                    u = replace(u, coverage=None, set_indices=None, set_scope=None, scope_note=None)
            result.uncertainty = u
        return result

    def _not_calibrated(self, result: SearchResult, first_stage: Optional[dict]) -> Optional[tuple[str, str]]:
        """(kind, line) where a result's probabilities are not calibrated ones (kinds: CAVEAT_KINDS): every word of
        its query unknown to the model, a gallery other than the one calibrated on, or a run calibrated through an
        index searched through another first stage (a request for a set or a risk is refused there, but bare
        probabilities are shown: marked); None where they are."""
        if result.unknown_words and set(query_words(result.query)) <= set(result.unknown_words):
            return (
                "unknown_words",
                "every word of the query is unknown to the store's CLIP: these numbers describe no query",
            )
        if self.gallery_note:
            return "gallery", self.gallery_note
        if self.calibration is not None and self.calibration.provenance.get("index"):
            if first_stage is None and self.index is not None:  # ranked through this searcher's index
                first_stage = self.first_stage_identity(result.shortlist, None)
            other = first_stage_mismatch(self.calibration, first_stage)
            if other:
                return "first_stage", other
        return None


def _same_place(recorded: str, searched: str | os.PathLike | StoreURL) -> bool:
    """Whether the store calibration.json recorded is the one searched: local paths compared resolved to absolute
    ones (a relative path recorded by an older ``dab calibrate`` resolved against the current directory, as it was
    given), URLs as written (``file://`` is a local path)."""
    try:
        a, b = location(str(recorded)), location(searched)
    except ConfigError:  # a protocol this machine cannot open: only the same text is the same place
        return str(recorded) == str(searched)
    if isinstance(a, StoreURL) or isinstance(b, StoreURL):
        return str(a) == str(b)
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # a loop of links: compared as written, made absolute
        return Path(os.path.abspath(a)) == Path(os.path.abspath(b))
