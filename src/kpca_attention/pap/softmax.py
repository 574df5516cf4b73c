"""The cutoff softmax: PAP's softmax step on the CPU, with its own blocked autograd Function.

:func:`cutoff_attention` is public; the block kernels (``softmax_block``, ``_probabilities``, ...) are
shared with the fused CPU paths of :mod:`.fused`.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import kernels
from .inputs import cpu_float, tracing, visible

__all__ = ["cutoff_attention", "softmax_cutoff"]

# ----------------------------------------------------------------------------- softmax steps
#
# PAP's iterates grow over the iterations (docs/pap.md, "Iterate growth"): the dual accumulates the
# residual K - L - S, and X = K - S - Y / mu moves away from K. Once a row of logits x_i . x_j / sqrt(D)
# spans more than ~87, exp(logit - row max) lands in float32's subnormal range (below 1.2e-38), and
# on Intel cores every arithmetic operation with a subnormal operand or result takes a microcode
# assist (~100x slower); AMD Zen cores mostly do not. SDPA's CPU flash kernel recomputes the
# probabilities in its backward with a full-range exp and runs four GEMMs on them, so a PAP backward
# became 10-25x slower on Intel. Those probabilities are below float32's resolution next to the row
# maximum and change nothing, but no SDPA backend can be told to drop them, and flush-to-zero is a
# per-thread CPU state that library code should not change behind a caller's back. Hence, on the
# CPU, a softmax step whose rows *could* span more than ``softmax_cutoff(dtype)`` (a Cauchy-Schwarz
# bound, one pass over X) goes through :func:`cutoff_attention`, which raises every logit to at
# least ``row max - cutoff`` before the exp, so no subnormal ever arises, in the forward or the
# backward. Every other step, and every step on an accelerator (GPUs process subnormals at full
# speed), uses SDPA unchanged.

_BLOCK_FLOATS = 1 << 18  # logits per block of cutoff_attention: 1 MiB of float32, an L2 cache's worth


def softmax_cutoff(dtype: torch.dtype) -> float:
    """The logit range kept by :func:`cutoff_attention`: ``-2 ln(eps)`` of ``dtype`` (31.8 for float32).

    A logit more than this below its row's maximum has probability below ``eps**2`` times the
    largest one; raising it to that level changes each output by at most ``N * eps**2 * max|v|``,
    under the dtype's rounding error for any sequence shorter than ``1 / eps`` (8.4 million tokens in
    float32), and keeps every probability and every product with it far from the subnormal range.
    """
    return -2.0 * math.log(torch.finfo(dtype).eps)


def _may_underflow(query: Tensor, key: Tensor, sdpa_mask: Tensor | None) -> bool:
    """Whether some row of ``softmax(query key^T / sqrt(D))`` may hold a probability below
    ``exp(-softmax_cutoff) / N`` (SDPA's backward would then meet subnormals on wide ranges).

    By Cauchy-Schwarz, the logits of row i lie in ``+-|q_i| max_j |k_j| / sqrt(D)``. An additive float
    mask shifts logits by amounts this bound does not see, so such a step always counts as "may".
    One pass over query and key, and a host synchronisation (free on the CPU, where this is used).
    """
    if sdpa_mask is not None and sdpa_mask.dtype != torch.bool:
        return True
    n, d = key.shape[-2], key.shape[-1]
    acc = torch.promote_types(key.dtype, torch.float32)
    k_max = torch.linalg.vector_norm(key, dim=-1, dtype=acc).amax(-1)  # (B, H)
    q_norm = k_max if query is key else torch.linalg.vector_norm(query, dim=-1, dtype=acc).amax(-1)
    spread = 2.0 * q_norm * k_max / math.sqrt(d)
    return bool((spread > softmax_cutoff(key.dtype) - math.log(n)).any())


def uses_cutoff(query: Tensor, key: Tensor, sdpa_mask: Tensor | None) -> bool:
    """The softmax-step dispatch of :func:`pap` (see the comment above :func:`softmax_cutoff`)."""
    if not cpu_float(key):
        return False
    # While tracing or compiling nothing may branch on values: take the path that is always safe.
    return tracing() or _may_underflow(query, key, sdpa_mask)


def cutoff_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    cutoff: float | None = None,
) -> Tensor:
    """``softmax(q k^T / sqrt(D) + mask) v`` with every logit raised to at least ``row max - cutoff``.

    The softmax step :func:`pap` takes on the CPU when a row's logits may span more than the cutoff
    (see :func:`softmax_cutoff` for why the result equals SDPA's to rounding). No probability, and no
    intermediate of the hand-written backward, is then subnormal. The scores are formed in blocks of
    ~1 MiB (a few heads, or a band of query rows for long sequences), so memory stays
    ``O(N * D)`` per (batch, head) beyond one block, as with SDPA's flash kernel; the backward
    recomputes the probabilities from the saved row maxima and sums.

    Args:
        q, k, v: ``(B, H, N, D)`` (q may have its own N), float32 or float64.
        attn_mask: as SDPA: boolean (True = may attend) or additive float, broadcastable to
            ``(B, H, Nq, N)``; an additive value <= half the dtype's lowest (or -inf) hides the key.
            A query that sees no key gets output 0 (as SDPA). The mask receives no gradient.
        is_causal: hide key j from query i when j > i.
        dropout_p: attention dropout (on the probabilities, scaled by ``1 / (1 - p)``).
        cutoff: the kept logit range, default :func:`softmax_cutoff` of the dtype.

    Returns:
        ``(B, H, Nq, D)``.
    """
    if q.dtype not in (torch.float32, torch.float64) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"cutoff_attention: q, k, v must share float32 or float64, got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if q.dim() != 4 or k.dim() != 4 or v.shape[:-1] != k.shape[:-1] or q.shape[:2] != k.shape[:2] \
            or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"cutoff_attention: q (B, H, Nq, D), k (B, H, N, D), v (B, H, N, Dv) expected, "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"cutoff_attention: dropout_p must be in [0, 1), got {dropout_p}")
    cutoff = softmax_cutoff(q.dtype) if cutoff is None else float(cutoff)
    if not cutoff > 0:
        raise ValueError(f"cutoff_attention: cutoff must be > 0, got {cutoff}")
    return cutoff_step(q, k, v, attn_mask, is_causal, dropout_p, cutoff)


def cutoff_step(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool, dropout_p: float,
            cutoff: float, scratch: Scratch | None = None) -> Tensor:
    """:func:`cutoff_attention` without its argument checks, with the block buffers of ``scratch``
    (PAP's softmax steps share one)."""
    hidden, bias = hidden_and_bias(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.device)
    return _CutoffAttention.apply(q, k, v, hidden, bias, dropout_p, cutoff, scratch)


def hidden_and_bias(attn_mask: Tensor | None, is_causal: bool, nq: int, n: int,
                     device: torch.device) -> tuple[Tensor | None, Tensor | None]:
    """The cutoff softmax's view of SDPA's masks: ``hidden`` (bool, True = key hidden from the query)
    and the finite additive ``bias`` of a float mask (0 on hidden keys, which are zeroed after the exp)."""
    hidden = bias = None
    if is_causal:
        hidden = torch.ones(nq, n, dtype=torch.bool, device=device).triu(1)
    if attn_mask is not None:
        vis = visible(attn_mask)
        hidden = ~vis if hidden is None else hidden | ~vis
        if attn_mask.dtype != torch.bool:
            bias = attn_mask.detach().masked_fill(~vis, 0.0)
    return hidden, bias


def cutoff_attention_ops(
    q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """:func:`cutoff_attention` in plain differentiable ops: what ``torch.compile`` traces for PAP's
    softmax steps on the CPU (the autograd Function, with its blocks written through ``out=``, would
    break the graph). Same masks and cutoff: each logit is raised to at least ``row max - cutoff``
    before the exp, so no probability is subnormal; the compiler derives the backward (the clamp's
    gradient is 0 where it raised a logit, where :func:`cutoff_attention` passes it through: both
    differ from the exact one by less than the cutoff's own effect). Forms the ``(Nq, N)`` scores at once.
    """
    cutoff = softmax_cutoff(q.dtype)
    hidden, bias = hidden_and_bias(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.device)
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if bias is not None:
        s = s + bias
    if hidden is not None:
        s = s.masked_fill(hidden, float("-inf"))
    m = s.detach().amax(dim=-1, keepdim=True)
    if hidden is not None:  # a query that sees no key: all probabilities 0, output 0 (as SDPA)
        m = m.masked_fill(m == float("-inf"), 0.0)
    p = torch.exp(torch.clamp(s - m, min=-cutoff))
    if hidden is not None:
        p = p.masked_fill(hidden, 0.0)
    total = p.sum(dim=-1, keepdim=True)
    if hidden is not None:
        total = total.masked_fill(total == 0, 1.0)
    p = p / total
    if dropout_p > 0:
        p = F.dropout(p, dropout_p)
    return torch.matmul(p, v)


def _passive_wait() -> bool:
    """Whether OpenMP's idle threads sleep rather than spin (``OMP_WAIT_POLICY=passive``, read by the
    OpenMP runtime when it starts; the variable is read here on each call, as the runtime cannot be asked)."""
    return os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"


def block_slices(bh: int, nq: int, n: int, threads: int | None = None, scale: int = 1
                 ) -> list[tuple[slice, slice]]:
    """(batch-head slice, query slice) pairs covering ``(bh, nq)`` with ~``scale * _BLOCK_FLOATS`` logits
    each, for ``threads`` intra-op threads (default: torch's)."""
    # With several threads every op is a parallel region ending in a barrier: fewer, larger blocks than at
    # one thread. How much larger depends on how OpenMP's idle threads wait. Spinning (the default), 4x the
    # single-thread block at 2 threads was fastest on a 2-core Xeon (PAP forward 4.6x SDPA, against 5.1x
    # with 16x blocks); with OMP_WAIT_POLICY=PASSIVE each region must wake a sleeping thread, and 16x
    # blocks were fastest (5.9x, against 7.2x with 4x) - docs/benchmarks.md.
    threads = torch.get_num_threads() if threads is None else threads
    per_thread = 1 if threads <= 1 else threads * (8 if _passive_wait() else 2)
    budget = scale * per_thread * _BLOCK_FLOATS
    if nq * n <= budget:
        step = budget // (nq * n)
        return [(slice(i, min(i + step, bh)), slice(0, nq)) for i in range(0, bh, step)]
    rows = max(1, budget // n)
    return [(slice(i, i + 1), slice(r, min(r + rows, nq))) for i in range(bh) for r in range(0, nq, rows)]


def mask_block(mask: Tensor | None, shape: tuple[int, int], bs: slice, qs: slice) -> Tensor | None:
    """The block ``[bs, qs, :]`` of a mask broadcastable to ``(B, H, Nq, N)``, indexed by flat b*H+h."""
    if mask is None:
        return None
    b, h = shape
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    idx = torch.arange(bs.start, bs.stop, device=mask.device)
    bi = idx // h if mask.shape[0] > 1 else torch.zeros_like(idx)
    hi = idx % h if mask.shape[1] > 1 else torch.zeros_like(idx)
    blk = mask[bi, hi]  # (nb, Nq | 1, N | 1): a copy of this block only
    return blk[:, qs] if blk.shape[1] > 1 else blk


class Scratch:
    """Flat buffers for the ``(nb, nq_block, N)`` blocks of :class:`_CutoffAttention`, reused by every
    block and, when one holder is passed to several calls (PAP's softmax steps), by every call: fresh
    buffers of this size are page faults on first touch (measured: ~14,000 per PAP forward at 1 thread
    before buffers were reused, several ms on a VM)."""

    def __init__(self) -> None:
        self.bufs: list[Tensor] = []

    def get(self, i: int, blocks: list[tuple[slice, slice]], nq: int, n: int, like: Tensor) -> Tensor:
        """Buffer ``i``, large enough for the largest block of ``blocks``."""
        most = n * max((bs.stop - bs.start) * (min(qs.stop, nq) - qs.start) for bs, qs in blocks)
        while len(self.bufs) <= i:
            self.bufs.append(like.new_empty(0))
        buf = self.bufs[i]
        if buf.numel() < most or buf.dtype != like.dtype or buf.device != like.device:
            buf = self.bufs[i] = like.new_empty(most)
        return buf


def block_view(buf: Tensor, nb: int, nq: int, n: int) -> Tensor:
    """The ``(nb, nq, N)`` view at the start of a :class:`Scratch` buffer."""
    return buf[: nb * nq * n].view(nb, nq, n)


def _block_logits(qb: Tensor, kb: Tensor, S: Tensor, bias_b: Tensor | None, scale: float) -> float:
    """Write one block's scores into ``S`` and return ``s`` with logits = ``s * S``: ``S = q k^T`` and
    ``s = scale`` without a bias, ``S = scale * q k^T + bias block`` and ``s = 1`` with one.

    The scale is left to the caller (folded into the subtraction of the row maximum) rather than passed
    to ``baddbmm`` as alpha: with beta = 0 and several threads, torch's CPU ``baddbmm`` over many small
    matrices takes a path up to 17x slower than ``bmm`` (torch 2.14, 2 threads, 192 x 197 x 64)."""
    torch.bmm(qb, kb.transpose(1, 2), out=S)
    if bias_b is None:
        return scale
    torch.add(bias_b, S, alpha=scale, out=S)
    return 1.0


def _probabilities(
    S: Tensor, m: Tensor, hidden: Tensor | None, cutoff: float, scale: float = 1.0
) -> Tensor:
    """In place: ``exp(max(scale * S - m, -cutoff))``, 0 where hidden; ``scale * S`` are the logits and
    ``m`` their row maximum. (The clamp comes before the exp: an exp of a very negative number is itself
    slow on Intel, since its result or intermediates are subnormal.)"""
    if scale == 1.0:
        S.sub_(m)
    else:
        torch.add(m.neg(), S, alpha=scale, out=S)
    S.clamp_(min=-cutoff).exp_()
    if hidden is not None:
        S.masked_fill_(hidden, 0.0)
    return S


def softmax_block(
    qb: Tensor, kb: Tensor, vb: Tensor, S: Tensor, hid: Tensor | None, bias_b: Tensor | None, scale: float,
    cutoff: float, dropout_p: float, ob: Tensor, mb: Tensor, lb: Tensor,
) -> Tensor | None:
    """One block of the cutoff softmax's forward, on views of the block (``(nb, nq_block, .)``; ``S`` the
    ``(nb, nq_block, N)`` scratch, ``hid`` / ``bias_b`` the mask blocks): writes ``ob``
    (``softmax(q k^T * scale + mask) v`` with the cutoff), ``mb`` (the logits' row maximum) and ``lb``
    (the row sum of the unnormalised probabilities); returns the dropout keep mask."""
    s = _block_logits(qb, kb, S, bias_b, scale)  # logits = s * S
    if hid is not None:
        S.masked_fill_(hid, float("-inf"))
    kern = kernels.active()
    if kern is not None and S.is_contiguous() and mb.is_contiguous() and lb.is_contiguous():
        kern.cutoff_exp_(S, mb, lb, s, cutoff)  # the five passes below in one (kernels.py)
        P = S
    else:
        P = _probabilities_eager(S, hid, s, cutoff, mb, lb)
    keep = None
    if dropout_p > 0:
        keep = torch.empty_like(P, dtype=torch.bool).bernoulli_(1.0 - dropout_p)
        P.masked_fill_(~keep, 0.0).div_(1.0 - dropout_p)
    torch.bmm(P, vb, out=ob).div_(lb)
    return keep


def _probabilities_eager(S: Tensor, hid: Tensor | None, s: float, cutoff: float, mb: Tensor,
                         lb: Tensor) -> Tensor:
    """:func:`softmax_block`'s probabilities with eager ops: ``mb`` the logits' row maximum, ``lb`` the
    row sum of the returned unnormalised probabilities (written over ``S``)."""
    torch.amax(S, dim=-1, keepdim=True, out=mb)
    if hid is not None:  # a query that sees no key: all P~ = 0, output 0 (as SDPA)
        mb.masked_fill_(mb == float("-inf"), 0.0)
    if s != 1.0:
        mb.mul_(s)  # the logits' row maximum (also for the backward)
    P = _probabilities(S, mb, hid, cutoff, s)
    torch.sum(P, dim=-1, keepdim=True, out=lb)  # >= 1 (the max) without a mask
    if hid is not None:
        lb.masked_fill_(lb == 0, 1.0)
    return P


class _CutoffAttention(torch.autograd.Function):
    """:func:`cutoff_attention` with a blocked, hand-written backward (first-order only).

    Forward per block: S = q k^T / sqrt(D) (+ bias, hidden = -inf), m = row max, P~ = exp(max(S - m,
    -cutoff)) (0 where hidden), l = row sum, O = (P~ v) / l. Backward with P = P~ / l (and the dropout
    keep mask Z / (1 - p)): dV = (P Z)^T dO, dP = (dO V^T) Z, dS = P (dP - rowsum(dO * O)),
    dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D). The clamp is passed through (dS is the softmax
    backward at the clamped probabilities): the exact derivative differs by less than the cutoff's
    own effect on the output.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, hidden: Tensor | None, bias: Tensor | None,
                dropout_p: float, cutoff: float, scratch: Scratch | None = None) -> Tensor:
        # scratch: block buffers shared with other calls (PAP's steps) and this call's backward
        b, h, nq, d = q.shape
        n, dv = k.shape[-2], v.shape[-1]
        scale = 1.0 / math.sqrt(d)
        qf, kf, vf = q.reshape(b * h, nq, d), k.reshape(b * h, n, d), v.reshape(b * h, n, dv)
        out = torch.empty(b * h, nq, dv, dtype=q.dtype, device=q.device)
        m = torch.empty(b * h, nq, 1, dtype=q.dtype, device=q.device)
        l_sum = torch.empty_like(m)
        keeps: list[Tensor] = []
        ctx.blocks = blocks = block_slices(b * h, nq, n)  # the same blocks in the backward (and thread count)
        ctx.scratch = scratch = Scratch() if scratch is None else scratch
        buf = scratch.get(0, blocks, nq, n, q)
        for bs, qs in blocks:
            S = block_view(buf, bs.stop - bs.start, qs.stop - qs.start, n)
            bias_b = mask_block(bias, (b, h), bs, qs)
            keep = softmax_block(qf[bs, qs], kf[bs], vf[bs], S, mask_block(hidden, (b, h), bs, qs), bias_b,
                                  scale, cutoff, dropout_p, out[bs, qs], m[bs, qs], l_sum[bs, qs])
            if keep is not None:
                keeps.append(keep)
        ctx.save_for_backward(q, k, v, out, m, l_sum, hidden, bias, *keeps)
        ctx.dropout_p, ctx.cutoff = dropout_p, cutoff
        return out.view(b, h, nq, dv)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, m, l_sum, hidden, bias, *keeps = ctx.saved_tensors
        b, h, nq, d = q.shape
        n, dv = k.shape[-2], v.shape[-1]
        scale = 1.0 / math.sqrt(d)
        p = ctx.dropout_p
        qf, kf = q.reshape(b * h, nq, d), k.reshape(b * h, n, d)
        vf = v.reshape(b * h, n, dv)
        gf = g.reshape(b * h, nq, dv)
        # rowsum(dO * O) = rowsum(P * dP), as one batched dot product (no (B, H, N, D) temporary)
        delta = torch.bmm(gf.reshape(-1, 1, dv), out.reshape(-1, dv, 1)).view(b * h, nq, 1)
        # blocks of whole query rows write each head's dK and dV once; bands of rows accumulate them
        banded = any(qs.stop - qs.start < nq for _, qs in ctx.blocks)
        gq = torch.empty_like(qf)
        gk = torch.zeros_like(kf) if banded else torch.empty_like(kf)
        gv = torch.zeros_like(vf) if banded else torch.empty_like(vf)
        buf, buf_dp = (ctx.scratch.get(i, ctx.blocks, nq, n, q) for i in (0, 1))
        for i, (bs, qs) in enumerate(ctx.blocks):
            S = block_view(buf, bs.stop - bs.start, qs.stop - qs.start, n)
            bias_b = mask_block(bias, (b, h), bs, qs)
            s = _block_logits(qf[bs, qs], kf[bs], S, bias_b, scale)
            hid = mask_block(hidden, (b, h), bs, qs)
            mb, lb = m[bs, qs], l_sum[bs, qs]
            kern = kernels.active()
            if kern is not None and mb.is_contiguous() and lb.is_contiguous():
                P = kern.cutoff_probs_(S, mb, lb, s, ctx.cutoff)  # one pass (kernels.py)
                if hid is not None:
                    P.masked_fill_(hid, 0.0)
            else:
                P = _probabilities(S, mb, hid, ctx.cutoff, s).div_(lb)
            gb = gf[bs, qs]
            dP = torch.bmm(gb, vf[bs].transpose(1, 2), out=block_view(buf_dp, *S.shape))
            Pd = P
            if p > 0:
                keep = keeps[i]
                Pd = P.masked_fill(~keep, 0.0).div_(1.0 - p)
                dP.masked_fill_(~keep, 0.0).div_(1.0 - p)
            if banded:
                gv[bs].baddbmm_(Pd.transpose(1, 2), gb)
            else:
                torch.bmm(Pd.transpose(1, 2), gb, out=gv[bs])
            dS = dP.sub_(delta[bs, qs]).mul_(P)  # d(loss)/d(logits); the scale goes on the products
            torch.bmm(dS, kf[bs], out=gq[bs, qs]).mul_(scale)
            if banded:
                gk[bs].baddbmm_(dS.transpose(1, 2), qf[bs, qs], alpha=scale)
            else:
                torch.bmm(dS.transpose(1, 2), qf[bs, qs], out=gk[bs]).mul_(scale)
        return gq.view_as(q), gk.view_as(k), gv.view_as(v), None, None, None, None, None

