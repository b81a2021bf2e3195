"""The bridge's T' steps over a block of pairs, with the drift MLP's weights merged for it.

Shared by the two bridge engines (the point bridge's state is [x], DAB's
[mu, logvar / 2]); on CPU in bf16 the products run as oneDNN linears on
pre-packed weights and the elementwise work in the fused kernels
(:mod:`dab_pipeline.scoring.kernels.cpu`).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..blocks import BIAS_PAD, OneDNN, linear_layers
from ..kernels.cpu import Kernels, amx_ops, get_kernels


class BridgeRunner:
    """The drift MLP of ``model.bridge`` as merged matrices, and the loop that runs it."""

    def __init__(
        self, engine, extra_linears: list[tuple[Tensor, Optional[Tensor]]] = (), batch_hint: int = 1024
    ) -> None:
        bridge, f32, mm_dtype, device = engine.model.bridge, engine.f32, engine.mm_dtype, engine.device
        assert bridge is not None
        d = self.d = engine.d
        self.mm_dtype, self.lo, self.hi = mm_dtype, engine.lo, engine.hi
        self.gaussian = bridge.n_state == 2
        lins = linear_layers(bridge.drift)
        w_state, w_target = bridge.first_blocks()  # (H, n*D) each, a residual input block folded in
        w_state = f32(w_state)
        self.ws_t = w_state.T.contiguous()  # (n*D, H) state block
        self.w_target = f32(w_target)  # (H, n*D): the video side's block
        self.time_feat = f32(bridge.time_features())  # (T', H), includes the first layer's bias
        self.time_rows = list(self.time_feat.unbind(0))  # T' x (H,): no view made a step
        self.chi = [float(c) for c in bridge.chi.detach().cpu()]

        # Hidden and output layers carry their bias as an extra input row: the hidden
        # buffers keep a column of ones, so no per-step pass copies a bias into them.
        # The rows are padded with zeros to a multiple of 16 (aligned leading
        # dimensions for AVX-512 / AMX and cuBLAS).
        def with_bias(w: Tensor, b: Tensor) -> Tensor:
            w = torch.cat([w.T, b[None]])  # (H+1, out)
            return F.pad(w, (0, 0, 0, BIAS_PAD - 1)).to(mm_dtype)  # (H+pad, out)

        # The trajectory carries logvar / 2 (sigma = exp of it, no multiply per step):
        # the output layer's logvar rows are halved, which is exact in floating point.
        w_last, b_last = f32(lins[-1].weight).clone(), f32(lins[-1].bias).clone()  # (n*D, H), (n*D,)
        if self.gaussian:
            w_last[d:] *= 0.5
            b_last[d:] *= 0.5
        self.mids = [with_bias(f32(m.weight), f32(m.bias)) for m in lins[1:-1]]  # (H+pad, H) each
        self.last = with_bias(w_last, b_last)  # (H+pad, n*D)
        self.ws_t_mm = self.ws_t.to(mm_dtype)
        self.time_mm = self.time_feat.to(mm_dtype)
        # bf16 on CPU: linears 0 .. L-1 are the drift's, then ``extra_linears`` (DAB: sigma_v's block)
        self.onednn: Optional[OneDNN] = None
        self.kernels: Optional[Kernels] = None
        self.amx: Optional[AmxBridge] = None
        if mm_dtype == torch.bfloat16 and device.type == "cpu":
            linears = [(w_state, None)] + [(f32(m.weight), f32(m.bias)) for m in lins[1:-1]]
            linears += [(w_last, b_last), *extra_linears]
            self.onednn = OneDNN.pack(linears, batch_hint)
            if self.onednn is not None:
                self.kernels = get_kernels()
                self.amx = AmxBridge.pack(
                    self,
                    w_state,
                    [f32(m.weight) for m in lins[1:-1]],
                    [f32(m.bias) for m in lins[1:-1]],
                    w_last,
                    b_last,
                    [w for w, _ in extra_linears],
                )

    @staticmethod
    def video_block(bridge, f32) -> Tensor:
        """The first drift layer's video-side block (H, n*D), float32."""
        return f32(bridge.first_blocks()[1])

    def first(self, state: Tensor) -> Tensor:
        """The first step's state block plus time feature and bias, per text: state (Q, n*D) -> (Q, H)."""
        return state @ self.ws_t + self.time_feat[0]

    def run(self, state: list[Tensor], target: Tensor, first: Tensor, h0: Optional[Tensor] = None) -> list[Tensor]:
        """T' bridge steps on the B x M pairs of a block.

        state: [mu, logvar] (Gaussian) or [x] (point), each broadcastable to (B, M, D)
        (per text); target (B, M, H): the first layer's target block, matmul dtype;
        first: broadcastable to (B, M, H), from :meth:`first`; h0: on AMX, the first step's
        activation where :meth:`AmxBridge.add_to_target` computed it.  Each step is three
        large products into preallocated buffers plus in-place elementwise work.
        Returns the final state as float32 (B, M, D) tensors.
        """
        if self.onednn is not None:
            out = self.run_onednn(state, target, first, h0=h0)
            assert isinstance(out, list)
            return out
        assert h0 is None
        n_b, n_m, hidden = target.shape
        d, p = self.d, n_b * n_m
        dev, mm = target.device, self.mm_dtype
        width = 2 * d if self.gaussian else d
        target = target.view(p, hidden)
        f32 = mm == torch.float32
        s, st, mu, hv = self._state_buffers(state, n_b, n_m, dev)
        delta32 = None if f32 else torch.empty(p, width, device=dev, dtype=torch.float32)
        h_a = torch.zeros(p, hidden + BIAS_PAD, device=dev, dtype=mm)  # (P, H+pad)
        h_a[:, hidden] = 1.0  # the bias input; the rest of the padding stays 0
        h_b = h_a.clone() if self.mids else h_a
        delta = torch.empty(p, width, device=dev, dtype=mm)  # (P, n*D)
        steps = len(self.chi)
        for k in range(steps):
            self._drift(k, s, target, first, h_a, h_b, delta, (n_b, n_m))
            chi, last = self.chi[k], k + 1 == steps
            if f32:
                mu.add_(delta[:, :d], alpha=-chi)
                if hv is not None:
                    hv.add_(delta[:, d:], alpha=-chi)
            else:
                assert delta32 is not None
                st.add_(delta32.copy_(delta), alpha=-chi)  # [mu, logvar / 2] | [x] in float32
            if hv is not None:
                hv.clamp_(0.5 * self.lo, 0.5 * self.hi)
                if not last:
                    torch.exp(hv, out=s[:, d:])  # sigma, in the matmul dtype
            if not f32 and not last:
                s[:, :d].copy_(mu)
        out = [mu.reshape(n_b, n_m, d)]  # float32 (B, M, D)
        if hv is not None:
            out.append((hv * 2.0).view(n_b, n_m, d))
        return out

    def _state_buffers(
        self, state: list[Tensor], n_b: int, n_m: int, dev: torch.device
    ) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        """:meth:`run`'s state of a block's P = B x M pairs, set from the per-text ``state``: s, st, mu, hv."""
        d, p, mm = self.d, n_b * n_m, self.mm_dtype
        width = 2 * d if self.gaussian else d
        # s is the state block's input [mu, sigma] | [x].  In float32 it holds mu (or x)
        # itself, updated in place; in bf16 it is a rounded copy of the float32 state
        # st = [mu, logvar / 2] | [x], which the update converts delta into once per step.
        # Halving logvar is exact, so hv = logvar / 2 clamped to [lo/2, hi/2] is the
        # reference's logvar / 2 bit for bit, and sigma = exp(hv) needs no multiply.
        s = torch.empty(p, width, device=dev, dtype=mm)  # (P, n*D)
        f32 = mm == torch.float32
        st = s if f32 else torch.empty(p, width, device=dev, dtype=torch.float32)  # (P, n*D)
        mu = st[:, :d]  # (P, D)
        hv = None
        if self.gaussian:
            hv = torch.empty(p, d, device=dev, dtype=torch.float32) if f32 else st[:, d:]  # (P, D)
        mu.view(n_b, n_m, d).copy_(state[0])  # per-pair copies: the per-text state is never written
        if hv is not None:
            torch.mul(state[1].expand(n_b, n_m, d), 0.5, out=hv.view(n_b, n_m, d))
        return s, st, mu, hv

    def _drift(
        self,
        k: int,
        s: Tensor,
        target: Tensor,
        first: Tensor,
        h_a: Tensor,
        h_b: Tensor,
        delta: Tensor,
        grid: tuple[int, int],
    ) -> None:
        """Step k's drift MLP on the state input ``s`` into ``delta`` (P, n*D), through the buffers h_a / h_b."""
        hidden = target.shape[1]
        pre = h_a[:, :hidden]  # (P, H) view
        if k == 0:
            # the first step's state is the text's: its block was projected once per text
            torch.add(target.view(*grid, hidden), first, out=pre.view(*grid, hidden))
        else:
            torch.add(target, self.time_mm[k], out=pre)
            pre.addmm_(s, self.ws_t_mm)  # (P, H) += [mu, sigma] W_state^T, in place (beta = 1)
        F.silu(pre, inplace=True)
        h_in = h_a
        for w_mid in self.mids:
            h_out = h_b if h_in is h_a else h_a
            torch.mm(h_in, w_mid, out=h_out[:, :hidden])  # (P, H), bias from the ones column
            F.silu(h_out[:, :hidden], inplace=True)
            h_in = h_out
        torch.mm(h_in, self.last, out=delta)  # (P, n*D)

    def run_onednn(
        self, state: list[Tensor], target: Tensor, first: Tensor, raw: bool = False, h0: Optional[Tensor] = None
    ) -> list[Tensor] | Tensor:
        """:meth:`run` for bf16 on CPU: oneDNN linears and the fused kernels.

        Each step: the first layer as one linear whose epilogue adds the time feature
        (its bias) and the pair's target block (a binary post-op), SiLU in place; the
        hidden layers likewise; the output layer; then one fused pass updates the
        float32 state ``[mu, logvar / 2]`` and writes the next step's bf16 input
        ``[mu, sigma]``.  Same arithmetic as the generic bf16 path: bf16 products with
        float32 accumulation, the state in float32.  ``raw``: return the state (P, n*D).
        ``h0``: on AMX, the first step's activation from :meth:`AmxBridge.add_to_target`.
        """
        assert self.onednn is not None and self.kernels is not None
        if self.amx is not None:
            return self.amx.run(self, state, target, first, raw, h0)
        assert h0 is None
        n_b, n_m, hidden = target.shape
        d, p = self.d, n_b * n_m
        width = 2 * d if self.gaussian else d
        kern, lin = self.kernels, self.onednn
        target = target.reshape(p, hidden).contiguous()  # (P, H) bf16
        st = torch.empty(p, width, dtype=torch.float32)  # (P, n*D): [mu, logvar / 2] | [x]
        s = torch.empty(p, width, dtype=torch.bfloat16)  # (P, n*D): the first layer's input
        st[:, :d].view(n_b, n_m, d).copy_(state[0])
        if self.gaussian:
            torch.mul(state[1].expand(n_b, n_m, d), 0.5, out=st[:, d:].view(n_b, n_m, d))
        # the first step's state is the text's: its block was projected once per text, and
        # a grid's M texts repeat for every video (row r takes text r % M)
        first_rows = first[0] if first.shape[0] == 1 else first.expand(n_b, n_m, hidden).reshape(p, hidden)
        lo, hi = 0.5 * self.lo, 0.5 * self.hi
        steps = len(self.chi)
        for k in range(steps):
            if k == 0:
                h = torch.empty(p, hidden, dtype=torch.bfloat16)  # (P, H)
                kern.add_silu_bf16_(h, target, first_rows.float().contiguous())  # silu(target + first)
            else:
                h = lin.add(s, target, 0, bias=self.time_mm[k])  # (P, H) = s W_s^T + time_k + target
                kern.silu_bf16_(h)
            for i in range(1, len(self.mids) + 1):
                h = lin.linear(h, i)  # (P, H)
                kern.silu_bf16_(h)
            delta = lin.linear(h, len(self.mids) + 1)  # (P, n*D) bf16
            kern.bridge_update_(st, delta, s, self.chi[k], lo, hi, d, k + 1 < steps)
        if raw:
            return st  # (P, n*D) float32: [mu, logvar / 2] | [x]
        out = [st[:, :d].view(n_b, n_m, d)]  # float32 (B, M, D)
        if self.gaussian:
            out.append((st[:, d:] * 2.0).view(n_b, n_m, d))
        return out


