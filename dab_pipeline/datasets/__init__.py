"""Dataset loaders: benchmark annotation files (or a user's own CSV/JSONL) -> a Catalogue of videos and captions.

Every loader has the signature ``loader(videos, annotations, **options)``:

* ``videos``: the folder holding the video files (``None``: the annotation folder);
* ``annotations``: a folder where the loader finds its standard files by name,
  or a single file (for the benchmarks, that file replaces the standard file of
  its kind and its folder supplies the others);
* ``options``: loader-specific settings; the catalogue records the ones that
  shaped it (plus ``warnings``, a list of messages about dropped ids) in ``options``.

Videos listed by the annotations but absent on disk are not an error: their ids
are collected in ``Catalogue.missing`` for the extract stage to report.
See docs/datasets.md for the formats and split rules."""

from __future__ import annotations

from .activitynet import ANET_TEST, ANET_TRAIN, load_activitynet  # noqa: F401
from .catalogue import (  # noqa: F401
    DATASETS,
    SPLITS,
    VIDEO_EXTENSIONS,
    CaptionItem,
    Catalogue,
    Loader,
    VideoItem,
    hash_split,
    load_dataset,
)
from .charades import CHARADES_FILES, load_charades  # noqa: F401
from .didemo import load_didemo  # noqa: F401
from .folder import load_folder  # noqa: F401
from .lsmdc import LSMDC_FILES, load_lsmdc  # noqa: F401
from .msrvtt import MSRVTT_DATA, MSRVTT_TEST, MSRVTT_TRAIN, load_msrvtt  # noqa: F401
from .msvd import load_msvd  # noqa: F401
from .survey import DatasetSurvey, SplitSurvey, survey_catalogue  # noqa: F401
from .vatex import VATEX_OFFICIAL, VATEX_VARIANT, load_vatex  # noqa: F401
