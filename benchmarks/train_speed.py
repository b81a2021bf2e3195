"""Training throughput on a store of MSR-VTT's shape, made on the spot with random features.

Builds an HDF5 store in a temporary folder (MSR-VTT 9k's shape by default: 9,000 training
videos x 12 frames x 512, 20 captions each, plus small val / test splits) and trains the paper's
model (D = 512, drift 1024, T' = 32, batch 32) through ``run_train``, the stage the CLI calls,
for a fixed number of steps, in each requested mode:

* ``frozen``: CLIP frozen, features from the store;
* ``finetune``: every CLIP block of both towers trained from the stored token states
  (``--clip`` built with random weights saved to a local file, since none can be
  downloaded), on a smaller store: a step's cost does not depend on the store's size.

with float32 and with bf16 autocast (``amp=bf16``; where the device has no native bf16 the
stage falls back to float32 and says so). Reports steps/s of the second epoch (the first
one pays for start-up), the time of one MSR-VTT-9k epoch of 180,000 caption-video pairs
(X-Pool's epoch: every caption once) at that rate, and the peak device memory.

    python benchmarks/train_speed.py [--device cuda] [--modes frozen finetune] [--amp none bf16]
        [--videos 9000] [--captions-per-video 20] [--steps 40] [--clip ViT-B-32] [--tiny]

``--tiny`` (the CPU check of benchmarks/device_check.sh): dab-tiny, D = 32, 48 videos, a few
steps: it checks that every path runs, not how fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

EPOCH_PAIRS = 180_000  # MSR-VTT 9k: 9,000 videos x 20 captions, every caption once per epoch


def clip_weights(name: str, folder: Path) -> tuple[Optional[str], dict]:
    """(pretrained argument, CLIP description) for ``name``: dab-tiny's own weights, or random weights in a file."""
    from dab_pipeline.clip_models import load_clip

    if name.startswith("dab-"):
        bundle = load_clip(name, None)
        return None, {"bundle": bundle}
    import open_clip

    torch.manual_seed(0)
    model = open_clip.create_model(name, pretrained=None)
    path = folder / f"{name}-random.pt"
    torch.save(model.state_dict(), path)
    return str(path), {"bundle": load_clip(name, str(path))}


def make_store(
    path: Path, bundle, pretrained: Optional[str], videos: int, per_video: int, k: Optional[int], seed: int = 0
) -> Path:
    """A random store with ``videos`` training videos (and 64 each for val and test) for ``bundle``'s CLIP."""
    from dab_pipeline.clip_models import full_depth
    from dab_pipeline.store import create_store

    rng = np.random.default_rng(seed)
    n = videos + 128
    split = ["train"] * videos + ["val"] * 64 + ["test"] * 64
    cvid = np.repeat(np.arange(n), per_video)
    d, f = int(bundle.embed_dim), 12
    depth = full_depth(bundle.model_name) if k is not None else None
    states: dict[str, Any] = {}
    if k is not None:
        v_tokens, v_width, t_width = bundle.vision_tokens, bundle.vision_width, bundle.text_width
        lengths = rng.integers(8, 24, len(cvid))
        states = {"vision_state_shape": (v_tokens, v_width), "text_state_width": t_width, "text_state_lengths": lengths}
    manifest = {
        "model": bundle.model_name,
        "pretrained": pretrained,
        "weights_sha256": bundle.weights_sha256,
        "frames": f,
        "dataset": "random",
        "trainable_blocks": k if k is not None else None,
        "clip": {"embed_dim": d, "logit_scale": 100.0},
        "depth": depth,
    }
    st = create_store(
        path,
        manifest=manifest,
        video_ids=[f"v{i}" for i in range(n)],
        video_split=split,
        caption_ids=[f"c{q}" for q in range(len(cvid))],
        caption_video_index=cvid,
        caption_text=["x"] * len(cvid),
        caption_split=[split[v] for v in cvid],
        num_frames=f,
        dim=d,
        dtype="float16",
        **states,
    )
    for a in range(0, n, 256):
        b = min(n, a + 256)
        centre = rng.normal(size=(b - a, 1, d)).astype(np.float32)
        frames = centre + 0.3 * rng.normal(size=(b - a, f, d)).astype(np.float32)
        vs = None
        if k is not None:
            vs = (
                0.5 * rng.normal(size=(b - a, f, states["vision_state_shape"][0], states["vision_state_shape"][1]))
            ).astype(np.float16)
        st.write_videos(np.arange(a, b), frames, np.ones((b - a, f), bool), np.full(b - a, 36), vs)
    for a in range(0, len(cvid), 4096):
        b = min(len(cvid), a + 4096)
        text = rng.normal(size=(b - a, d)).astype(np.float32)
        ts = None
        if k is not None:
            ts = [
                (0.5 * rng.normal(size=(int(states["text_state_lengths"][q]), states["text_state_width"]))).astype(
                    np.float16
                )
                for q in range(a, b)
            ]
        st.write_captions(np.arange(a, b), text, ts)
    st.close()
    return path


