"""A split's inputs as a run's model reads them: the arrays in RAM, the run's fine-tuned CLIP heads and the
texts and frames through them. Shared by `dab train`, `dab evaluate` (the bridge report), `dab distill` and
:func:`dab_pipeline.runs.load.load_run` (a fine-tuned run's heads)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .. import clip_models
from ..clip_models import TextHead, VisionHead, check_store_weights

__all__ = ["SplitArrays", "TrainHeads", "text_state_batch", "score_inputs"]


class SplitArrays:
    """One split's inputs in RAM, on the training device, frozen or with CLIP states."""

    def __init__(self, split, device: torch.device, with_states: bool) -> None:
        self.split = split
        self.video_ids = split.video_ids
        self.caption_ids = split.caption_ids
        self.caption_video = torch.as_tensor(np.asarray(split.caption_video), dtype=torch.long)  # (Q,)
        self.text = torch.as_tensor(np.asarray(split.text), dtype=torch.float32)  # (Q, D)
        self.frames = torch.as_tensor(np.asarray(split.frames), dtype=torch.float32)  # (V, F, D)
        self.mask = torch.as_tensor(np.asarray(split.frame_mask), dtype=torch.bool)  # (V, F)
        self.with_states = with_states
        if with_states:
            # Kept in the store dtype (float16 token grids are large); cast per batch.
            self.vision_states = torch.as_tensor(np.asarray(split.vision_states))  # (V, F, [L,] W)
        self.views = self.view_states = None  # augmented training views (train split of a --train-views store)
        if getattr(split, "views", None) is not None:
            self.views = torch.as_tensor(np.asarray(split.views), dtype=torch.float32)  # (V, N, F, D)
            if with_states:
                self.view_states = torch.as_tensor(np.asarray(split.view_states))  # (V, N, F, [L,] W)
        self.device = device

    @property
    def num_views(self) -> int:
        return 0 if self.views is None else int(self.views.shape[1])

    @property
    def num_queries(self) -> int:
        return int(self.text.shape[0])

    @property
    def num_videos(self) -> int:
        return int(self.frames.shape[0])


class TrainHeads(torch.nn.Module):
    """The fine-tuned tails of both CLIP towers (partial fine-tuning), or nothing."""

    def __init__(self, manifest: dict, k: int, device: torch.device) -> None:
        super().__init__()
        # clip_models.load_clip, read here: loading a run that has no heads (a search's) leaves open_clip unimported
        bundle = clip_models.load_clip(manifest["model"], manifest.get("pretrained"), device="cpu", dtype="float32")
        check_store_weights(bundle, manifest, "fine-tuning from the store's token states needs the same weights")
        self.vision = VisionHead.from_bundle(bundle, k)
        self.text = TextHead.from_bundle(bundle, k)

    def encode_text(self, states, lengths) -> torch.Tensor:
        return self.text(states, lengths)

    def encode_frames(self, states: torch.Tensor) -> torch.Tensor:
        B, F = states.shape[:2]
        out = self.vision(states.flatten(0, 1))  # (B*F, D)
        return out.reshape(B, F, -1)  # (B, F, D)


def text_state_batch(feats: SplitArrays, qidx: torch.Tensor, device: torch.device):
    """CLIP text states of some captions: (B, W) pooled for K=0, or padded (B, T, W) + lengths for K>0."""
    split = feats.split
    rows = qidx.numpy()
    if split.text_offsets is not None:
        states, lengths = split.text_state_batch(rows)  # (B, T, W), (B,)
        return (
            torch.as_tensor(states, dtype=torch.float32, device=device),
            torch.as_tensor(lengths, dtype=torch.long, device=device),
        )
    states = np.asarray(split.text_states[rows], dtype=np.float32)  # (B, W)
    return torch.as_tensor(states, device=device), None


def score_inputs(heads: Optional[TrainHeads], feats: SplitArrays, device: torch.device, lo: int, hi: int):
    """Texts ``lo:hi`` (Q', D) and all frames (V, F, D) of a split, through the heads when fine-tuning."""
    if heads is None:
        return feats.text[lo:hi], feats.frames
    heads.eval()
    text = []
    for s in range(lo, hi, 256):
        q = torch.arange(s, min(s + 256, hi))
        st, ln = text_state_batch(feats, q, device)
        text.append(heads.encode_text(st, ln).float().cpu())
    text_t = torch.cat(text) if text else torch.zeros((0, feats.text.shape[1]))  # (Q', D)
    frames = []
    for s in range(0, feats.num_videos, 32):
        frames.append(heads.encode_frames(feats.vision_states[s : s + 32].to(device, torch.float32)).float().cpu())
    return text_t, torch.cat(frames)  # (V, F, D)
