"""The search's first stage: one vector per video in a FAISS index (faiss-cpu, an optional extra)."""

from .build import build_index, staging_path
from .faiss_index import FLAT_MAX, IndexMeta, VideoIndex, auto_factory, require_faiss
from .load import load_index
from .shards import SHARDS_FILE, ShardedIndex, build_sharded_index, shard_ranges
from .vectors import DEFAULT_VECTOR, VECTOR_KINDS, query_vectors, video_terms, video_vectors

__all__ = [
    "build_index",
    "staging_path",
    "FLAT_MAX",
    "IndexMeta",
    "VideoIndex",
    "auto_factory",
    "load_index",
    "SHARDS_FILE",
    "ShardedIndex",
    "build_sharded_index",
    "shard_ranges",
    "require_faiss",
    "DEFAULT_VECTOR",
    "VECTOR_KINDS",
    "query_vectors",
    "video_vectors",
    "video_terms",
]
