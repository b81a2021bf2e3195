"""Pretraining ``dab-world``, the world's own small CLIP (docs/quality.md): a maintainer's script, outside the
library (as open_clip keeps its training app, ``open_clip_train``, outside ``open_clip``): dab loads the weights it
wrote (``dab_pipeline/weights/``) and never trains CLIP itself.

open_clip's model class (``open_clip.create_model("dab-world")``, config in
``model_configs/dab-world.json``) and loss (``open_clip.ClipLoss``), trained
contrastively on single frames of the world's pretraining part and their
frame-level captions (``generate.pretrain_frame``: its own random stream, never
a benchmark video). Deterministic from the config's seeds on a given machine
and torch version.

    python scripts/pretrain_dab_world.py --out dab_pipeline/weights

writes ``dab-world.pt`` (float16 state dict; the token embedding keeps only the
rows of the world's vocabulary, see :func:`compact_state`), ``dab-world.json``
(this config, the file's sha256, the zero-shot results) and ``dab-world.log``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import hashlib
import json
import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from dab_pipeline.clip_models import expand_compact_state, open_clip_with_our_models, quiet_open_clip
from dab_pipeline.core.fsutil import atomic_write_bytes, atomic_write_text
from dab_pipeline.metrics import t2v_metrics
from dab_pipeline.video import sample_frame_indices
from dab_pipeline.world.generate import WorldConfig, frame_caption_pairs, iter_world
from dab_pipeline.world.presets import PRETRAIN_SEED, world_preset
from dab_pipeline.world.render import render_video

MODEL = "dab-world"


@dataclass(frozen=True)
class PretrainConfig:
    seed: int = 0  # torch: initialisation and batch order
    world_seed: int = PRETRAIN_SEED  # the pretraining frames
    frames: int = 24000  # training pool of (frame, caption) pairs
    held_out: int = 1000  # further frames for the frame-to-caption check
    steps: int = 500
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup: float = 0.1  # fraction of the steps
    threads: int = 2
    zero_shot_world: str = "benchmark"  # world preset whose test split gives the video zero-shot numbers


def normalise(frames: np.ndarray, mean: tuple, std: tuple) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float: open_clip's eval transform on frames already at size."""
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255.0
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def _lr_factor(step: int, total: int, warmup: float) -> float:
    w = max(1, int(round(total * warmup)))
    if step < w:
        return (step + 1) / w
    return 0.5 * (1.0 + math.cos(math.pi * (step - w) / max(1, total - w)))


def world_vocabulary(tokenizer, texts: list[str]) -> torch.Tensor:
    """Sorted token ids of ``texts`` plus the specials and every word the world's grammar can produce."""
    grammar = [
        c.text for v in iter_world(WorldConfig(seed=PRETRAIN_SEED, train=600, val=0, test=0)) for c in v.captions
    ]
    ids = set()
    for start in range(0, len(texts) + len(grammar), 4096):
        chunk = (texts + grammar)[start : start + 4096]
        ids.update(tokenizer(chunk).unique().tolist())
    return torch.tensor(sorted(ids), dtype=torch.int64)


