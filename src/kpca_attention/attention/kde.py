"""KDE attention and robust KDE attention (Han et al., NeurIPS 2023, "Designing Robust Transformers using
Robust Kernel Density Estimation"; official code ``aaronhan223/robust_transformer``, ``imagenet/models.py``,
BSD-3; read, not copied).

**KDE attention** (``KdeAttention``): attention as a Nadaraya-Watson estimator with a Gaussian kernel on
unit-norm keys khat_j = k_j / ||k_j||::

    out_i = sum_j softmax_j(-||q_i - khat_j||^2 / sqrt(D)) v_j

Since ||q_i||^2 and ||khat_j||^2 = 1 do not depend on j, this is softmax(2 q_i . khat_j / sqrt(D)): one
fused attention call with scale 2 / sqrt(D) on the normalised keys.

**Robust KDE attention** (``RobustAttention``): the kernel density estimates of the joint (k, v) and of the
keys alone are replaced by robust ones, with weights from kernel iteratively re-weighted least squares
(KIRWLS)::

    out_i = sum_j wJ_j e^{s_ij} v_j / sum_j wM_j e^{s_ij},      s_ij = -||q_i - khat_j||^2 / sqrt(D)

wJ from the joint points x_j = [khat_j, v_j], wM from the keys x_j = khat_j, each with the kernel
K_jl = exp(-||x_j - x_l||^2 / sqrt(D)) (the official code's scale, D the head width, for both). One
KIRWLS step from weights w (uniform at the start)::

    r_j^2 = ||phi(x_j) - sum_l w_l phi(x_l)||^2 = K_jj - 2 sum_l w_l K_jl + w^T K w      (paper)
    w_j  <- psi(r_j) / sum_l psi(r_l)

with psi(r) = rho'(r) / r the weight of the robust loss: Huber ``1 if r <= a else a / r`` (a = 0.2), or
Hampel (official: b = 2a, c = 3a; ``1`` below a, ``a / r`` below b, ``a (c - r) / ((c - b) r)`` below c,
``0.01`` beyond). ``n_iter`` steps (official default 1).

The official code's norm is ``1 + sum_l w_l K_jl + w^T K w`` (a sign error, and coefficient 1 where the
paper has 2; the issue quotes it as ``1 + 2 sum w k + w^T K w``, the same error in kind). Then r_j >= 1 > a
for every token, every Huber weight is ``a / r_j`` and a cancels in the normalisation: the threshold is
inert (a = 0.2 / 0.4 / 1.0 give the same model), and every Hampel weight is 0.01, which is plain KDE
attention. ``official_norm=True`` reproduces it; the default is the paper's norm. The layer records which
it used in ``norm_used`` (also in ``extra_repr``, hence in printed models and reports). With the paper's
norm the threshold is active at initialisation, but in the trained mini models of the ``zoo`` study it is
hardly ever reached either (r <= 0.2 for at most 0.04 % of the distances; median r 0.54-0.95): the hook
points ``hook_r_keys`` / ``hook_r_joint`` give r, so that can be measured on any model.

Other differences from the official code: for ``n_iter > 1`` the official code averages the weights over
the batch and the heads between steps (``torch.mean(w_init, dim=(2, 3))``), coupling the samples of a
batch; here each (sample, head) keeps its own weights. The official code computes the norm in float64
before casting back; here it is computed in the input's dtype.

Masks: the weights are those of the keys each query may see. Without a mask all queries share one weight
vector per (sample, head) (O(N^2)); with ``attn_mask`` or ``is_causal`` each query gets its own weights over
its visible keys (each causal prefix is its own sample, so the future never enters; O(N^3) per step for
``n_iter`` steps). A query that sees no key gets NaN, as SDPA gives.

Speed: RKDE forms two N x N Gram kernels (keys, and values: their product is the joint kernel) for its
weights, each a batched matmul and an exp over N x N, before the final fused attention call; at B 64, H 3,
N 197, D 64 that measured 3.1-3.6x one SDPA call forward on an AMD EPYC and 3.5-4.1x on an Intel Xeon
(target: 3.5x; docs/benchmarks.md). Without a graph to record (inference, evaluation), without a
mask and with one KIRWLS step (the default), the weights need the kernels only through their column sums:
a compiled kernel (``csrc/rkde_kernels.cpp``, built with PAP's) computes those per head in the cache, over
the upper triangle, never writing the kernels - 2.2-2.5x one SDPA call on the AMD EPYC (2026-11-27). Its
backward (training, attacks) forms each head's kernels again in the cache and needs one GEMM per kernel, so
nothing N x N is kept for the backward either. Without the compiled kernels, the same column sums and
their backward are taken a few heads at a time in eager ops (:func:`_column_sums_by_blocks`). With a mask
or more KIRWLS steps (and while tracing, or off the CPU), the kernels are formed (:func:`robust_kernels`,
with its own hand-written backward). Where the
weights need a gradient, the final call carries the marginal weights' log in the keys rather than in a
mask, which SDPA's CPU kernel cannot differentiate (:func:`_attention_with_key_bias`; forward + backward
2.9x one SDPA call against 3.2-3.3x on an Intel Xeon at one thread, docs/benchmarks.md).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from timm.models import register_notrace_module
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..checks import Bool, Choice, Int, Real
from ..pap import kernels, tracing, visible
from ..pap.inputs import cpu_float
from .base import QueryOptionalAttention
from .hooks import HookPoint
from .registry import register_mechanism

__all__ = ["KdeAttention", "RobustAttention", "kirwls_weights", "robust_kernels", "robust_weight"]

LOSSES = ("huber", "hampel")


def robust_weight(r: Tensor, a: float, loss: str) -> Tensor:
    """psi(r) = rho'(r) / r of the Huber or (official) Hampel loss at distances ``r`` >= 0."""
    if loss == "huber":
        return torch.where(r <= a, torch.ones_like(r), a / r)
    b, c = 2 * a, 3 * a
    mid = torch.where(r < b, a / r, a * (c - r) / ((c - b) * r))
    return torch.where(r < a, torch.ones_like(r), torch.where(r < c, mid, torch.full_like(r, 0.01)))


