"""Pixels as CLIP saw them: dab's decode-time resize against open_clip's own transform, side by side.

dab's decoder resizes each sampled frame with FFmpeg's swscale (bicubic) straight to CLIP's
image size (``decode_short_side=0``, the default), then open_clip's eval transform centre-crops
it (its own resize is then a no-op). CLIP was trained with that transform resizing the
full-resolution image in PIL (bicubic with antialiasing). This script decodes the same
videos both ways and compares the features of every frame slot under a CLIP of ViT-B/32's
shape at 224 px (random weights: the architecture is what matters for how pixel differences
propagate; no weights can be downloaded here), on generated H.264 files of 640x360 and
1280x720 with fine textures and 1/f ("natural image") noise, where resamplers differ most.

    python benchmarks/resize.py [--videos 6] [--model ViT-B-32] [--seed 0]

Prints per resolution: the per-slot cosine between the two paths (min, 1st percentile,
mean), the largest absolute pixel difference after the transform, and videos/s of both
paths measured in the same process (decode + transform, CLIP excluded, then with CLIP).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image

from dab_pipeline.video import decode_video
from dab_pipeline.video.synthetic import write_video


def natural_frames(n: int, size: tuple[int, int], seed: int) -> np.ndarray:
    """(n, H, W, 3) uint8: moving colour 1/f noise plus a sharp grid and text-like strokes."""
    w, h = size
    rng = np.random.default_rng(seed)
    fy, fx = np.fft.fftfreq(2 * h)[:, None], np.fft.fftfreq(2 * w)[None, :]
    amp = 1.0 / np.maximum(np.sqrt(fx * fx + fy * fy), 1.0 / (2 * max(w, h)))
    field = np.stack(
        [np.real(np.fft.ifft2(amp * np.exp(2j * np.pi * rng.random((2 * h, 2 * w))))) for _ in range(3)], axis=-1
    )  # (2H, 2W, 3)
    field = (field - field.mean()) / field.std()
    frames = []
    for k in range(n):
        dy, dx = int(k * 3) % h, int(k * 5) % w
        img = 128 + 45 * field[dy : dy + h, dx : dx + w]
        img[::16, :] += 60  # a sharp grid: where antialiasing matters most
        img[:, ::16] += 60
        img[h // 3 : h // 3 + 3, w // 4 : 3 * w // 4] = 20  # thin dark strokes
        frames.append(np.clip(img, 0, 255).astype(np.uint8))
    return np.stack(frames)


def frames_both_ways(path: Path, preprocess, image_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The transformed frames (F, 3, S, S) of dab's default path and of open_clip's own resize of the full frame."""
    fast = decode_video(path, num_frames=12, short_side=image_size).frames  # swscale to the short side
    full = decode_video(path, num_frames=12, short_side=None).frames  # native size: PIL resizes
    to = lambda frames: torch.stack([preprocess(Image.fromarray(f)) for f in frames])
    return to(fast), to(full)


def rate(paths: list[Path], preprocess, short_side: Optional[int], model=None) -> float:
    t = time.perf_counter()
    for p in paths:
        x = torch.stack([preprocess(Image.fromarray(f)) for f in decode_video(p, 12, short_side=short_side).frames])
        if model is not None:
            with torch.no_grad():
                model.encode_image(x)
    return len(paths) / (time.perf_counter() - t)


def main(argv: Optional[list[str]] = None) -> dict:
    import open_clip

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=6, help="per resolution")
    ap.add_argument("--model", default="ViT-B-32")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    model, _, preprocess = open_clip.create_model_and_transforms(args.model, pretrained=None)
    model.eval()
    image_size = int(
        model.visual.image_size[0] if isinstance(model.visual.image_size, tuple) else model.visual.image_size
    )
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in ((640, 360), (1280, 720)):
            paths = []
            for i in range(args.videos):
                p = Path(tmp) / f"v{size[1]}_{i}.mp4"
                write_video(p, natural_frames(36, size, args.seed * 1000 + i), fps=12, fmt="x264")
                paths.append(p)
            cos, pix = [], []
            for p in paths:
                a, b = frames_both_ways(p, preprocess, image_size)
                pix.append(float((a - b).abs().max()))
                with torch.no_grad():
                    fa, fb = model.encode_image(a), model.encode_image(b)
                cos += torch.nn.functional.cosine_similarity(fa, fb, dim=-1).tolist()
            rates = {name: rate(paths, preprocess, ss) for name, ss in (("swscale", image_size), ("pil", None))}
            rates_clip = {
                name: rate(paths, preprocess, ss, model) for name, ss in (("swscale", image_size), ("pil", None))
            }
            row = {
                "slots": len(cos),
                "cos_min": min(cos),
                "cos_p1": float(np.percentile(cos, 1)),
                "cos_mean": statistics.mean(cos),
                "max_pixel_diff": max(pix),
                "videos_per_s": rates,
                "videos_per_s_with_clip": rates_clip,
            }
            out[f"{size[0]}x{size[1]}"] = row
            print(
                f"{size[0]}x{size[1]}: per-slot cosine min {row['cos_min']:.5f}, 1st pct {row['cos_p1']:.5f}, "
                f"mean {row['cos_mean']:.5f} over {row['slots']} slots; max |pixel diff| after the transform "
                f"{row['max_pixel_diff']:.3f} (normalised units); videos/s decode+transform: swscale "
                f"{rates['swscale']:.2f}, PIL {rates['pil']:.2f} (x{rates['swscale'] / rates['pil']:.2f}); with "
                f"CLIP: {rates_clip['swscale']:.2f} / {rates_clip['pil']:.2f}",
                flush=True,
            )
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