def train_once(store: Path, out: Path, amp: str, k: Optional[int], steps: int, device: str, tiny: bool) -> dict:
    from dab_pipeline.core.overrides import apply_overrides
    from dab_pipeline.runs.config import TrainConfig
    from dab_pipeline.stages.train import resolve_train_config, run_train
    from dab_pipeline.store import open_store

    sets = [
        f"amp={amp}",
        f"device={device}",
        "epochs=2",
        f"max_steps_per_epoch={steps}",
        "select_metric=last",
        "model.variant=dab",
        "batch_size=32" if not tiny else "batch_size=8",
        "warmup_ratio=0.1",
    ]
    if tiny:
        sets += ["model.steps=4", "model.drift_hidden=32", "model.time_embed_dim=8"]
    if k is not None:
        sets.append(f"trainable_blocks={k}")
    cfg = apply_overrides(TrainConfig(features=store, out=out), sets)
    with open_store(store) as st:
        cfg = resolve_train_config(cfg, st.manifest, {s.split("=")[0] for s in sets})
    if torch.cuda.is_available() and device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    run_train(cfg)
    log = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    precision = json.loads((out / "precision.json").read_text())
    sec = float(log[-1]["epoch_seconds"])
    per_s = steps / sec
    peak = (
        torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") and torch.cuda.is_available() else None
    )
    return {
        "amp_used": precision["amp"]["used"],
        "steps_per_s": per_s,
        "pairs_per_s": per_s * cfg.batch_size,
        "epoch_minutes": EPOCH_PAIRS / (per_s * cfg.batch_size) / 60,
        "peak_gib": peak,
        "final_loss": log[-1]["train_loss"],
    }


def main(argv: Optional[list[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--modes", nargs="+", default=["frozen", "finetune"], choices=["frozen", "finetune"])
    ap.add_argument("--amp", nargs="+", default=["none", "bf16"], choices=["none", "bf16"])
    ap.add_argument("--videos", type=int, default=9000)
    ap.add_argument("--finetune-videos", type=int, default=640, help="training videos of the fine-tuning store")
    ap.add_argument("--captions-per-video", type=int, default=20)
    ap.add_argument("--steps", type=int, default=40, help="steps per epoch (2 epochs; the second is timed)")
    ap.add_argument("--clip", default="ViT-B-32")
    ap.add_argument("--tiny", action="store_true", help="a CPU check of every path: dab-tiny, 48 videos, 3 steps")
    args = ap.parse_args(argv)
    from dab_pipeline.runtime.devices import resolve_device

    device = str(resolve_device(args.device))
    if args.tiny:
        args.clip, args.videos, args.finetune_videos, args.captions_per_video, args.steps = "dab-tiny", 48, 48, 2, 3
    out: dict[str, Any] = {"device": device, "torch": torch.__version__, "clip": args.clip}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pretrained, info = clip_weights(args.clip, root)
        bundle = info["bundle"]
        for mode in args.modes:
            k = None
            n = args.videos
            if mode == "finetune":
                from dab_pipeline.clip_models import full_depth

                k, n = full_depth(bundle.model_name), args.finetune_videos
            t0 = time.time()
            store = make_store(root / f"{mode}.h5", bundle, pretrained, n, args.captions_per_video, k)
            print(
                f"store {mode}: {n} training videos x {args.captions_per_video} captions, "
                f"{store.stat().st_size / 2**20:.0f} MiB, made in {time.time() - t0:.0f} s",
                flush=True,
            )
            for amp in args.amp:
                res = train_once(store, root / f"run-{mode}-{amp}", amp, k, args.steps, device, args.tiny)
                out[f"{mode}/{amp}"] = res
                peak = f", peak {res['peak_gib']:.2f} GiB" if res["peak_gib"] is not None else ""
                print(
                    f"{mode} ({'all ' + str(k) + ' CLIP blocks' if k else 'CLIP frozen'}), amp {amp} (ran "
                    f"{res['amp_used']}): {res['steps_per_s']:.2f} steps/s, {res['pairs_per_s']:.0f} pairs/s; one "
                    f"MSR-VTT-9k epoch of {EPOCH_PAIRS:,} pairs: {res['epoch_minutes']:.1f} min{peak}",
                    flush=True,
                )
    print(json.dumps(out, default=str))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
