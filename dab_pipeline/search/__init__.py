"""Free-text search with a trained run over a feature store: :class:`Searcher` loads the run, the store, the
store's CLIP and (optionally) a ``dab index`` folder once and ranks queries; ``dab search`` and ``dab serve``
(``dab_pipeline.stages``) are its two users."""

from .descriptions import load_descriptions  # noqa: F401
from .query_encoder import encode_queries  # noqa: F401
from .results import SearchHit, SearchResult, check_queries, result_payload, uncertainty_payload  # noqa: F401
from .searcher import (  # noqa: F401
    DEFAULT_SHORTLIST,
    Searcher,
    SearcherOptions,
    open_searcher,
)

__all__ = [
    "load_descriptions",
    "SearchHit",
    "SearchResult",
    "Searcher",
    "SearcherOptions",
    "open_searcher",
    "encode_queries",
    "check_queries",
    "result_payload",
    "uncertainty_payload",
    "DEFAULT_SHORTLIST",
]
