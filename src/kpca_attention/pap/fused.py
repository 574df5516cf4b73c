"""PAP's fused CPU paths: :func:`pap_fused` (no autograd graph) and :class:`PAPSaved` (one autograd
Function that keeps each step's probabilities). Both run the reference loop of :mod:`.algorithm`
block by block, every step the cutoff softmax of :mod:`.softmax`; the same numbers to rounding
(tests/test_pap_numerics.py, tests/test_pap.py).
"""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import kernels
from .inputs import tracing
from .softmax import (
    Scratch,
    block_slices,
    block_view,
    hidden_and_bias,
    mask_block,
    softmax_block,
    softmax_cutoff,
)
from .updates import (
    clamp_backward,
    clamp_tau,
    flat_tau,
    update_backward,
    update_backward_fused,
    update_into,
    update_step,
)

__all__: list[str] = []


def pap_fused(
    k: Tensor, v: Tensor, q: Tensor | None, tau: Tensor, sdpa_mask: Tensor | None, sdpa_causal: bool,
    dropout_p: float, n_iter: int, *, compiled: bool = True,
) -> Tensor:
    """PAP without an autograd graph on the CPU (float32 / float64): inference and evaluation.

    The same iteration as :func:`pap`'s loop, with every softmax step the cutoff softmax of
    :func:`cutoff_attention` (which equals SDPA's to rounding and never meets a subnormal, so no
    per-step dispatch check is needed) and the update between two steps done block by block, right
    after a block's output rows are computed, while they and the block's keys are still in the cache:
    the update's seven elementwise passes then run over ~1 MiB instead of over all of
    ``(B, H, N, D)`` in memory. Buffers: three ``(B, H, N, D)`` arrays for the whole call (X = R at
    step 1, the first update's spare, L) and one block of scores; the iterates swap between the
    first two. Symmetric and unmasked, without dropout, with whole heads in a block, the loop runs as
    one compiled call where the kernels are built (``kernels.py``; ``compiled=False``: this loop, with
    the block kernels, as the tests compare).
    """
    b, h, nq, d = k.shape if q is None else q.shape
    n, dv = k.shape[-2], v.shape[-1]
    bh = b * h
    scale, cutoff = 1.0 / math.sqrt(d), softmax_cutoff(k.dtype)
    hidden, bias = hidden_and_bias(sdpa_mask, sdpa_causal, nq, n, k.device)
    kf, vf = k.reshape(bh, n, d), v.reshape(bh, n, dv)
    qf = None if q is None else q.reshape(bh, nq, d)
    tau_f, ntau_f = flat_tau(tau, b, h)
    blocks = block_slices(bh, nq, n)
    kern = kernels.active() if compiled else None
    if kern is not None and qf is None and hidden is None and bias is None and dropout_p == 0 \
            and blocks[0][1].stop == nq and kf.is_contiguous() and vf.is_contiguous() and dv == d:
        # the whole loop below, symmetric and unmasked, in one compiled call (csrc/pap_kernels.cpp): each
        # block runs all its steps, the blocks in parallel, so they take the one-thread size
        one = block_slices(bh, nq, n, threads=1)[0][0]
        step = one.stop - one.start
        out = kern.pap_forward(kf, vf, tau_f.contiguous(), n_iter, step, scale, cutoff)
        return out.view(b, h, nq, dv)
    buf = Scratch().get(0, blocks, nq, n, k)
    m = torch.empty(bh, nq, 1, dtype=k.dtype)
    l_sum = torch.empty_like(m)
    A = clamp_tau(kf, tau_f)  # step 1 (L0 = W0 = 0): X_1 = R_1 = clamp(K)
    C = torch.empty_like(A) if n_iter > 1 else A  # the first update's spare
    L = torch.empty(bh, nq, dv, dtype=k.dtype)
    # Every view a block needs, made once per call (4 steps x 32 blocks x ~15 views would cost ~3 ms in
    # slicing alone): the keys and queries of step t are A's or C's rows, by the parity of t.
    views = []
    for bs, qs in blocks:
        last_band = qs.stop == nq  # the head's rows are all done after this block: update them
        views.append((
            kf[bs], vf[bs], A[bs], C[bs], A[bs, qs], C[bs, qs], None if qf is None else qf[bs, qs],
            block_view(buf, bs.stop - bs.start, qs.stop - qs.start, n), mask_block(hidden, (b, h), bs, qs),
            mask_block(bias, (b, h), bs, qs), L[bs, qs], L[bs], m[bs, qs],
            l_sum[bs, qs], tau_f[bs], ntau_f[bs], last_band,
        ))
    for t in range(n_iter):
        last = t == n_iter - 1
        p = dropout_p if last else 0.0
        # roles (update_step leaves R_{t+1} in the spare's buffer, which from step 2 on is X_t's, and X_{t+1}
        # in R_t's): step 1 X = R = A (spare C); then (X, R) = (A, C), (C, A), (A, C), ...
        x_is_a, r_is_a = t == 0 or t % 2 == 1, t % 2 == 0
        for kb, vb, Ab, Cb, Aq, Cq, qb, S, hid, bias_b, ob, Lb, mb, lb, tb, ntb, last_band in views:
            Xb, Xq = (Ab, Aq) if x_is_a else (Cb, Cq)
            Rb = Ab if r_is_a else Cb
            softmax_block(Xq if qb is None else qb, Xb, vb, S, hid, bias_b, scale, cutoff, p, ob, mb, lb)
            if last or not last_band:
                continue
            # every output row of these heads is done and their keys are needed no more:
            # (K, L_t, R_t) -> (R_{t+1}, X_{t+1}) for these rows
            update_step(kb, Lb, Rb, tb, spare=Cb if t == 0 else Xb, neg_tau=ntb)
    return L.view(b, h, nq, dv)


