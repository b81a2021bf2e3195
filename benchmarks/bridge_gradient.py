"""Does the training signal ask the bridge for a pair-dependent move? The PAC gradient at the bridged text, per pair.

For a trained dab run (and the same model with its drift's output layer zeroed, as at
initialisation), on training batches of the run's size: the gradient of the PAC loss with
respect to the bridged text mean, for every (text, video) pair of the batch (B x B x D), split
like the bridge's own shift (metrics.shift_decomposition) into a part common to every pair,
parts that depend on the text or the video alone, and the part that depends on the pair.
A large pair part means the loss asks each pair for its own move (pull the matched pair,
push the others): the signal a cross-encoding bridge would need. Also: the share of that
pair part that lies along each pair's own residual (mu_v - mu_t), which a drift could
produce by scaling the residual per pair.

    python benchmarks/bridge_gradient.py RUN [RUN ...] [--batches 20]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from dab_pipeline.metrics import shift_decomposition
from dab_pipeline.model.losses import contrastive_loss, loss_of
from dab_pipeline.runs.load import load_run
from dab_pipeline.store import open_store

READOUT = "pair part a linear readout of the drift's features predicts (held out)"


def gradient_shares(model, text, frames, mask, batches: int, batch: int, seed: int = 0) -> dict[str, float]:
    """Mean over batches of the decomposition of dL/d(bridged mu) and dL/d(bridged logvar) (keys ``logvar ...``), and
    the residual-aligned share of the mu gradient's pair part."""
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, list[float]] = {}
    aligned = []
    feats, targets = [], []  # the output layer's input at the first step, and the gradient's pair part
    seen: list = []
    hook = model.bridge.drift[-1].register_forward_hook(lambda mod, inp, out: seen.append(inp[0].detach()))
    model.eval()  # no dropout: the gradient of the function that scores
    for _ in range(batches):
        seen.clear()
        q = torch.randperm(len(text), generator=gen)[:batch]
        ts = model.encode_text(text[q])
        vs = model.encode_video(frames[q], mask[q])
        terms = model.pair_terms(ts, vs)
        terms.bridged_mu.retain_grad()
        terms.bridged_logvar.retain_grad()
        loss = contrastive_loss(loss_of(model.cfg.spec), terms.cost, model.temperature())
        loss.backward()
        g = terms.bridged_mu.grad.detach().double().numpy()  # (B, B, D)
        for k, v in shift_decomposition(g).items():
            parts.setdefault(k, []).append(v)
        for k, v in shift_decomposition(terms.bridged_logvar.grad.detach().double().numpy()).items():
            parts.setdefault(f"logvar {k}", []).append(v)
        m = g.mean(axis=(0, 1))
        a, b = g.mean(axis=1) - m, g.mean(axis=0) - m
        e = g - m - a[:, None] - b[None]  # (B, B, D) the pair part
        r = (terms.video_mu - ts.mu[:, None]).detach().double().numpy()  # (B, B, D) residual mu_v - mu_t
        r /= np.maximum(np.linalg.norm(r, axis=-1, keepdims=True), 1e-12)
        along = (e * r).sum(-1, keepdims=True) * r  # projection on the pair's own residual
        aligned.append(float((along**2).sum() / max((e**2).sum(), 1e-30)))
        feats.append(seen[0].double().numpy().reshape(-1, seen[0].shape[-1]))  # (B*B, H) at the first step
        targets.append(e.reshape(-1, e.shape[-1]))  # (B*B, D)
        model.zero_grad(set_to_none=True)
    hook.remove()
    out = {k: float(np.mean(v)) for k, v in parts.items()}
    out["pair part along mu_v - mu_t"] = float(np.mean(aligned))
    out[READOUT] = heldout_r2(feats, targets)
    return out


def heldout_r2(feats: list[np.ndarray], targets: list[np.ndarray], ridge: float = 1e-3) -> float:
    """R^2 on the last quarter of the batches of a ridge fit, on the others, of the targets from the features (with a
    constant): how much of the requested per-pair move the drift's output layer could produce from what it sees."""
    cut = max(1, len(feats) * 3 // 4)
    x_fit, y_fit = np.concatenate(feats[:cut]), np.concatenate(targets[:cut])
    x_test, y_test = np.concatenate(feats[cut:]), np.concatenate(targets[cut:])
    x_fit = np.hstack([x_fit, np.ones((len(x_fit), 1))])
    x_test = np.hstack([x_test, np.ones((len(x_test), 1))])
    gram = x_fit.T @ x_fit
    w = np.linalg.solve(gram + ridge * np.trace(gram) / len(gram) * np.eye(len(gram)), x_fit.T @ y_fit)
    resid = y_test - x_test @ w
    return float(1.0 - (resid**2).sum() / max((y_test**2).sum(), 1e-30))


def main(argv: Optional[list[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--batches", type=int, default=20)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    results = {}
    for run_dir in args.runs:
        run = load_run(run_dir)
        cfg = run.config
        with open_store(cfg.features) as st:
            train = st.load_split(cfg.train_split)
        text = torch.as_tensor(np.asarray(train.text, np.float32))
        cap_video = torch.as_tensor(np.asarray(train.caption_video, np.int64))
        frames = torch.as_tensor(np.asarray(train.frames, np.float32))[cap_video]
        mask = torch.as_tensor(np.asarray(train.frame_mask))[cap_video]
        trained = gradient_shares(run.model, text, frames, mask, args.batches, cfg.batch_size)
        with torch.no_grad():  # the same model at the start of the bridge's training: the output layer at zero
            run.model.bridge.drift[-1].weight.zero_()
            run.model.bridge.drift[-1].bias.zero_()
        at_zero = gradient_shares(run.model, text, frames, mask, args.batches, cfg.batch_size)
        results[str(run_dir)] = {"trained": trained, "drift output zeroed": at_zero}
        for name, r in results[str(run_dir)].items():
            print(
                f"{run_dir} ({name}): dL/d(bridged mu) is {100 * r['constant']:.1f} % common to every pair, "
                f"{100 * r['text']:.1f} % text, {100 * r['video']:.1f} % video, {100 * r['interaction']:.1f} % "
                f"pair; of the pair part {100 * r['pair part along mu_v - mu_t']:.1f} % lies along mu_v - mu_t; "
                f"dL/d(bridged logvar): {100 * r['logvar constant']:.1f} % common, {100 * r['logvar interaction']:.1f} "
                f"% pair; a linear readout of the drift's features predicts {100 * r[READOUT]:.1f} % of the "
                "pair part on held-out batches",
                flush=True,
            )
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