def _log_gram_kernel(x: Tensor, scale: float) -> Tensor:
    """log K_jl = -scale ||x_j - x_l||^2 (<= 0), ``x (..., N, E)`` -> ``(..., N, N)``: one GEMM
    ``(2 scale x_j) . x_l``, then ``- scale |x_j|^2 - scale |x_l|^2`` and the clamp in place on its output.
    (``baddbmm`` onto a materialised ``|x_j|^2 + |x_l|^2`` took 1.7x the GEMM's time on the CPU, and every
    out-of-place step a fresh N x N buffer: RKDE's two kernels went from 75 to 30 ms each at B 64, H 3,
    N 197, 1 thread.)"""
    lead, n = x.shape[:-2], x.shape[-2]
    xf = x.flatten(0, -3) if x.dim() > 2 else x.unsqueeze(0)  # (prod(lead), N, E), also when N = 0
    sq = (xf * xf).sum(-1) * (-scale)
    # 2 scale on one factor (N x E) instead of on the product (N x N): one pass fewer over the kernel
    d = torch.bmm(xf * (2 * scale), xf.transpose(-1, -2)).add_(sq.unsqueeze(-1)).add_(sq.unsqueeze(-2))
    return d.clamp_max_(0.0).reshape(*lead, n, n)  # clamp: rounding never gives K > 1


def _log_gram_backward(grad: Tensor, x: Tensor, scale: float) -> Tensor:
    """The gradient w.r.t. ``x`` of ``sum(grad * _log_gram_kernel(x, scale))``: with D = grad and
    E = D + D^T, ``2 scale (E x - (rowsum E) x)`` (rowsum E = rowsum D + colsum D) - one pass forming E, one
    GEMM and one row sum, where autograd's chain keeps several N x N temporaries. (Two GEMMs, D x and
    D^T x, and two sums took 27.3 ms against 24.5 ms at B 64, H 3, N 197, D 64, 1 thread, Intel Xeon.) The
    clamp's zero gradient on rounding-positive entries is not applied: they are the diagonal (or duplicate
    points), where the derivative of ``-scale ||x_j - x_l||^2`` is exactly 0 anyway."""
    lead = x.shape[:-2]
    xf = x.flatten(0, -3) if x.dim() > 2 else x.unsqueeze(0)
    d = grad.flatten(0, -3) if grad.dim() > 2 else grad.unsqueeze(0)
    e = d + d.transpose(-1, -2)
    out = torch.bmm(e, xf)
    out.sub_(xf * e.sum(-1, keepdim=True))
    return out.mul_(2 * scale).reshape(*lead, *x.shape[-2:])


