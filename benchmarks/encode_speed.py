"""Stage one's encoder alone: CLIP image-encoding throughput in videos/s (12 frames a video), no decoding.

Builds ``--clip`` (ViT-B-32 by default) with random weights saved to a local file (none can be
downloaded; the architecture decides the speed) and loads it through dab's ``load_clip`` in each
compute dtype asked for (``autocast-bf16``: the weights in float32, the products in bf16, what
``dab extract --dtype auto`` picks on a GPU with bf16), then encodes batches of preprocessed
frames of ``--batch`` videos through ``encode_images`` (what extraction runs), with and without
the token states of the last K blocks. Decoding is left out: on the GPU machine there is no
PyAV, and decoding is the CPU's side of extraction (docs/extraction.md measures it).

    python benchmarks/encode_speed.py [--device cuda] [--clip ViT-B-32] [--dtypes float32 autocast-bf16]
        [--batch 16] [--batches 10] [--states 0 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch


def main(argv: Optional[list[str]] = None) -> dict:
    import open_clip

    from dab_pipeline.clip_models import encode_images, load_clip
    from dab_pipeline.runtime.devices import resolve_device

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--clip", default="ViT-B-32")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "autocast-bf16"])
    ap.add_argument("--batch", type=int, default=16, help="videos per batch (12 frames each)")
    ap.add_argument("--batches", type=int, default=10, help="timed batches (after 2 warm-up ones)")
    ap.add_argument(
        "--states",
        type=int,
        nargs="+",
        default=[-1, 2],
        help="-1: features only; K: also the token states entering the last K blocks",
    )
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    out = {"device": str(device), "torch": torch.__version__, "clip": args.clip}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        path = Path(tmp) / "random.pt"
        if args.clip.startswith("dab-"):
            weights = None
        else:
            torch.save(open_clip.create_model(args.clip, pretrained=None).state_dict(), path)
            weights = str(path)
        for dtype in args.dtypes:
            bundle = load_clip(args.clip, weights, device=device, dtype=dtype)
            size = int(bundle.image_size)
            pixels = torch.randn(args.batch * 12, 3, size, size, device=device)
            for k in args.states:
                blocks = None if k < 0 else k
                with torch.no_grad():
                    for _ in range(2):
                        encode_images(bundle, pixels, blocks)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t = time.perf_counter()
                    for _ in range(args.batches):
                        encode_images(bundle, pixels, blocks)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                rate = args.batches * args.batch / (time.perf_counter() - t)
                name = f"{dtype}/{'features' if blocks is None else f'states K={blocks}'}"
                out[name] = rate
                print(
                    f"{args.clip} {name}: {rate:.1f} videos/s ({rate * 12:.0f} frames/s) at {args.batch} videos "
                    "a batch",
                    flush=True,
                )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
