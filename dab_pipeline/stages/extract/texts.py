"""How captions are cut at the text tower's context: the manifest's record and the line `dab extract` prints.

Every caption goes through open_clip's tokenizer, which keeps the start token, the first ``context - 2`` tokens and
the end token of a longer caption and drops the rest without a word (context 77 for ViT-B-32 and dab-tiny, 64 for
dab-world). That is the peers' policy too (X-Pool and T-MASS cut at 77 tokens; CLIP4Clip at 32 or 64 words), and
dab's only one: the record says so, and counts per split how many captions were cut and by how much.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ...clip_models import token_counts

TRUNCATION_POLICY = "truncate at the model's context"


def text_truncation(bundle, captions: Sequence) -> dict[str, Any]:
    """The manifest's ``text_truncation``: the policy, the context, and per split the captions, how many were cut,
    the longest (tokens, start and end included) and the tokens dropped in all (``splits`` None when the tokenizer
    cannot count)."""
    ctx = int(bundle.context_length)
    record: dict[str, Any] = {
        "policy": TRUNCATION_POLICY,
        "detail": f"open_clip's tokenizer keeps the start token, the first {ctx - 2} tokens and the end token; "
        "the rest of a longer caption is not encoded",
        "context_length": ctx,
        "splits": None,
    }
    counts = token_counts(bundle, [c.text for c in captions])
    if counts is None:
        record["note"] = "this tokenizer does not report lengths: cut captions were not counted"
        return record
    split_of = np.array([c.split for c in captions], dtype=object)
    splits = {}
    for split in dict.fromkeys(split_of.tolist()):  # first-seen order: train, val, test
        n = counts[split_of == split]
        cut = n[n > ctx]
        splits[split] = {
            "captions": int(len(n)),
            "cut": int(len(cut)),
            "longest_tokens": int(n.max()),
            "tokens_dropped": int((cut - ctx).sum()),
        }
    record["splits"] = splits
    return record


def truncation_line(record: Optional[dict]) -> Optional[str]:
    """One line saying which captions were cut and by how much; None when none was (or nothing was counted)."""
    splits = (record or {}).get("splits") or {}
    cut = {name: s for name, s in splits.items() if s["cut"]}
    if not cut:
        return None
    ctx = record["context_length"]
    parts = "; ".join(
        f"{name} {s['cut']} of {s['captions']} (longest {s['longest_tokens']} tokens, "
        f"{s['tokens_dropped'] / s['cut']:.0f} dropped on average)"
        for name, s in cut.items()
    )
    return (
        f"captions over the text tower's context of {ctx} tokens are truncated to it (the start token, the first "
        f"{ctx - 2} tokens, the end token): {parts}; recorded in the manifest (text_truncation)"
    )
