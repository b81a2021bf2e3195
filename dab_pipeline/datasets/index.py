"""Deprecated: the dataset catalogue moved to :mod:`dab_pipeline.datasets.catalogue` (``DatasetIndex`` is
``Catalogue``, ``build_index`` is ``build_catalogue``), so that "index" names only the search's FAISS index.
Importing this module warns; it goes in a later release."""

from __future__ import annotations

import warnings

from .catalogue import (  # noqa: F401
    DATASETS,
    SPLITS,
    VIDEO_EXTENSIONS,
    CaptionItem,
    Catalogue,
    Loader,
    VideoItem,
    build_catalogue,
    caption_lists,
    check_disjoint,
    drop_uncaptioned,
    hash_split,
    holdout,
    in_dir,
    load_dataset,
    read_csv,
    read_json,
    read_list,
    reject_unknown,
    require_file,
    resolve_dirs,
    wanted_splits,
)

warnings.warn(
    "dab_pipeline.datasets.index is deprecated: import from dab_pipeline.datasets (DatasetIndex is now "
    "Catalogue, build_index is build_catalogue); the old module will be removed in a later release",
    DeprecationWarning,
    stacklevel=2,
)

DatasetIndex = Catalogue
build_index = build_catalogue
