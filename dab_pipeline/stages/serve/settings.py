"""What a server answers with (:class:`ServeSettings`), the checks a query passes, and what the abstain threshold
did on the run's test split."""

from __future__ import annotations

import math
import unicodedata
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Optional, Sequence

import numpy as np

from ...core.choices import SERVE_MAX_K
from ...core.errors import ConfigError
from ...metrics import kl_margin, threshold_outcome
from ...runs.costfile import read_costs
from ...runs.run_folder import RunFolder
from ...scoring.first_stage import check_shortlist

__all__ = [
    "ServeSettings",
    "MAX_BATCH_WAIT_MS",
    "abstain_report",
    "check_query",
    "check_query_string",
    "printable",
    "unknown_parameter",
    "use_threads",
]


MAX_BATCH_WAIT_MS = 1000.0  # a longer wait would hold every lone query for that long


@dataclass(frozen=True)
class ServeSettings:
    """What a server answers with: page defaults, limits, the abstain threshold."""

    k: int = 10
    max_k: int = SERVE_MAX_K
    shortlist: Optional[int] = None  # videos re-ranked a query (None: the Searcher's default)
    max_query_chars: int = 500
    abstain_below: Optional[float] = None  # the margin under which a query is flagged
    descriptions: dict = field(default_factory=dict)
    title: str = "dab search"
    max_batch: int = 16  # queries answered in one call at most (1: one at a time)
    batch_wait_ms: float = 5.0  # how long a batch waits for more queries after its first arrived

    def __post_init__(self) -> None:
        if self.abstain_below is not None and not math.isfinite(self.abstain_below):
            raise ConfigError(f"abstain_below must be a finite margin, got {self.abstain_below}")
        if not (math.isfinite(self.batch_wait_ms) and 0 <= self.batch_wait_ms <= MAX_BATCH_WAIT_MS):
            raise ConfigError(f"batch_wait_ms must be within 0..{MAX_BATCH_WAIT_MS:g} ms, got {self.batch_wait_ms}")
        for name in ("k", "max_k", "max_query_chars", "max_batch"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.k > self.max_k:  # the page and the API refuse a k above max_k: a default above it answers nothing
            raise ConfigError(f"k must be at most {self.max_k} (the most a query may ask for), got {self.k}")
        if self.shortlist is not None:  # else every query would be refused as the client's fault
            check_shortlist(self.shortlist)


def abstain_report(run_dir: Path, threshold: Optional[float]) -> Optional[dict]:
    """What ``threshold`` on the margin did on the run's test split: coverage and precision (R@1) there.

    None without a threshold or without the run's test costs (``costs_test.*``)."""
    if threshold is None:
        return None
    folder = RunFolder(run_dir)
    path = next((p for p in sorted(folder.path.glob("costs_test.*"))), None)
    if path is None:
        return {"threshold": threshold, "test": None, "note": f"no test costs in {run_dir}"}
    cm = read_costs(path)
    cost = cm.to_cost()  # (Q, V)
    ok = cm.gt >= 0
    if not ok.any() or cost.shape[1] < 2:
        return {"threshold": threshold, "test": None, "note": f"{path} has no queries with a known ground truth"}
    margin = kl_margin(cost[ok])
    correct = np.argmin(cost[ok], axis=1) == cm.gt[ok]
    coverage, precision = threshold_outcome(margin, correct, threshold)
    return {
        "threshold": threshold,
        "test": {
            "queries": int(ok.sum()),
            "coverage": coverage,
            "precision_at_1": None if math.isnan(precision) else precision,
            "precision_at_1_all": float(correct.mean()),
        },
    }


def check_query(q: Optional[str], max_chars: int) -> str:
    """The query text, or a :class:`ConfigError` saying what is wrong with it (the app answers 400)."""
    if q is None or not q.strip():
        raise ConfigError("the query q is empty: pass ?q=some+words")
    if len(q) > max_chars:
        raise ConfigError(f"the query is {len(q)} characters long; at most {max_chars} are accepted")
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn") for ch in q):
        raise ConfigError("the query holds control or unassigned characters; send plain text")
    return q.strip()


def check_query_string(raw: bytes, once: Collection[str] = (), known: Optional[Sequence[str]] = None) -> None:
    """A :class:`ConfigError` (400) for a query string that is not UTF-8 once percent-decoded (``q=%ff``), which
    the web framework would otherwise turn into U+FFFD characters and search for, that gives a parameter of
    ``once`` (the route's own) more than once: the framework would take the last without a word, or, with
    ``known`` (the parameters the route reads), that gives one it does not read: the framework would ignore it,
    and ``max-risk=0.2`` (the CLI's spelling) would answer without the risk decision asked for."""
    try:
        pairs = urllib.parse.parse_qsl(raw.decode("latin-1"), keep_blank_values=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise ConfigError("the query string is not valid UTF-8 (percent-encode the query's UTF-8 bytes)") from None
    given = [name for name, _ in pairs]
    for name in dict.fromkeys(given):  # in the order given
        if known is not None and name not in known:
            raise ConfigError(unknown_parameter(name, known))
        if name in once and given.count(name) > 1:
            raise ConfigError(f"the parameter {name!r} is given {given.count(name)} times: give it once")


def unknown_parameter(name: str, known: Sequence[str]) -> str:
    """The one line refusing a parameter the route does not read: the accepted ones, and the likely one where
    ``name`` is a known one spelt as the CLI spells it (``max-risk``) or in capitals (``K``)."""
    said = printable(name)[:40] + ("..." if len(name) > 40 else "")  # a client's text, echoed into the page
    near = name.lstrip("-").replace("-", "_").lower()
    hint = f" (did you mean {near!r}?)" if near in known else ""
    return f"unknown parameter {said!r}{hint}; accepted: {', '.join(known)}"


def printable(text: str) -> str:
    """``text`` without control and unassigned characters, to echo a refused query back into the page."""
    return "".join(ch for ch in text if unicodedata.category(ch) not in ("Cc", "Cs", "Co", "Cn"))


def use_threads(n: int) -> None:
    """The CPU threads a server process gives the model (torch) and the index (FAISS, where installed)."""
    import torch

    torch.set_num_threads(max(1, n))
    try:
        import faiss
    except ImportError:
        return
    faiss.omp_set_num_threads(max(1, n))
