"""How `dab search` prints a calibrated answer (docs/uncertainty.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `dab --help` must not import torch (the search package does)
    # both through search, whose results carry the answer: the CLI draws no arrow to calibration (test_architecture)
    from ...search.results import QueryUncertainty, SearchResult

MAX_LISTED = 20  # videos of a conformal set named in a table's caption (the --json output lists every one)
SCOPES = {
    "marginal": "calibrated on average over queries",
    "band": "calibrated within this query's band",
    "groups": "calibrated within each of this query's groups",
}
# a caveat (QueryUncertainty.caveat_kind, calibration/assess.py's CAVEAT_KINDS) in a few words: the long form of
# another gallery and of unknown words is a warning printed before the tables, not repeated under each; on stderr,
# so the words here name the condition themselves (stdout may be all that was kept)
LABELS = {"shortlist": "a shortlist", "gallery": "another gallery", "first_stage": "another first stage"}
REASONS = {
    "shortlist": "the probability comes from a shortlist (above)",
    "first_stage": "the first stage is not the one the run was calibrated through (above)",
    "gallery": "the gallery searched is not the one calibrated on (see the warning)",
    "unknown_words": "every word of the query is unknown (see the warning)",
}


def uncertainty_lines(result: SearchResult) -> list[str]:
    """The lines under a query's table: its calibrated probabilities, its conformal set, whether it is answered.

    Numbers that do not hold here (a caveat) are never labelled "calibrated": marked "~" with a short reason, or
    not printed for a query of no known word (they describe no query); the JSON keeps them with the caveat."""
    u = result.uncertainty
    if u is None:
        return []
    kind = u.caveat_kind
    if kind == "unknown_words":
        lines = [f"not calibrated here: {REASONS[kind]}: no probability or set describes it"]
    elif not u.probabilities_hold:
        lines = [f"not calibrated here ({LABELS[kind]}): {_numbers(u, mark='~')}"]
        # a shortlist's or a first stage's caveat is said nowhere else; another gallery's is the warning above
        lines.append(f"why: {u.caveat if kind in ('shortlist', 'first_stage') else REASONS[kind]}")
    else:
        lines = [f"calibrated: {_numbers(u, note=_map_note(u))}"]
    if u.group is not None:
        lines.append(f"group: {u.group}")
    hits = result.coverage_set
    if hits is not None:
        ids = ", ".join(h.video_id for h in hits[:MAX_LISTED]) + (", ..." if len(hits) > MAX_LISTED else "")
        if kind == "shortlist":  # its why: said once, under the numbers
            lines.append(
                f"{u.coverage:.0%} conformal set over a shortlist, not calibrated here ({len(hits)} videos): {ids}"
            )
        else:
            scope = SCOPES[u.set_scope] + (f" ({u.scope_note})" if u.scope_note else "")
            lines.append(f"{u.coverage:.0%} conformal set, {scope} ({len(hits)} videos): {ids}")
    if u.risk is not None:
        r = u.risk
        if u.answered is None:
            lines.append(f"not decided: {REASONS.get(kind, 'the probability is not a calibrated one')}")
        elif r.threshold is None:
            held = f"{r.queries} queries" + (f" of {r.videos} videos" if r.videos else "")
            lines.append(
                f"not answered: no threshold holds the risk at {r.alpha:g} with probability {1 - r.delta:g} "
                f"(held out: {held})"
            )
        elif u.answered:
            lines.append(f"answered: P {u.p_first:.2f} >= {r.threshold:.3f} (max risk {r.alpha:g}, delta {r.delta:g})")
        else:
            lines.append(
                f"not answered: P {u.p_first:.2f} < {r.threshold:.3f} (max risk {r.alpha:g}, delta {r.delta:g})"
            )
    return lines


def _numbers(u: QueryUncertainty, mark: str = "", note: str = "") -> str:
    """P(first) (then ``note``) and P(a match in the first k), each after ``mark`` ("~": not calibrated here)."""
    first_k = f"P(a match in the first {u.first_k}) {mark}{u.p_first_k:.2f}"
    return f"P(first hit is a match) {mark}{u.p_first:.2f}{note}, {first_k}"


def _map_note(u: QueryUncertainty) -> str:
    """After P(first): where its map is the raw softmax (nothing fitted), which, and why it is the one (issue 61,
    item 6); nothing for a fitted map."""
    if u.first_map != "softmax":
        return ""
    # within 120 columns with the rest of the line at any k below 1,000
    return (
        " (raw softmax, least cross-validated loss)" if u.map_method == "auto" else " (raw softmax: --method softmax)"
    )
