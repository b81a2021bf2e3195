"""Which words of a query a CLIP model can read: a model shipped with a compact vocabulary (``dab-world``, 46
words) gives every other token a zero embedding, so a query of unknown words reads as blanks and ranks the
videos the same for any of them. Models with their whole BPE table know every word."""

from __future__ import annotations

import re
from typing import Sequence

from torch import Tensor

from .bundle import ClipBundle
from .tokenizer import is_bpe_tokenizer

__all__ = ["query_words", "unknown_words", "unknown_words_line"]

_PUNCTUATION = ".,;:!?\"'()[]{}"


def query_words(text: str) -> tuple[str, ...]:
    """A text's words as written, punctuation stripped, each once, in order: what :func:`unknown_words` reads."""
    return tuple(w for w in dict.fromkeys(w.strip(_PUNCTUATION) for w in re.split(r"\s+", str(text))) if w)


def unknown_words(bundle: ClipBundle, texts: Sequence[str]) -> list[tuple[str, ...]]:
    """For each text, the words (as written, punctuation stripped, each once) that hold a token the model has no
    embedding for; empty tuples for a model that knows every token or whose tokenizer is not open_clip's BPE."""
    known, tok = bundle.known_tokens, bundle.tokenizer
    if known is None or not is_bpe_tokenizer(tok):
        return [() for _ in texts]
    out = []
    for text in texts:
        out.append(tuple(w for w in query_words(text) if any(not _knows(known, t) for t in tok.encode(w))))
    return out


def _knows(known: Tensor, token: int) -> bool:
    return 0 <= token < len(known) and bool(known[token])


def unknown_words_line(query: str, words: Sequence[str], model: str) -> str:
    """One line naming the words of ``query`` that ``model`` does not know, and what becomes of them: each token
    is read as a blank (a zero embedding), not left out, so it still moves the ranking (issue 61, item 3)."""
    listed = ", ".join(repr(w) for w in words)
    if len(words) == 1:
        what = f"the word {listed} (no embedding): it is read as a blank"
    else:
        what = f"the words {listed} (no embedding): they are read as blanks"
    return f"query {query!r}: {model} does not know {what}; rephrase with words its captions use"