_BACKWARD_BLOCK_SCALE = 2  # PAPSaved's backward blocks at several threads, in forward blocks
_SAVED_P_FLOATS = 1 << 26  # probabilities PAPSaved may keep for its backward: 256 MiB of float32


def saves_probabilities(k: Tensor, q: Tensor | None, dropout_p: float, n_iter: int) -> bool:
    """Whether :class:`PAPSaved` takes a graph-mode call: symmetric, no dropout, every softmax block
    holding whole rows, and the ``n_iter`` attention matrices within ``_SAVED_P_FLOATS``."""
    b, h, n, _ = k.shape
    if q is not None or dropout_p > 0 or n_iter * b * h * n * n > _SAVED_P_FLOATS:
        return False
    return all(qs.stop - qs.start == n for _, qs in block_slices(b * h, n, n))


def _holders(t: Tensor) -> int:
    """How many tensors share ``t``'s storage (``t`` included), or a large number where torch cannot say."""
    if not hasattr(torch._C, "_storage_Use_Count"):
        return 1 << 30
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata) - 1  # minus the temporary storage object


class SavedBuffers:
    """Flat buffers for :class:`PAPSaved`'s probabilities, reused by a later call once nothing else holds
    them (the graph that saved them has run its backward or was freed). ``n_iter * B * H * N * N`` fresh
    floats on every training step are page faults on first touch: ~29,000 a call at DeiT-tiny's first
    layer, batch 64 (119 MB), 60-150 ms on an Intel Xeon VM, half an SDPA call (docs/benchmarks.md).
    At most ``budget_bytes`` are kept; a call past it gets a fresh buffer as before."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.bufs: list[Tensor] = []
        self.lock = threading.Lock()

    def take(self, numel: int, like: Tensor) -> Tensor:
        """A flat buffer of ``numel`` elements of ``like``'s dtype and device (its contents undefined)."""
        with self.lock:
            for buf in self.bufs:
                if buf.dtype == like.dtype and buf.device == like.device and buf.numel() >= numel \
                        and _holders(buf) == 1:
                    return buf[:numel]
            buf = like.new_empty(numel)
            kept = sum(b.numel() * b.element_size() for b in self.bufs)
            if kept + numel * buf.element_size() <= self.budget_bytes:
                self.bufs.append(buf)
            return buf[:numel]  # a view: its own tensor, counted by _holders while a caller keeps it

    def clear(self) -> None:
        """Forget every kept buffer (those still saved by a graph live on with it)."""
        with self.lock:
            self.bufs.clear()


#: PAPSaved's probabilities: up to four calls' worth at the largest size it takes (1 GiB of float32)
saved_buffers = SavedBuffers(budget_bytes=4 * 4 * _SAVED_P_FLOATS)


