"""How `dab search` prints a calibrated answer (docs/uncertainty.md)."""

from __future__ import annotations

MAX_LISTED = 20  # videos of a conformal set named in a table's caption (the --json output lists every one)
SCOPES = {
    "marginal": "calibrated on average over queries",
    "band": "calibrated within this query's band",
    "groups": "calibrated within each of this query's groups",
}


def uncertainty_lines(result) -> list[str]:
    """The lines under a query's table: its calibrated probabilities, its conformal set, whether it is answered."""
    u = result.uncertainty
    if u is None:
        return []
    lines = [
        f"calibrated: P(first hit is a match) {u.p_first:.2f}, P(a match in the first {u.first_k}) {u.p_first_k:.2f}"
    ]
    if u.caveat is not None:
        lines.append(f"not calibrated here: {u.caveat}")
    if u.group is not None:
        lines.append(f"group: {u.group}")
    hits = result.coverage_set
    if hits is not None:
        ids = ", ".join(h.video_id for h in hits[:MAX_LISTED]) + (", ..." if len(hits) > MAX_LISTED else "")
        scope = SCOPES[u.set_scope] + (f" ({u.scope_note})" if u.scope_note else "")
        lines.append(f"{u.coverage:.0%} conformal set, {scope} ({len(hits)} videos): {ids}")
    if u.risk is not None:
        r = u.risk
        if u.answered is None:
            lines.append("not decided: the probability comes from a shortlist (above)")
        elif r.threshold is None:
            lines.append(
                f"not answered: no confidence threshold keeps the risk at {r.alpha:g} with probability "
                f"{1 - r.delta:g} on this calibration ({r.queries} held-out queries)"
            )
        elif u.answered:
            lines.append(f"answered: P {u.p_first:.2f} >= {r.threshold:.3f} (max risk {r.alpha:g}, delta {r.delta:g})")
        else:
            lines.append(
                f"not answered: P {u.p_first:.2f} < {r.threshold:.3f} (max risk {r.alpha:g}, delta {r.delta:g})"
            )
    return lines