class _RobustKernels(torch.autograd.Function):
    """RKDE's two Gram kernels, ``exp(log K_k)`` of the unit keys and ``exp(log K_k + log K_v)`` of the
    joint points [khat, v], with a hand-written backward (:func:`_log_gram_backward` for each; RKDE's
    forward + backward was 4.4-4.7x one SDPA call with autograd's)."""

    @staticmethod
    def forward(ctx, khat: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        log_k = _log_gram_kernel(khat, scale)
        kern_kv = _log_gram_kernel(v, scale).add_(log_k).exp_()
        kern_k = log_k.exp_()
        ctx.save_for_backward(khat, v, kern_k, kern_kv)
        ctx.scale = scale
        return kern_k, kern_kv

    @staticmethod
    @once_differentiable
    def backward(ctx, g_k: Tensor | None, g_kv: Tensor | None) -> tuple[Tensor | None, Tensor | None, None]:
        khat, v, kern_k, kern_kv = ctx.saved_tensors
        d_kv = None if g_kv is None else g_kv * kern_kv  # d loss / d (log K_k + log K_v)
        d_k = None if g_k is None else g_k * kern_k
        if d_kv is not None:
            d_k = d_kv if d_k is None else d_k.add_(d_kv)
        need_k, need_v = ctx.needs_input_grad[:2]
        g_khat = _log_gram_backward(d_k, khat, ctx.scale) if d_k is not None and need_k else None
        g_v = _log_gram_backward(d_kv, v, ctx.scale) if d_kv is not None and need_v else None
        return g_khat, g_v, None


def robust_kernels(khat: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """RKDE's Gram kernels of the unit keys and of the joint points [khat, v] (``(..., N, N)`` each)."""
    return _RobustKernels.apply(khat, v, scale)


# FX: an autograd Function is one leaf call.
torch.fx.wrap("robust_kernels")


def _kirwls_step(w: Tensor, t: Tensor, visf: Tensor | None, a: float, loss: str,
                 official_norm: bool) -> tuple[Tensor, Tensor]:
    """One KIRWLS step: ``(the new weights, the distances r)`` from weights ``w`` and ``t = w K``
    (t_qj = sum_l w_ql K_lj)."""
    c = (w * t).sum(-1, keepdim=True)  # w_q^T K w_q
    r2 = 1 + t + c if official_norm else 1 - 2 * t + c
    r = torch.sqrt(r2.clamp_min(1e-12))
    psi = robust_weight(r, a, loss)
    if visf is not None:
        psi = psi * visf
    return psi / psi.sum(-1, keepdim=True), r


def kirwls_weights(kern: Tensor, vis: Tensor | None, a: float, loss: str, n_iter: int,
                   official_norm: bool) -> tuple[Tensor, Tensor]:
    """Robust KDE weights of points with Gram kernel ``kern (B, H, N, N)`` (symmetric, K_jj = 1) and the
    distances r of the last step they came from, both ``(B, H, Q, N)``: Q = 1 without a mask (all queries
    share them) or N (``vis (B|1, H|1, N, N)`` bool: the keys query i sees; zero weight elsewhere). Each
    row of weights sums to 1 over its visible keys. (Since 2026-11-29 the distances too: the weights
    alone were returned before; take ``[0]``.)"""
    n = kern.shape[-1]
    visf = None if vis is None else vis.to(kern.dtype)
    if visf is None:
        w = torch.full((*kern.shape[:-2], 1, n), 1.0 / n, dtype=kern.dtype, device=kern.device)
    else:
        w = visf / visf.sum(-1, keepdim=True)  # uniform over the visible keys (NaN for a row with none)
    r = w
    for _ in range(n_iter):
        w, r = _kirwls_step(w, w @ kern, visf, a, loss, official_norm)
    return w, r


# FX: the weights branch on the mask (an input of a traced ViT); one leaf call.
torch.fx.wrap("kirwls_weights")


def _compiled_column_sums(x: Tensor) -> Any:
    """The compiled kernels' operators where they take RKDE's column sums of ``x`` (built and on, float32 /
    float64 on the CPU), else None."""
    ops = kernels.active()
    return ops if ops is not None and hasattr(ops, "rkde_colsums_backward") and cpu_float(x) else None


def _column_sums_by_blocks(khat: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """The compiled ``rkde_colsums`` in eager ops: each block of :data:`COLSUM_BLOCK` heads forms its two
    kernels, sums them and drops them, so every pass over a block runs in the cache. (Forming all the
    heads' kernels first and summing them took 50.7 ms against 31.5 ms at B 64, H 3, N 197, D 64, one
    thread, Intel Xeon.)"""
    bh, n = khat.shape[0], khat.shape[1]
    s_k, s_kv = khat.new_empty(bh, n), khat.new_empty(bh, n)
    for i in range(0, bh, COLSUM_BLOCK):
        block = slice(i, i + COLSUM_BLOCK)
        log_k = _log_gram_kernel(khat[block], scale)
        kern_kv = _log_gram_kernel(v[block], scale).add_(log_k).exp_()
        torch.sum(kern_kv, -2, out=s_kv[block])
        torch.sum(log_k.exp_(), -2, out=s_k[block])
    return s_k, s_kv


def _column_sums_backward_by_blocks(khat: Tensor, v: Tensor, g_k: Tensor, g_kv: Tensor,
                                    scale: float) -> tuple[Tensor, Tensor]:
    """The compiled ``rkde_colsums_backward`` in eager ops, a block of heads at a time: with the column sums'
    gradients g (BH, N), the kernels' gradients are ``g_l K_jl`` (each column scaled), and
    :func:`_log_gram_backward` takes them to the points (the joint kernel's to khat and to v)."""
    g_khat, g_v = torch.empty_like(khat), torch.empty_like(v)
    for i in range(0, khat.shape[0], COLSUM_BLOCK):
        block = slice(i, i + COLSUM_BLOCK)
        log_k = _log_gram_kernel(khat[block], scale)
        d_kv = _log_gram_kernel(v[block], scale).add_(log_k).exp_().mul_(g_kv[block].unsqueeze(-2))
        d_k = log_k.exp_().mul_(g_k[block].unsqueeze(-2)).add_(d_kv)
        g_khat[block] = _log_gram_backward(d_k, khat[block], scale)
        g_v[block] = _log_gram_backward(d_kv, v[block], scale)
    return g_khat, g_v


#: heads per block in the eager column sums (4-8 fastest; two 8 x 197 x 197 float32 kernels: 2.5 MB)
COLSUM_BLOCK = 8


class _KernelColumnSums(torch.autograd.Function):
    """The column sums of RKDE's two Gram kernels, ``(s_k, s_kv) (BH, N)`` of ``khat (BH, N, D)`` and
    ``v (BH, N, Dv)``, by the compiled kernels (csrc/rkde_kernels.cpp: the forward never forms the kernels,
    the backward forms each head's again in the cache) or, without them, by the same blocks in eager ops
    (:func:`_column_sums_by_blocks`); nothing N x N is saved in between."""

    @staticmethod
    def forward(ctx, khat: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        ctx.save_for_backward(khat, v)
        ctx.scale = scale
        ops = ctx.ops = _compiled_column_sums(khat)  # the backward takes the same path
        return ops.rkde_colsums(khat, v, scale) if ops is not None else _column_sums_by_blocks(khat, v, scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_k: Tensor | None, g_kv: Tensor | None) -> tuple[Tensor | None, Tensor | None, None]:
        khat, v = ctx.saved_tensors
        g_k = torch.zeros(khat.shape[:-1], dtype=khat.dtype) if g_k is None else g_k
        g_kv = torch.zeros(khat.shape[:-1], dtype=khat.dtype) if g_kv is None else g_kv
        if ctx.ops is not None:
            g_khat, g_v = ctx.ops.rkde_colsums_backward(khat, v, g_k, g_kv, ctx.scale)
        else:
            g_khat, g_v = _column_sums_backward_by_blocks(khat, v, g_k, g_kv, ctx.scale)
        return g_khat, g_v, None


def _one_step_weights(khat: Tensor, v: Tensor, scale: float, a: float, loss: str,
                      official_norm: bool) -> tuple[tuple[Tensor, Tensor], ...] | None:
    """``((wM, rM), (wJ, rJ))`` (weights, distances) of one KIRWLS step without a mask from the kernels'
    column sums (:class:`_KernelColumnSums`, compiled or eager): from uniform weights 1/N, t = w K is the
    column sums / N. None while tracing and off the CPU: then the kernels are formed."""
    if tracing() or khat.device.type != "cpu":
        return None
    lead, n = khat.shape[:-2], khat.shape[-2]
    flat_k, flat_v = khat.reshape(-1, n, khat.shape[-1]), v.reshape(-1, n, v.shape[-1])
    s_k, s_kv = _KernelColumnSums.apply(flat_k, flat_v, scale)
    w = torch.full((*lead, 1, n), 1.0 / n, dtype=khat.dtype)
    return tuple(_kirwls_step(w, (s / n).view(*lead, 1, n), None, a, loss, official_norm)
                 for s in (s_k, s_kv))


def _attention_with_key_bias(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, dropout_p: float,
                             scale: float) -> Tensor:
    """``softmax(scale q k^T + bias) v`` with a bias per key, ``bias (B, H, 1, N)``: one SDPA call.

    SDPA takes the bias as a float mask, but its CPU kernel computes no gradient for a mask, so a bias that
    needs one (training, attacks) sent the call to SDPA's math path, an N x N op at a time. There the bias
    joins the keys instead, exactly: ``scale [q, 1/scale] . [k, bias_j] = scale q.k + bias_j``, one flash
    call at width D + 1 (values padded with a zero column, dropped after). Side by side on an Intel Xeon
    (B 64, H 3, N 197, D 64, 1 thread): forward + backward 90 ms against 115 ms; without a gradient the
    masked call is the faster one (24 ms against 30 ms) and stays."""
    if tracing() or q.device.type != "cpu" or not torch.is_grad_enabled() or not bias.requires_grad:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    width = v.shape[-1]
    qx = torch.cat([q, q.new_full((*q.shape[:-1], 1), 1.0 / scale)], -1)
    kx = torch.cat([k, bias.transpose(-1, -2).expand(*k.shape[:-1], 1)], -1)
    vx = torch.cat([v, v.new_zeros((*v.shape[:-1], 1))], -1)
    return F.scaled_dot_product_attention(qx, kx, vx, dropout_p=dropout_p, scale=scale)[..., :width]


def _visible_keys(attn_mask: Tensor | None, is_causal: bool, n: int, device: Any) -> Tensor | None:
    if attn_mask is None and not is_causal:
        return None
    vis = visible(attn_mask) if attn_mask is not None else torch.ones(n, n, dtype=torch.bool, device=device)
    if vis.shape[-2] != n:  # a key-padding mask (..., 1, N): every query sees the same keys
        vis = vis.expand(*vis.shape[:-2], n, n)
    if is_causal:
        vis = vis & torch.ones(n, n, dtype=torch.bool, device=device).tril()
    while vis.dim() < 4:
        vis = vis.unsqueeze(0)
    return vis


torch.fx.wrap("_visible_keys")


class KdeAttention(QueryOptionalAttention):
    """KDE attention: ``softmax_j(-||q_i - khat_j||^2 / sqrt D) V`` with unit-norm keys (one fused call).

    Args (besides timm's):
        symmetric: True: W_Q = W_K (the queries are the un-normalised keys).
    """

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        q, khat = qkv["q"], F.normalize(qkv["k"], dim=-1)
        return F.scaled_dot_product_attention(q, khat, qkv["v"], attn_mask=attn_mask, is_causal=is_causal,
                                              dropout_p=self.dropout_p, scale=2.0 / math.sqrt(q.shape[-1]))

    def extra_repr(self) -> str:
        return f"symmetric={self.symmetric}"


# a leaf for timm's FX feature extraction (Python branches on the mask and the token count)
@register_notrace_module
class RobustAttention(QueryOptionalAttention):
    """Robust KDE attention (RKDE): joint and marginal KDEs re-weighted by KIRWLS (module docstring).

    Args (besides timm's):
        loss: ``"huber"`` (default) or ``"hampel"`` (official option, b = 2a, c = 3a, 0.01 beyond c).
        a: the threshold of the loss (official ``huber_a`` 0.2).
        n_iter: KIRWLS steps from uniform weights (official default 1).
        official_norm: True reproduces the official code's norm ``1 + sum w K + w^T K w`` (the threshold
            is then inert); False (default) the paper's ``1 - 2 sum w K + w^T K w``. ``norm_used`` says which.
        symmetric: True: W_Q = W_K.

    Hook points (:class:`~.hooks.HookPoint`, read by :func:`~.hooks.run_with_cache`): ``hook_r_keys`` and
    ``hook_r_joint``, the distances r_j of each point to the robust estimate in the last KIRWLS step, of
    the key KDE and of the joint (k, v) KDE, ``(B, H, Q, N)`` (Q = 1 without a mask); a token is inside
    the Huber threshold (weight 1) where r_j <= a (with a mask, entries of keys a query does not see are
    not used). Whether the threshold is ever reached in a trained model
    is a measurement: ``(r <= a).float().mean()``.
    """

    parameter_constraints = {**QueryOptionalAttention.parameter_constraints,
                             "loss": Choice(tuple(LOSSES)), "a": Real(min=0),
                             "n_iter": Int(min=1),
                             "official_norm": Bool()}

    def __init__(self, dim: int, num_heads: int = 8, *args: Any, loss: str = "huber", a: float = 0.2,
                 n_iter: int = 1, official_norm: bool = False, **kwargs: Any) -> None:
        self.validate_options(loss=loss, a=a, n_iter=n_iter, official_norm=official_norm)
        if a <= 0:
            raise ValueError(f"RobustAttention: a must be > 0, got {a!r}")
        super().__init__(dim, num_heads, *args, **kwargs)
        self.loss, self.a, self.n_iter, self.official_norm = loss, float(a), n_iter, official_norm
        self.hook_r_keys, self.hook_r_joint = HookPoint(), HookPoint()

    @property
    def norm_used(self) -> str:
        """Which norm the weights use: the paper's or the official code's (for reports and configs)."""
        if self.official_norm:
            return "official: 1 + sum_l w_l K_jl + w^T K w (sign error; the threshold is inert)"
        return "paper: 1 - 2 sum_l w_l K_jl + w^T K w"

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        q, v = qkv["q"], qkv["v"]
        khat = F.normalize(qkv["k"], dim=-1)
        n, d = khat.shape[-2], khat.shape[-1]
        if n == 0 or q.numel() == 0:  # no tokens (or no sequences): nothing to weight, empty in, empty out
            return q.new_zeros(q.shape) + v.sum() * 0
        scale = 1.0 / math.sqrt(d)
        vis = _visible_keys(attn_mask, is_causal, n, q.device)
        opts = (self.a, self.loss, self.n_iter, self.official_norm)
        fast = None if vis is not None or self.n_iter != 1 else _one_step_weights(
            khat, v, scale, self.a, self.loss, self.official_norm)
        if fast is not None:  # the kernels' column sums, never all the kernels in memory (one KIRWLS step)
            (w_m, r_m), (w_j, r_j) = fast
        else:
            # the kernel of [khat, v]: the squared distances add (no product of two kernels); both exps in
            # place, so the two GEMMs' outputs are the only N x N buffers; a hand-written backward
            kern_k, kern_kv = robust_kernels(khat, v, scale)
            w_m, r_m = kirwls_weights(kern_k, vis, *opts)
            w_j, r_j = kirwls_weights(kern_kv, vis, *opts)
        self.hook_r_keys(r_m)
        self.hook_r_joint(r_j)
        # out_i = sum_j wM_ij e^{s_ij} (wJ_ij / wM_ij) v_j / sum_j wM_ij e^{s_ij}: one softmax with the log
        # marginal weights added to the logits (2 q.khat / sqrt D, the rest of s_ij cancels)
        if vis is None:  # shared weights: a fused call on the re-weighted values
            return _attention_with_key_bias(q, khat, v * (w_j / w_m).transpose(-1, -2), torch.log(w_m),
                                            self.dropout_p, 2 * scale)
        # hidden keys have zero weights: keep 0/0 and log(0) out of the graph (their gradients would be NaN)
        w_m = torch.where(vis, w_m, 1.0)
        logits = (q @ khat.transpose(-1, -2)) * (2 * scale) + torch.log(w_m)
        if attn_mask is not None and attn_mask.dtype != torch.bool:  # an additive mask's finite biases
            logits = logits + torch.where(vis, attn_mask, 0.0)
        attn = torch.softmax(logits.masked_fill(~vis, float("-inf")), dim=-1)
        attn = attn * torch.where(vis, w_j / w_m, 0.0)
        attn = self.attn_drop(attn)
        return attn @ v

    def extra_repr(self) -> str:
        return (f"loss={self.loss!r}, a={self.a}, n_iter={self.n_iter}, official_norm={self.official_norm} "
                f"({self.norm_used}), symmetric={self.symmetric}")


register_mechanism("kde", KdeAttention,
                   description="KDE attention: softmax(-||q - khat||^2 / sqrt D) V, unit-norm keys")
register_mechanism(
    "rkde", RobustAttention, dict(loss="huber", a=0.2, n_iter=1, official_norm=False),
    description="robust KDE attention: Huber (a = 0.2) KIRWLS weights on the joint (k, v) and key KDEs, "
                "the paper's norm (official_norm=True: the official code's)",
)