def amx_bridge_applies(d: int, hidden: int) -> bool:
    """Whether a bridge of embedding width ``d`` and drift width ``hidden`` runs on AMX (:class:`AmxBridge`): the
    kernels have AMX and the process its tiles, and every width of the products (d, 2d, hidden) is a multiple of 32."""
    return d % 32 == 0 and hidden % 32 == 0 and amx_ops() is not None


class AmxBridge:
    """The bridge's steps on AMX tiles with SiLU and the state update in the products' epilogues.

    ``kernels/csrc/dab_amx.cpp``: each 32 x 32 block of a product is finished while in L1
    (bias, the pair's target block, SiLU; or the update of the float32 state and the next
    step's bf16 input), instead of passes that read the whole block back from L3 between
    oneDNN's products.  The arithmetic of :meth:`BridgeRunner.run_onednn` (bf16 inputs, float32
    accumulation, the state in float32) with one rounding fewer a layer: the epilogue works on
    the float32 sums (bias, target, SiLU or the state update) and rounds only what it stores
    as bf16, where oneDNN's path rounds the product (and its bias) to bf16 first; SiLU and
    exp use polynomials accurate to ~1e-4, under bf16's rounding.
    """

    def __init__(
        self,
        ops,
        w_state: Tensor,
        mids: list[Tensor],
        mid_biases: list[Tensor],
        w_last: Tensor,
        b_last: Tensor,
        extras: list[Tensor] = (),
    ) -> None:
        self.ops = ops
        pack = ops.amx_pack_weight
        self.extras = [pack(w.to(torch.bfloat16)) for w in extras]  # (H, .) blocks added to the target (DAB: sigma_v's)
        self.w_state = pack(w_state.to(torch.bfloat16))  # (H, n*D) -> tiles
        self.mids = [pack(w.to(torch.bfloat16)) for w in mids]  # (H, H) each
        self.mid_biases = [b.float().contiguous() for b in mid_biases]
        self.w_last = pack(w_last.to(torch.bfloat16))  # (n*D, H), logvar rows halved
        self.b_last = b_last.float().contiguous()

    @staticmethod
    def pack(
        runner: BridgeRunner,
        w_state: Tensor,
        mids: list[Tensor],
        mid_biases: list[Tensor],
        w_last: Tensor,
        b_last: Tensor,
        extras: list[Tensor] = (),
    ) -> Optional["AmxBridge"]:
        """The packed weights, or None where :func:`amx_bridge_applies` says no."""
        if not amx_bridge_applies(runner.d, w_state.shape[0]):
            return None
        return AmxBridge(amx_ops(), w_state, mids, mid_biases, w_last, b_last, extras)

    def add_to_target(self, i: int, xb: Tensor, target: Tensor, first: Tensor) -> Tensor:
        """target (B, M, H) bf16 += x @ the i-th extra block^T, in place (one rounding), x tile-blocked
        (Pp/16, K/32, 16, 32) bf16 (``amx_block_rows``, or written so by ``pair_heads_``): the last addition to
        the target (DAB's sigma_v block).  The same products' epilogue computes the first step's activation,
        silu(target + first) with ``first`` :meth:`BridgeRunner.first`'s rows broadcastable to the (B, M, H) grid,
        and returns it (tile-blocked) for :meth:`run`.
        """
        return self.ops.amx_linear_add_first_(
            xb, self.extras[i], target.view(-1, target.shape[-1]), _first_rows(first, *target.shape)
        )

    def run(
        self,
        runner: BridgeRunner,
        state: list[Tensor],
        target: Tensor,
        first: Tensor,
        raw: bool,
        h0: Optional[Tensor] = None,
    ) -> list[Tensor] | Tensor:
        """:meth:`BridgeRunner.run_onednn` on AMX; rows are padded to a multiple of 16 (never read back).

        ``h0``: the first step's activation where :meth:`add_to_target` computed it."""
        ops = self.ops
        n_b, n_m, hidden = target.shape
        d, p = runner.d, n_b * n_m
        width = 2 * d if runner.gaussian else d
        pp = -(-p // 16) * 16
        target = target.reshape(p, hidden).contiguous()  # (P, H) bf16
        # the state per text, [mu, logvar / 2] | [x]: the first update reads row r % rows, and writes st
        init = torch.cat([state[0], 0.5 * state[1]], dim=-1) if runner.gaussian else state[0]  # (1 | B, M, n*D)
        init = init[0] if init.shape[0] == 1 else init.expand(n_b, n_m, width).reshape(p, width)
        init = init.float().contiguous()  # (M | P, n*D)
        st = torch.empty(pp, width, dtype=torch.float32)  # (Pp, n*D), every row written by the first update
        # the first step: silu(target + first)
        hb = ops.amx_add_silu_blocked(target, _first_rows(first, n_b, n_m, hidden)) if h0 is None else h0
        s = torch.empty(pp // 16, width // 32, 16, 32, dtype=torch.bfloat16)  # the next step's [mu, sigma] | [x]
        lo, hi = 0.5 * runner.lo, 0.5 * runner.hi
        n_steps = len(runner.chi)
        for k in range(n_steps):
            if k > 0:
                # silu(s W_s^T + time_k + target)
                hb = ops.amx_linear_silu(s, self.w_state, runner.time_rows[k], target)
            for w, b in zip(self.mids, self.mid_biases):
                hb = ops.amx_linear_silu(hb, w, b)
            ops.amx_linear_update_(
                hb, self.w_last, self.b_last, st, s, runner.chi[k], lo, hi, d, k + 1 < n_steps, init if k == 0 else None
            )
        st = st[:p]
        if raw:
            return st  # (P, n*D) float32
        out = [st[:, :d].view(n_b, n_m, d)]  # float32 (B, M, D)
        if runner.gaussian:
            out.append((st[:, d:] * 2.0).view(n_b, n_m, d))
        return out


def _first_rows(first: Tensor, n_b: int, n_m: int, hidden: int) -> Tensor:
    """The first step's per-text rows for a (B, M, H) block: (M, H) where the M texts repeat for every
    video (a grid; the kernels read row r % M), else one row per pair (P, H); float32, contiguous."""
    rows = first[0] if first.shape[0] == 1 else first.expand(n_b, n_m, hidden).reshape(n_b * n_m, hidden)
    return rows.float().contiguous()
