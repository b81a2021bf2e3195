"""Stage one: decode videos, encode frames and captions with CLIP, cache them in a store.

Decoding (and CLIP's own PIL preprocessing) runs in DataLoader worker
processes, overlapped with batched encoding in the main process; results are
written to the store batch by batch, so a killed run resumes where it stopped.

* ``config``: ExtractConfig, the store manifest, the compatibility rules of a resume;
* ``build``: ``build_extract_config``, the config of one call from typed values (the CLI's and a script's);
* ``workers``: the decoding dataset and the encode-and-write loop;
* ``writers``: one store, Zarr shares or HDF5 part files (what differs between one process and many);
* ``run``: ``run_extract``, one code path for one process and every rank of a torchrun job;
* ``dryrun``: ``dry_run_extract``, what a run would read (counts, missing videos), nothing decoded;
* ``texts``: how captions are cut at the text tower's context (the manifest's ``text_truncation``).
"""

from __future__ import annotations

from .build import build_extract_config, default_pretrained  # noqa: F401
from .config import (  # noqa: F401
    COMPATIBILITY_KEYS,
    ExtractConfig,
    ExtractResult,
    build_manifest,
    parse_options,
    resolve_compute_dtype,
)
from .dryrun import dry_run_extract  # noqa: F401
from .run import run_extract  # noqa: F401
from .texts import TRUNCATION_POLICY, text_truncation, truncation_line  # noqa: F401
from .workers import DecodeDataset, collate_items, decode_worker_init, encode_captions, encode_videos  # noqa: F401
from .writers import (  # noqa: F401
    ExistingStore,
    ExtractJob,
    H5PartsWriter,
    StoreWriter,
    ZarrSharesWriter,
    check_part_files,
    check_resumable,
    choose_writer,
)
