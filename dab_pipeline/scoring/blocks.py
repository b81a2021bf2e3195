"""The engine's per-text and per-video blocks, slot packing and the oneDNN bf16 linears."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass
class Texts:
    """Per-text state of the engine (rows of Q)."""

    q: Tensor  # (Q, Hh, Dh) pooling queries, already scaled by 1/sqrt(Dh)
    unit: Optional[Tensor] = None  # (Q, D) t / |t| (xpool cost)
    mu: Optional[Tensor] = None  # (Q, D) text Gaussian (prob/dab)
    logvar: Optional[Tensor] = None  # (Q, D)
    first: Optional[Tensor] = None  # (Q, H) first bridge step: state block + time feature + bias
    factor: Optional[Tensor] = None  # (Q, D, R) the text's U (covariance lowrank:R)
    mix_mu: Optional[Tensor] = None  # (Q, K, D) the text's components (covariance mixture:K; mu, logvar: moments)
    mix_logvar: Optional[Tensor] = None  # (Q, K, D)
    mix_logits: Optional[Tensor] = None  # (Q, K) their weights before the softmax
    text_var: Optional[Tensor] = None  # (Q,) mean sigma^2 of the text before any bridge (Table 6's "text")
    kl_pack: Optional[Tensor] = None  # (Q, (3 + R) D) a low-rank text's share of each KL (lowrank_text_pack)
    kl_const: Optional[Tensor] = None  # (Q,) and its constant

    def take(self, idx: slice | Tensor | tuple) -> "Texts":
        """Rows ``idx``: a slice or index tensor (Q' rows), or ``(None, slice)`` / ``(slice, None)`` to add a
        broadcast axis, or an index grid (B, M) -> fields (B, M, ...)."""
        fields = (self.q, self.unit, self.mu, self.logvar, self.first, self.factor, self.mix_mu, self.mix_logvar)
        fields += (self.mix_logits, self.text_var, self.kl_pack, self.kl_const)
        return Texts(*(None if t is None else t[idx] for t in fields))


@dataclass
class Videos:
    """Per-video state of the engine (rows of V)."""

    mask: Tensor  # (V, F) bool
    key_t: Tensor  # (V, Hh, Dh, F) pooling keys, transposed for the logits product
    ur: Tensor  # (V, R, 2D) [U | Rm]: y = w @ U, (o - r0) / rs1 = w @ Rm
    c_basis: Optional[Tensor] = None  # (V, R + 2, Cc): W2 v_c + b2 (prob/dab) or the point bridge's target
    g_heads: Optional[Tensor] = None  # (V, R + 3, 2D): [mu | logvar] heads of the video Gaussian
    g_target: Optional[Tensor] = None  # (V, R + 3, H): the bridge's mu_v block (dab)
    tok: Optional[Tensor] = None  # (V, D) W1 h_bar + b1 (prob/dab)
    # prob/dab: the per-pair LayerNorm statistics as quadratic forms in the attention weights
    quad1: Optional[Tensor] = None  # (V, R, R): var of LN_attn's input = w^T quad1 w
    quad2: Optional[Tensor] = None  # (V, R + 1, R + 1): var of LN_out's input = z^T quad2 z, z = [rs1 w, 1]
    quad3: Optional[Tensor] = None  # (V, R + 1, R + 3): [M3 | k3 | k4], moments of v_c (see videos())
    g_all: Optional[Tensor] = None  # (V, R + 3, D + 2D [+ H]): [token term / g | heads | mu_v block]

    def take(self, idx: slice | Tensor) -> "Videos":
        return Videos(
            *(
                None if t is None else t[idx]
                for t in (
                    self.mask,
                    self.key_t,
                    self.ur,
                    self.c_basis,
                    self.g_heads,
                    self.g_target,
                    self.tok,
                    self.quad1,
                    self.quad2,
                    self.quad3,
                    self.g_all,
                )
            )
        )

    def __len__(self) -> int:
        return self.mask.shape[0]


def pack_kept(x: Tensor, keep: Optional[Tensor], n_b: int, n_m: int) -> Tensor:
    """(1 | B, M, ...) -> the kept slots of the (B, M) grid as (P, 1, ...), so the bridge never sees padding.

    ``keep`` (B*M,) bool or None (every slot kept: ``x`` unchanged).
    """
    if keep is None:
        return x
    x = x.expand(n_b, n_m, *x.shape[2:])
    return x.reshape(n_b * n_m, *x.shape[2:])[keep][:, None]


class OneDNN:
    """bf16 linears on weights pre-packed for oneDNN (its AMX / AVX512-BF16 kernels on CPU).

    ``torch.ops.mkldnn._linear_pointwise`` is what torch.compile's CPU backend emits for
    a linear; called directly it skips the per-call weight reorder of ``torch.mm`` and
    fuses the bias and an elementwise add into the product's epilogue.
    """

    def __init__(self, weights: list[Tensor], biases: list[Optional[Tensor]]) -> None:
        self.weights, self.biases = weights, biases

    @staticmethod
    def pack(linears: list[tuple[Tensor, Optional[Tensor]]], batch_hint: int) -> Optional["OneDNN"]:
        """(weight (out, in) float32, bias (out,) | None) each -> packed bf16, or None where unsupported."""
        try:
            if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
                return None
            weights, biases = [], []
            for w, b in linears:
                weights.append(
                    torch.ops.mkldnn._reorder_linear_weight(w.contiguous().to(torch.bfloat16), max(1, batch_hint))
                )
                biases.append(None if b is None else b.to(torch.bfloat16))
            eng = OneDNN(weights, biases)
            x = torch.zeros(2, linears[0][0].shape[1], dtype=torch.bfloat16)
            eng.linear(x, 0)  # a build without these ops fails here, not mid-run
            return eng
        except (RuntimeError, AttributeError):
            return None

    def linear(self, x: Tensor, i: int) -> Tensor:
        """x (P, in) bf16 -> x W_i^T + b_i (P, out) bf16."""
        return torch.ops.mkldnn._linear_pointwise(x, self.weights[i], self.biases[i], "none", [], "")

    def add(self, x: Tensor, other: Tensor, i: int, bias: Optional[Tensor] = None) -> Tensor:
        """x W_i^T + bias + other, the add fused into the product; other (P, out) bf16."""
        b = bias if bias is not None else self.biases[i]
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.weights[i], b, "add")


# ---- the merged weights' helpers (the engines and the budget)

BIAS_PAD = 16  # columns after H in the hidden buffers: a 1 (bias input) and zeros


def center(x: Tensor) -> Tensor:
    return x - x.mean(dim=-1, keepdim=True)


def linear_layers(seq: torch.nn.Sequential) -> list[torch.nn.Linear]:
    return [m for m in seq if isinstance(m, torch.nn.Linear)]


class Linears:
    """A few ``x @ w + b`` products in the engine's matmul dtype: bf16 on CPU through :class:`OneDNN` (weights packed
    once), else ATen's products on weights cast once. Each returns its result in the matmul dtype."""

    def __init__(
        self, mats: list[tuple[Tensor, Optional[Tensor]]], mm_dtype: torch.dtype, device: torch.device, batch_hint: int
    ) -> None:
        """mats: (w (in, out) float32, bias (out,) float32 | None) each."""
        self.mm_dtype = mm_dtype
        self.onednn = None
        if mm_dtype == torch.bfloat16 and device.type == "cpu":
            self.onednn = OneDNN.pack([(w.T, b) for w, b in mats], batch_hint)
        kept = [] if self.onednn is not None else mats  # ATen's weights only where oneDNN does not pack them
        self.w = [w.to(mm_dtype).contiguous() for w, _ in kept]
        self.b = [None if b is None else b.to(mm_dtype) for _, b in kept]

    def __call__(self, x: Tensor, i: int) -> Tensor:
        """x (P, in), any float dtype -> x @ w_i + b_i (P, out) in the matmul dtype (bf16: the inputs rounded to
        bf16, float32 sums, the result rounded to bf16)."""
        x = x.to(self.mm_dtype)
        if self.onednn is not None:
            return self.onednn.linear(x.contiguous(), i)
        b = self.b[i]
        return torch.mm(x, self.w[i]) if b is None else torch.addmm(b, x, self.w[i])
