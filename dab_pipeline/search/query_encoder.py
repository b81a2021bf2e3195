"""The query's side of a search: the store's own CLIP (the model and weights its manifest names, checked against
its record), so that a free-text query lands in the feature space of the stored captions; its text tower alone
where that is the same model (:func:`~dab_pipeline.clip_models.load_text_clip`), so a search need not import
open_clip."""

from __future__ import annotations

from typing import Sequence

import torch

from .. import clip_models
from ..clip_models import check_store_weights, encode_queries_short, load_text_clip
from ..core.errors import StoreError, UnknownNameError, WeightsError

__all__ = ["encode_queries", "load_query_clip"]


def load_query_clip(manifest: dict, device: str | torch.device):
    """The CLIP model and weights the store was built with, checked against the store's record."""
    name, pretrained = manifest.get("model"), manifest.get("pretrained")
    if not name:
        raise StoreError("the store's manifest names no CLIP model; cannot encode a query in its feature space")
    try:
        # its text tower alone where that is the same model (the query path then never imports open_clip, whose
        # package imports torchvision and timm: ~1.5 s of CPU); else the whole CLIP (clip_models.load imports it)
        bundle = load_text_clip(manifest, device) or clip_models.load_clip(
            name, pretrained, device=device, dtype="float32"
        )
    except (WeightsError, UnknownNameError) as exc:
        raise WeightsError(
            f"dab search encodes the query with the store's CLIP model {name} (pretrained={pretrained!r}) and needs "
            f"its weights, which are not available here: {exc}"
        ) from None
    check_store_weights(bundle, manifest, "a query encoded with them would not match the stored features")
    # a query needs the text tower only: the vision tower's weights (ViT-B/32: 88M parameters, 350 MB in
    # float32) would only fill a server's memory
    if hasattr(bundle.model, "visual"):
        bundle.model.visual = None
    return bundle


def encode_queries(manifest: dict, queries: Sequence[str], device: str | torch.device = "cpu") -> torch.Tensor:
    """Encode free-text queries with the CLIP model and weights the store was built with -> (M, D) float32.

    Raises :class:`WeightsError` (one line) when those weights are not available here
    or differ from the ones the store recorded.
    """
    return encode_queries_short(load_query_clip(manifest, device), list(queries))  # (M, D)