def compact_state(state: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """float16 copy of ``state`` whose token embedding keeps only ``rows`` (the world's vocabulary).

    The full table is 49,408 rows, 80 % of the parameters, of which the world uses
    fewer than 100; :func:`dab_pipeline.clip_models.expand_compact_state` expands the compact form back,
    with zeros for every other token.
    """
    out = {
        k: v.detach().to(torch.float16) if v.is_floating_point() else v.detach().clone()
        for k, v in state.items()
        if k != "token_embedding.weight"
    }
    table = state["token_embedding.weight"]
    out["token_embedding.rows"] = rows.clone()
    out["token_embedding.values"] = table[rows].detach().to(torch.float16)
    out["token_embedding.vocab_size"] = torch.tensor(table.shape[0])
    return out


def frame_to_caption(model, tokenizer, images: torch.Tensor, texts: list[str]) -> dict[str, float]:
    """Frame -> caption R@1/R@5 among the distinct held-out captions (a frame's own caption is the answer)."""
    caps = sorted(set(texts))
    index = {c: i for i, c in enumerate(caps)}
    with torch.no_grad():
        fi = model.encode_image(images, normalize=True)  # (N, D)
        fc = model.encode_text(tokenizer(caps), normalize=True)  # (C, D)
    order = (fi @ fc.T).argsort(dim=1, descending=True)  # (N, C)
    target = torch.tensor([index[t] for t in texts])
    rank = (order == target[:, None]).float().argmax(dim=1)  # (N,) 0-based
    return {
        "captions": len(caps),
        "R@1": float((rank < 1).float().mean() * 100),
        "R@5": float((rank < 5).float().mean() * 100),
        "chance_R@1": 100.0 / len(caps),
    }


def zero_shot_videos(model, tokenizer, mean: tuple, std: tuple, world: WorldConfig, frames: int = 12) -> dict:
    """CLIP4Clip's zero-shot baseline on a world's test split: cosine of the mean frame feature.

    Frames are rendered (no video codec) and sampled with X-Pool's rule; the
    queries are the 1K-A-like ones (one per test video). benchmarks/quality.py
    measures the same through mp4 files and the store.
    """
    videos = [v for v in iter_world(world) if v.split == "test"]
    feats = []
    with torch.no_grad():
        for i, v in enumerate(videos):
            clip = render_video(list(v.shots), world.size, seed=world.seed * 1_000_003 + i)
            idx, _ = sample_frame_indices(len(clip), frames)
            f = model.encode_image(normalise(clip[idx], mean, std), normalize=True).mean(dim=0)  # (D,)
            feats.append(torch.nn.functional.normalize(f, dim=0))
        video = torch.stack(feats)  # (V, D)
        text = model.encode_text(tokenizer([v.captions[v.test_query].text for v in videos]), normalize=True)
    cost = -(text @ video.T).numpy()  # (Q, V)
    m = t2v_metrics(cost, np.arange(len(videos)))
    return {"videos": len(videos), **{k: m[k] for k in ("R@1", "R@5", "R@10", "MnR")}, "chance_R@1": 100 / len(videos)}


def pretrain(cfg: PretrainConfig, log: Callable[[str], None] = print) -> tuple[dict[str, torch.Tensor], dict]:
    """Train dab-world; returns (compact float16 state dict, report)."""
    open_clip = open_clip_with_our_models()  # with dab-world's config registered

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    with quiet_open_clip():  # "initialised randomly" is the point here
        model = open_clip.create_model(MODEL)
    tokenizer = open_clip.get_tokenizer(MODEL)
    mean, std = model.visual.preprocess_cfg["mean"], model.visual.preprocess_cfg["std"]
    t0 = time.time()
    frames, texts = frame_caption_pairs(cfg.world_seed, cfg.frames + cfg.held_out, model.visual.image_size)
    log(f"{len(texts)} pretraining frames ({len(set(texts))} distinct captions) in {time.time() - t0:.1f} s")
    images = normalise(frames, mean, std)  # (N, 3, S, S)
    tokens = tokenizer(texts)  # (N, L)
    loss_fn = open_clip.ClipLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    t0 = time.time()
    model.train()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = cfg.lr * _lr_factor(step, cfg.steps, cfg.warmup)
        idx = torch.randint(0, cfg.frames, (cfg.batch_size,), generator=gen)
        image_features, text_features, logit_scale = model(images[idx], tokens[idx])[:3]
        loss = loss_fn(image_features, text_features, logit_scale)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        if step % 50 == 0 or step == cfg.steps - 1:
            log(
                f"step {step + 1}/{cfg.steps} loss {loss.item():.4f} logit scale {model.logit_scale.exp().item():.1f} "
                f"({time.time() - t0:.0f} s)"
            )
    train_seconds = time.time() - t0
    rows = world_vocabulary(tokenizer, texts)
    state = compact_state(model.state_dict(), rows)
    # Evaluate what ships: the float16 compact file loaded the way dab loads it.
    with quiet_open_clip():
        shipped = open_clip.create_model(MODEL)
    shipped.load_state_dict({k: v.float() for k, v in expand_compact_state(dict(state)).items()})
    shipped.eval()
    held = images[cfg.frames :]
    report = {
        "train_seconds": round(train_seconds, 1),
        "vocabulary_rows": int(len(rows)),
        "frame_to_caption": frame_to_caption(shipped, tokenizer, held, texts[cfg.frames :]),
    }
    report["zero_shot_video"] = {
        "world": cfg.zero_shot_world,
        **zero_shot_videos(shipped, tokenizer, mean, std, world_preset(cfg.zero_shot_world)),
    }
    log(f"held-out frame -> caption: {report['frame_to_caption']}")
    log(f"zero-shot video retrieval ({cfg.zero_shot_world} test split): {report['zero_shot_video']}")
    return state, report


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="pretrain dab-world, the world's CLIP")
    ap.add_argument("--out", type=Path, required=True, help="folder for dab-world.pt / .json / .log")
    ap.add_argument("--steps", type=int, default=PretrainConfig.steps)
    ap.add_argument("--frames", type=int, default=PretrainConfig.frames, help="training pool size")
    ap.add_argument("--zero-shot-world", default=PretrainConfig.zero_shot_world)
    args = ap.parse_args(argv)
    cfg = dataclasses.replace(
        PretrainConfig(), steps=args.steps, frames=args.frames, zero_shot_world=args.zero_shot_world
    )
    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    log(
        f"dab-world pretraining {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')} on "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {cfg.threads} threads"
    )
    log(f"config: {json.dumps(dataclasses.asdict(cfg))}")
    state, report = pretrain(cfg, log)
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    atomic_write_bytes(args.out / f"{MODEL}.pt", data)
    meta = {
        "model": MODEL,
        "file": f"{MODEL}.pt",
        "sha256": sha256_bytes(data),
        "bytes": len(data),
        "config": dataclasses.asdict(cfg),
        "report": report,
        "torch": torch.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    atomic_write_text(args.out / f"{MODEL}.json", json.dumps(meta, indent=2) + "\n")
    atomic_write_text(args.out / f"{MODEL}.log", "\n".join(lines) + "\n")
    log(f"wrote {args.out / f'{MODEL}.pt'} ({len(data) / 1e6:.2f} MB, sha256 {meta['sha256'][:16]}...)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
