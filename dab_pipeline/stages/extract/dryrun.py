"""`dab extract --dry-run`: the annotations read and the videos folder listed, nothing decoded, no CLIP loaded."""

from __future__ import annotations

from ...datasets import DatasetSurvey, load_dataset, survey_catalogue
from .config import ExtractConfig, parse_options


def dry_run_extract(cfg: ExtractConfig, first: int = 5) -> DatasetSurvey:
    """What `dab extract` with ``cfg`` would extract: per split the videos, queries and captions, the videos
    missing on disk, duplicate and empty queries (the first ``first`` of each), and the loader's warnings.

    The same catalogue as the extraction's (``--limit`` applied the same way); a wrong layout or a malformed
    file raises the loader's :class:`~dab_pipeline.core.errors.DatasetError`, as the extraction would."""
    catalogue = load_dataset(cfg.dataset, cfg.videos, cfg.annotations, **parse_options(cfg.dataset_options))
    return survey_catalogue(catalogue, limit=cfg.limit, first=first)
