"""dab: Distribution-Alignment Bridge for uncertainty-aware text-to-video retrieval."""

__version__ = "0.1.0"