class PAPSaved(torch.autograd.Function):
    """PAP with an autograd graph on the CPU (float32 / float64), symmetric, when the attention matrices
    are small: the whole iteration as one Function that keeps each step's probabilities.

    Forward: :func:`pap_fused`'s loop (every step the cutoff softmax, each block's update while its
    rows are in the cache), keeping X_t, L_t, C_t and the normalised probabilities P_t of every step
    (``n_iter * B * H * N * N`` floats, at most ``_SAVED_P_FLOATS``); unmasked, where the kernels are
    built, the whole loop is one compiled call (``pap_forward_saved``: each block runs all its steps while
    its rows are in the cache; ``compiled=False``: the Python loop, as the tests compare).
    Backward, step by step in reverse and block by block: with the saved P no score is recomputed, and
    since the queries are the keys, dX = (dS + dS^T) X / sqrt(D) takes two GEMMs where a query-key
    backward takes three (recomputing the scores, dQ, dK); the update's backward runs on a block's rows
    right after its dX. dK, dV and dtau accumulate in place. Against a Function per step (SDPA's flash
    backward recomputes the scores and forms dQ and dK; autograd sums the gradients out of place), PAP
    forward + backward is 8-13 % faster at 1 thread at ViT-tiny sizes (docs/benchmarks.md). Equal to the
    step-by-step graph to rounding (tests/test_pap.py). An additive mask receives no gradient (as in
    :func:`cutoff_attention`).
    """

    @staticmethod
    def forward(ctx, k: Tensor, v: Tensor, tau: Tensor, hidden: Tensor | None, bias: Tensor | None,
                n_iter: int, compiled: bool = True) -> Tensor:
        b, h, n, d = k.shape
        bh = b * h
        scale, cutoff = 1.0 / math.sqrt(d), softmax_cutoff(k.dtype)
        kf, vf = k.reshape(bh, n, d), v.reshape(bh, n, d)
        tau_f, ntau_f = flat_tau(tau, b, h)
        P = saved_buffers.take(n_iter * bh * n * n, k).view(n_iter, bh, n, n)
        kern = kernels.active() if compiled else None
        if kern is not None and hidden is None and bias is None and kf.is_contiguous() \
                and vf.is_contiguous() and not tracing():
            # the loop below in one compiled call (csrc/pap_kernels.cpp, pap_forward_saved): each block runs
            # all its steps while its rows are in the cache, the blocks in parallel at their one-thread size
            one = block_slices(bh, n, n, threads=1)[0][0]
            X_all, L_all = k.new_empty(n_iter, bh, n, d), k.new_empty(n_iter, bh, n, d)
            C_all = k.new_empty(max(n_iter - 1, 0), bh, n, d)
            kern.pap_forward_saved(kf, vf, tau_f.contiguous(), n_iter, one.stop - one.start, scale, cutoff, P,
                                   X_all, L_all, C_all)
            ctx.save_for_backward(kf, vf, tau_f, P, X_all, L_all, C_all)
            ctx.n_iter, ctx.tau_shape, ctx.stacked, ctx.block = n_iter, tau.shape, True, one.stop - one.start
            return L_all[-1].view(b, h, n, d)
        blocks = block_slices(bh, n, n)
        masks = [tuple(mask_block(mask, (b, h), bs, qs) for mask in (hidden, bias)) for bs, qs in blocks]
        m = k.new_empty(bh, n, 1)
        l_sum = torch.empty_like(m)
        X0 = clamp_tau(kf, tau_f)  # step 1 (L0 = W0 = 0): X_1 = R_1 = C_0 = clamp(K)
        Xs, Ls, Cs = [X0], [], [X0]
        R = torch.empty_like(X0) if n_iter > 1 else X0
        for t in range(n_iter):
            last = t == n_iter - 1
            X, R_in, L = Xs[t], (X0 if t == 0 else R), torch.empty_like(X0)
            Ls.append(L)
            if not last:
                Cs.append(torch.empty_like(X0))
                Xs.append(torch.empty_like(X0))
            for (bs, _), (hid, bias_b) in zip(blocks, masks, strict=True):
                S = P[t, bs]
                Xb, Lb, mb, lb = X[bs], L[bs], m[bs], l_sum[bs]
                softmax_block(Xb, Xb, vf[bs], S, hid, bias_b, scale, cutoff, 0.0, Lb, mb, lb)
                S.div_(lb)
                if not last:  # (K, L_t, R_t) -> (C_t, R_{t+1}, X_{t+1}) for these rows
                    update_into(kf[bs], Lb, R_in[bs], tau_f[bs], ntau_f[bs], Cs[-1][bs], Xs[-1][bs], R[bs])
        ctx.save_for_backward(kf, vf, tau_f, P, *Xs, *Ls, *Cs)
        ctx.n_iter, ctx.tau_shape, ctx.stacked = n_iter, tau.shape, False
        return Ls[-1].view(b, h, n, d)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        n_iter = ctx.n_iter
        kf, vf, tau_f, P, *rest = ctx.saved_tensors
        bh, n, d = kf.shape
        b, h = g.shape[:2]
        scale = 1.0 / math.sqrt(d)
        need_tau = ctx.needs_input_grad[2]
        gf = g.reshape(bh, n, d)
        if ctx.stacked:  # the compiled forward's stacked X, L, C
            kern = kernels.active()
            if kern is not None and not tracing():  # the loop below in one compiled call, block by block
                g_k, g_v, g_tau = kern.pap_backward_saved(gf.contiguous(), vf, tau_f.contiguous(), P, *rest,
                                                          ctx.block, scale, need_tau)
                g_tau = g_tau.view(b, h, -1, 1).sum_to_size(ctx.tau_shape) if need_tau else None
                return g_k.view(b, h, n, d), g_v.view(b, h, n, d), g_tau, None, None, None, None
            X_all, L_all, C_all = rest
            rest = [*X_all.unbind(0), *L_all.unbind(0), X_all[0], *C_all.unbind(0)]
        Xs, Ls, Cs = rest[:n_iter], rest[n_iter:2 * n_iter], rest[2 * n_iter:]
        g_k, g_v, g_tau = torch.empty_like(kf), torch.empty_like(vf), torch.zeros_like(tau_f)
        dL = torch.empty_like(kf) if n_iter > 1 else None  # dLoss / dL_{t-1}, from update t-1's backward
        dR = torch.empty_like(kf) if n_iter > 1 else None  # dLoss / dR_{t-1}
        # the forward's blocks at one thread; at several, 2x larger (each op a parallel region): backward
        # at B 64 on a 2-core Xeon, 1 thread: 292 / 315 / 321 ms with 1x / 2x / 4x blocks; 2 threads: 237 /
        # 208 / 214 ms (with the update's backward in one kernel, update_backward_fused)
        threads = torch.get_num_threads()
        blocks = block_slices(bh, n, n, threads=threads, scale=1 if threads <= 1 else _BACKWARD_BLOCK_SCALE)
        nb_max = max(bs.stop - bs.start for bs, _ in blocks)
        buf_dp = kf.new_empty(nb_max * n * n)
        buf_dx, buf_in, buf_out = (kf.new_empty(nb_max * n * d) for _ in range(3))
        sym_ops = kernels.active() if kf.dtype in (torch.float32, torch.float64) and not tracing() else None
        for t in reversed(range(n_iter)):
            last = t == n_iter - 1
            X, L, C, G = Xs[t], Ls[t], Cs[t], (gf if last else dL)
            for bs, _ in blocks:
                nb = bs.stop - bs.start
                Xb, Gb, Pb = X[bs], G[bs], P[t, bs]
                delta = torch.bmm(Gb.reshape(-1, 1, d), L[bs].reshape(-1, d, 1)).view(nb, n, 1)
                dP = torch.bmm(Gb, vf[bs].transpose(1, 2), out=block_view(buf_dp, nb, n, n))
                if last:
                    torch.bmm(Pb.transpose(1, 2), Gb, out=g_v[bs])
                else:
                    g_v[bs].baddbmm_(Pb.transpose(1, 2), Gb)
                if sym_ops is not None and Pb.is_contiguous():  # scale (dS + dS^T) in place, one GEMM
                    dX = torch.bmm(sym_ops.softmax_backward_sym_(dP, Pb, delta, scale), Xb,
                                   out=block_view(buf_dx, nb, n, d))
                else:
                    dS = dP.sub_(delta).mul_(Pb)  # d(loss)/d(logits), unscaled
                    dX = torch.bmm(dS, Xb, out=block_view(buf_dx, nb, n, d))
                    dX.baddbmm_(dS.transpose(1, 2), Xb).mul_(scale)  # X is the queries and the keys
                # back through the clamp that made X_t and R_t (C_0 = clamp(K), or update t-1):
                # dC = dR_t + dX_t; dZ = dC inside the clamp; dK += dZ; tau gets sum(dC * C / tau) outside.
                # dR[bs] holds dR_t until dC is formed in it, then dR_{t-1}.
                if update_backward_fused(dX, None if last and t == 0 else dR[bs], C[bs], tau_f[bs], g_k[bs],
                                         dL[bs] if t > 0 else None, g_tau[bs] if need_tau else None,
                                         dr_in=not last, accumulate_k=not last):
                    continue  # the eleven steps below in one pass
                dC = dX if last else dR[bs].add_(dX)
                dZ, part = clamp_backward(dC, C[bs], tau_f[bs], need_tau, out=block_view(buf_in, nb, n, d),
                                           tmp=block_view(buf_out, nb, n, d))
                if part is not None:
                    g_tau[bs] += part
                if last:
                    g_k[bs].copy_(dZ)
                else:
                    g_k[bs].add_(dZ)
                if t > 0:  # update t-1 made X_t and R_t: dL_{t-1} and dR_{t-1} for these rows
                    update_backward(dC, dX, dZ, g_L=dL[bs], g_R=dR[bs])
        g_tau = g_tau.view(b, h, -1, 1).sum_to_size(ctx.tau_shape) if need_tau else None
        return g_k.view(b, h, n, d), g_v.view(b, h, n, d), g_tau, None, None, None, None

