"""Principal Attention Pursuit (PAP), Algorithm 1 of Teo & Nguyen (NeurIPS 2024), batched.

Shapes: ``k``, ``v`` (and ``q``) are ``(B, H, N, D)``: batch, heads, tokens, head width.

The official code (github rachtsy/KPCA_code) runs, with L0 = Y0 = 0 and n softmax evaluations::

    mu  = N * C / (4 * ||K_bh||_1)                 one value per (batch, head); C = H * D
    S_t = shrink(K - L_{t-1} + Y_{t-1} / mu, tau)   tau = lam * mu   (the paper writes lam / mu)
    X_t = K - S_t - Y_{t-1} / mu
    L_t = softmax(X_t X_t^T / sqrt(D)) V
    Y_t = Y_{t-1} + mu (K - L_t - S_t)

Implementation (why it looks different but computes the same numbers):

* The dual only ever appears as ``W = Y / mu``; since mu is constant over the iterations,
  ``W_t = W_{t-1} + K - L_t - S_t`` and mu enters only through the threshold tau.
* ``Z - shrink(Z, tau) = clamp(Z, -tau, tau)``. Writing ``C_t = clamp(K - L_{t-1} + W_{t-1})``
  gives ``X_t = C_t + L_{t-1} - 2 W_{t-1}`` and ``W_t = L_{t-1} - L_t + C_t``: S is never formed,
  and with L0 = W0 = 0 the first step is just ``X_1 = clamp(K, -tau, tau)``.
* Each softmax step goes through
  ``torch.nn.functional.scaled_dot_product_attention`` so no N x N matrix is materialised where
  SDPA avoids it. Gradients flow through every iteration, mu and tau included (not detached, as
  in the official code). The elementwise update between two softmax steps is one autograd
  Function with a hand-written backward (first-order only: no double backward).
* Without an autograd graph on the CPU (inference, evaluation), :func:`_pap_fused` runs instead:
  every step is the cutoff softmax of :func:`cutoff_attention` (blocked, never subnormal) and each
  block's update is done while its rows are in the cache; one output buffer serves every step.
  Same numbers to rounding (tests/test_pap_numerics.py).
* With a graph on the CPU, symmetric, without dropout and with small attention matrices (training
  at ViT sizes), :class:`_PAPSaved` runs the same loop as one autograd Function that keeps each
  step's probabilities and walks the steps back in its own backward (docs/pap.md, section 9).

Masks:

* ``attn_mask`` is anything SDPA accepts (boolean, True = may attend; or additive float, where
  ``-inf`` or a value <= half the dtype's lowest hides a key), broadcastable to ``(B, H, N, N)``,
  or a key-padding mask of shape ``(B, N)`` (boolean, True = real token).
* mu is computed per query from the keys that query may see:
  ``mu_i = n_i * C / (4 * sum_{j in V_i} ||k_j||_1)`` over the n_i keys V_i visible to query i.
  Padded keys thus take no part in mu; without a mask it is the official value.
* ``is_causal=True``: output i sees nothing from positions > i. The official mu is a mean over
  the whole sequence and would leak the future; here V_i = {j <= i} (prefix mu, equal to the
  official value at the last position). Every other PAP update is row-wise, hence causal. An
  explicit lower-triangular ``attn_mask`` gives the same result.

Ablations: ``sparse=False`` forces S = 0 (tau = +inf: no shrinkage; what is left is
iterated symmetric attention with the dual feedback, ``X_t = K - W_{t-1}``, ``W_t = W_{t-1} + K - L_t``,
independent of lam and mu); ``dual=False`` drops the dual update (Y = 0 throughout:
``S_t = shrink(K - L_{t-1}, tau)``, ``X_t = K - S_t``). Both off is plain symmetric attention.

Zero keys: ``||K||_1`` is floored at ``eps = torch.finfo(dtype).eps`` (times the token count), so an
all-zero K gives a large finite mu. Every row of X is then the same at every step (K's rows are
all 0 and L's rows all equal), the attention is uniform and the output is the mean of V over the
visible keys, under either threshold convention.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

Threshold = Literal["lambda_mu", "lambda_over_mu"]
THRESHOLDS: tuple[str, ...] = ("lambda_mu", "lambda_over_mu")

__all__ = [
    "pap", "pap_mu", "shrink", "THRESHOLDS", "check_options", "visible", "tracing", "checks_values",
    "cutoff_attention", "softmax_cutoff", "TRACE_KEYS",
]


def shrink(x: Tensor, tau: Tensor | float) -> Tensor:
    """Soft-thresholding (the proximal map of tau * ||.||_1): ``sign(x) * max(|x| - tau, 0)``."""
    return x - torch.clamp(x, -tau, tau) if isinstance(tau, Tensor) else F.softshrink(x, tau)


def tracing() -> bool:
    """True while code is traced or compiled: FX symbolic tracing, ``torch.jit`` tracing or scripting,
    ``torch.compile`` and ``torch.export``. Then nothing may branch in Python on a tensor's values:
    it would be a TraceError (FX), a constant baked into the trace (``jit.trace``) or a graph break."""
    return bool(
        torch.jit.is_scripting() or torch.jit.is_tracing() or torch.compiler.is_compiling()
        # torch has no public name for this flag (torch.fx._symbolic_trace is where FX keeps it)
        or torch.fx._symbolic_trace.is_fx_symbolic_tracing()
    )


def checks_values(validate: bool | None, device: torch.device) -> bool:
    """Whether input checks that read tensor values (NaN/Inf, a NaN mask, mu > 0) run.

    ``validate=None`` (the default of :func:`pap`): in eager mode on the CPU, where such a check is one
    pass over the data; not on an accelerator, where every check is a host-device synchronisation in
    every forward of every layer, and not while tracing or compiling (see :func:`tracing`).
    ``True``: in eager mode on every device (a debug mode). ``False``: never. Checks of shapes, dtypes
    and options need no values and always run in eager mode.
    """
    if validate is False or tracing():
        return False
    return validate is True or device.type == "cpu"


def _check_finite(name: str, t: Tensor) -> None:
    # Called only when checks_values(): this reads the tensor on the host.
    # A sum is one pass without allocation and propagates NaN/Inf; only when it is not finite
    # (or overflowed) is the exact elementwise check paid for.
    if torch.isfinite(t.sum()) or torch.isfinite(t).all():
        return
    n_nan = int(torch.isnan(t).sum())
    n_inf = int(torch.isinf(t).sum())
    raise ValueError(f"pap: {name} contains non-finite values ({n_nan} NaN, {n_inf} Inf)")


def visible(attn_mask: Tensor) -> Tensor:
    """Boolean "query i may attend to key j" of a normalised mask, shape ``(..., N | 1, N | 1)``.

    An additive mask hides a key with ``-inf`` or with a large negative number (at most half the
    dtype's lowest value, the convention of Hugging Face masks): either gives it softmax weight 0.
    """
    if attn_mask.dtype == torch.bool:
        return attn_mask
    return attn_mask > torch.finfo(attn_mask.dtype).min / 2


def _key_validity(attn_mask: Tensor | None, shape: tuple[int, int, int, int]) -> Tensor | None:
    """Which keys take part: ``(B, H, N)`` bool (False = padding, a key no query may attend to),
    or None without a mask."""
    if attn_mask is None:
        return None
    b, h, n, _ = shape
    valid = visible(attn_mask).any(dim=-2)
    valid = valid.reshape((1,) * (3 - valid.dim()) + tuple(valid.shape))
    # returned even when every key is valid: testing that would read the values on the host
    return torch.broadcast_to(valid, (b, h, n))


def pap_mu(
    k: Tensor,
    mu_dim: int | None = None,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
) -> Tensor:
    """The official step size ``mu = N * mu_dim / (4 * ||K||_1)`` per (batch, head).

    With a mask, every query row i gets its own ``mu_i = n_i * mu_dim / (4 * sum_{j in V_i} ||k_j||_1)``
    over the set V_i of the n_i keys that query i may attend to, so that mu carries nothing across
    the mask: padded keys take no part, and under a causal mask V_i is the prefix j <= i.
    Without a mask every V_i is the whole sequence and this is the official value.

    Args:
        k: keys ``(B, H, N, D)``.
        mu_dim: the width in the numerator; default ``H * D`` (official code); the paper uses D.
        attn_mask: an SDPA mask (bool, True = may attend; or additive float), broadcastable to
            ``(B, H, N, N)``.
        is_causal: add the causal mask (V_i = {j <= i}).

    Returns:
        ``(B, H, 1, 1)`` when all queries see the same keys (no mask, key padding), else
        ``(B, H, N, 1)``; float32 for half-precision keys (else k's dtype). A zero ``||K||_1``
        is floored at ``n_i * eps`` (see the module docstring).
    """
    b, h, n, d = k.shape
    if mu_dim is None:
        mu_dim = h * d
    else:
        check_options(mu_dim=mu_dim, where="pap_mu")
    acc = torch.promote_types(k.dtype, torch.float32)  # N * C overflows float16
    eps = torch.finfo(acc).eps
    if attn_mask is None and not is_causal:
        # the common case in one pass without a |K| temporary
        l1 = torch.linalg.vector_norm(k.flatten(-2), ord=1, dim=-1, dtype=acc)[:, :, None]  # (B, H, 1)
        cnt = torch.full_like(l1, float(n))
    else:
        row_l1 = k.abs().sum(-1, dtype=acc)  # (B, H, N)
        if attn_mask is None:  # causal only: prefix sums
            l1 = row_l1.cumsum(-1)
            cnt = torch.arange(1, n + 1, dtype=acc, device=k.device)
        else:
            vis = visible(attn_mask)
            vis = torch.broadcast_to(vis, (*vis.shape[:-1], n))
            if is_causal:
                vis = vis & torch.ones(n, n, dtype=torch.bool, device=k.device).tril()
            vis_f = vis.to(acc)  # (..., N | 1, N)
            if vis.shape[-2] == 1:  # every query sees the same keys (key padding)
                l1 = (vis_f * row_l1[:, :, None, :]).sum(-1)  # (B, H, 1)
            else:
                l1 = (vis_f @ row_l1[..., None]).squeeze(-1)  # (B, H, N)
            cnt = vis_f.sum(-1)
    cnt = cnt.clamp_min(1.0)
    mu = cnt * mu_dim / (4.0 * torch.maximum(l1, eps * cnt))
    return mu.unsqueeze(-1)


def _merge_masks(
    attn_mask: Tensor | None, is_causal: bool, n: int, device: torch.device
) -> tuple[Tensor | None, bool]:
    """SDPA takes either a mask or is_causal; combine them into one mask when both are given."""
    if attn_mask is None or not is_causal:
        return attn_mask, is_causal
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    if attn_mask.dtype == torch.bool:
        return attn_mask & causal, False
    return attn_mask.masked_fill(~causal, float("-inf")), False


def _is_count(x: object) -> bool:
    """An integer, Python or NumPy, but not a bool (``True`` is no count of anything)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_options(
    *,
    n_iter: int = 4,
    lam: float = 4.0,
    threshold: str = "lambda_mu",
    mu_dim: int | None = None,
    dropout_p: float = 0.0,
    where: str = "pap",
) -> None:
    """Check PAP's scalar options; raise ValueError naming the option, the value and what is valid.

    Shared by :func:`pap` and the layers that call it (which check at construction). ``where``
    prefixes the message (the function or class name).
    """
    if not _is_count(n_iter) or n_iter < 1:
        raise ValueError(f"{where}: n_iter must be an integer >= 1 (softmax steps), got {n_iter!r}")
    if isinstance(lam, bool) or not (isinstance(lam, numbers.Real) and math.isfinite(lam) and lam > 0):
        raise ValueError(f"{where}: lam must be a finite number > 0, got {lam!r}")
    if not isinstance(threshold, str) or threshold not in THRESHOLDS:
        raise ValueError(f"{where}: unknown threshold {threshold!r}; valid: {', '.join(THRESHOLDS)}")
    if mu_dim is not None and (not _is_count(mu_dim) or mu_dim < 1):
        # mu_dim = 0 gives mu = tau = 0 (the output is the mean of V); a negative one a negative tau
        raise ValueError(
            f"{where}: mu_dim must be None (the full width H * D) or an integer >= 1, got {mu_dim!r}"
        )
    if isinstance(dropout_p, bool) or not (isinstance(dropout_p, numbers.Real) and 0.0 <= dropout_p < 1.0):
        raise ValueError(f"{where}: dropout_p must be in [0, 1), got {dropout_p!r}")


def _validate(k: Tensor, v: Tensor, q: Tensor | None, check: bool) -> None:
    """Shapes and dtypes (always); NaN/Inf in k, v, q only when ``check`` (see :func:`checks_values`)."""
    if k.dim() != 4:
        raise ValueError(f"pap: k must have shape (B, H, N, D), got {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"pap: v must have shape (B, H, N, Dv) with (B, H, N) = {tuple(k.shape[:3])} of k, "
            f"got {tuple(v.shape)}"
        )
    if v.shape[-1] != k.shape[-1]:
        # L_t (shape of V) is subtracted from K in the next step, so both need width D.
        raise ValueError(f"pap: v must have the head width of k ({k.shape[-1]}), got {v.shape[-1]}")
    if q is not None and q.shape != k.shape:
        raise ValueError(f"pap: q must have the shape of k {tuple(k.shape)}, got {tuple(q.shape)}")
    if not k.is_floating_point() or v.dtype != k.dtype or (q is not None and q.dtype != k.dtype):
        raise ValueError(
            f"pap: k, v (and q) must share one floating dtype, got k {k.dtype}, v {v.dtype}"
            + (f", q {q.dtype}" if q is not None else "")
        )
    if not check:
        return
    _check_finite("k", k)
    _check_finite("v", v)
    if q is not None:
        _check_finite("q", q)


def _normalise_mask(attn_mask: Tensor | None, k: Tensor, check: bool) -> Tensor | None:
    if attn_mask is None:
        return None
    b, _, n, _ = k.shape
    if attn_mask.dim() == 2 and attn_mask.shape == (b, n) and attn_mask.dtype == torch.bool:
        if b == n:
            raise ValueError(
                f"pap: a boolean attn_mask of shape {(b, n)} is ambiguous when B == N: pass a key-padding "
                "mask as (B, 1, 1, N) or a query-key mask as (1, 1, N, N)"
            )
        return attn_mask[:, None, None, :]  # key padding (B, N) -> (B, 1, 1, N)
    try:
        if attn_mask.dim() > 4:
            raise RuntimeError
        torch.broadcast_shapes(attn_mask.shape, (b, k.shape[1], n, n))
    except RuntimeError:
        raise ValueError(
            f"pap: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (B, H, N, N) = "
            f"{(b, k.shape[1], n, n)}; a key-padding mask must be boolean (B, N) = {(b, n)}"
        ) from None
    if attn_mask.dtype != torch.bool and attn_mask.dtype != k.dtype:
        raise ValueError(f"pap: attn_mask must be bool or {k.dtype}, got {attn_mask.dtype}")
    if check and attn_mask.dtype != torch.bool and torch.isnan(attn_mask).any():
        raise ValueError("pap: additive attn_mask contains NaN")
    return attn_mask


def pap(
    k: Tensor,
    v: Tensor,
    n_iter: int = 4,
    lam: float = 4.0,
    *,
    mu: Tensor | float | None = None,
    mu_dim: int | None = None,
    threshold: Threshold = "lambda_mu",
    q: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    sparse: bool = True,
    dual: bool = True,
    return_info: bool = False,
    validate: bool | None = None,
) -> Tensor | tuple[Tensor, dict]:
    """Principal Attention Pursuit: the low-rank output L of RPC-Attention.

    Args:
        k: keys ``(B, H, N, D)`` (in the symmetric layer also the queries).
        v: values ``(B, H, N, D)``.
        n_iter: number of softmax evaluations (>= 1).
        lam: lambda (> 0); the shrinkage threshold is ``lam * mu`` or ``lam / mu``.
        mu: explicit step size (scalar, or a tensor broadcastable to ``(B, H, N, 1)``);
            overrides the official rule of :func:`pap_mu`.
        mu_dim: width used by the official rule; default ``H * D`` (code), the paper's is ``D``.
        threshold: ``"lambda_mu"`` (official code, tau = lam * mu) or ``"lambda_over_mu"``
            (the paper, tau = lam / mu).
        q: queries ``(B, H, N, D)`` for the asymmetric variant (paper E.9): softmax(Q X^T) V.
        attn_mask: SDPA mask or ``(B, N)`` key-padding mask (True = real token).
        is_causal: causal attention, with a prefix mu (nothing from j > i reaches output i).
        dropout_p: attention dropout, applied to the last softmax only (as the official layer).
        sparse: False forces S = 0 (tau = +inf), an ablation: iterated attention with dual feedback.
        dual: False removes the dual update (Y = 0 throughout), an ablation.
        return_info: also return a dict of per-iteration diagnostics (see :class:`_Trace`).
        validate: whether the checks that read tensor values (NaN/Inf in k, v, q; NaN in an additive
            mask; a tensor ``mu`` > 0) run: None (default) in eager mode on the CPU only, True in eager
            mode on any device (each check is then a host-device synchronisation), False never. See
            :func:`checks_values`. Shapes, dtypes and options are checked in every eager call.

    Returns:
        ``L`` of shape ``(B, H, N, D)``, or ``(L, info)`` when ``return_info``.
    """
    check_options(n_iter=n_iter, lam=lam, threshold=threshold, mu_dim=mu_dim, dropout_p=dropout_p)
    if not (isinstance(sparse, bool) and isinstance(dual, bool)):
        raise ValueError(f"pap: sparse and dual must be bool, got sparse={sparse!r}, dual={dual!r}")
    if validate not in (None, True, False):
        raise ValueError(f"pap: validate must be None, True or False, got {validate!r}")
    check = checks_values(validate, k.device)
    _validate(k, v, q, check)
    attn_mask = _normalise_mask(attn_mask, k, check)
    if mu is None:
        mu_t = pap_mu(k, mu_dim, attn_mask=attn_mask, is_causal=is_causal)
    else:
        if not isinstance(mu, Tensor) and (
            isinstance(mu, bool) or not isinstance(mu, numbers.Real) or not (math.isfinite(mu) and mu > 0)
        ):
            raise ValueError(f"pap: mu must be finite and > 0, got {mu!r}")
        mu_t = torch.as_tensor(mu, dtype=torch.promote_types(k.dtype, torch.float32), device=k.device)
        if check and (not torch.isfinite(mu_t).all() or (mu_t <= 0).any()):
            raise ValueError("pap: mu must be finite and > 0")
    tau = lam * mu_t if threshold == "lambda_mu" else lam / mu_t
    if tau.dtype != k.dtype:  # half precision: mu and tau were computed in float32
        tau = tau.clamp(max=torch.finfo(k.dtype).max).to(k.dtype)
    if tau.dim() < 4:
        tau = tau.reshape(*([1] * (4 - tau.dim())), *tau.shape)
    sdpa_mask, sdpa_causal = _merge_masks(attn_mask, is_causal, k.shape[-2], k.device)
    if torch.compiler.is_compiling() and not return_info:
        return _pap_compiled(k, v, q, tau, sdpa_mask, sdpa_causal, dropout_p, n_iter, sparse, dual)

    scratch = _Scratch()  # the cutoff steps' block buffers, shared by all steps of this call

    def attend(x: Tensor, last: bool) -> Tensor:
        query, p = (x if q is None else q), (dropout_p if last else 0.0)
        if _uses_cutoff(query, x, sdpa_mask):  # CPU, logits may span > softmax_cutoff: see there
            return _cutoff(query, x, v, sdpa_mask, sdpa_causal, p, softmax_cutoff(x.dtype), scratch)
        return F.scaled_dot_product_attention(
            query, x, v, attn_mask=sdpa_mask, is_causal=sdpa_causal, dropout_p=p
        )

    if not (sparse and dual):
        return _pap_ablated(k, tau, mu_t, attend, n_iter, sparse, dual, attn_mask, return_info)
    grad_mode = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (k, v, q, tau)
    )
    if _cpu_float(k) and not (return_info or tracing()):
        if not grad_mode:
            return _pap_fused(k, v, q, tau, sdpa_mask, sdpa_causal, dropout_p, n_iter)
        if _saves_probabilities(k, q, dropout_p, n_iter):
            hidden, bias = _hidden_and_bias(sdpa_mask, sdpa_causal, k.shape[-2], k.shape[-2], k.device)
            return _PAPSaved.apply(k, v, tau, hidden, bias, n_iter)
    trace = _Trace(k, mu_t, tau, _key_validity(attn_mask, tuple(k.shape))) if return_info else None
    # State after step t: L_t and R_t = C_t + L_{t-1}, so that W_t = Y_t / mu = R_t - L_t.
    # Step 1 (L0 = W0 = 0): X_1 = R_1 = clamp(K).
    if grad_mode:
        X = R = _Clamp.apply(k, tau)
    else:
        # Without an autograd graph three buffers are reused in place: at this size the page
        # faults of fresh allocations cost more than the arithmetic.
        X = R = _clamp(k, tau)
    L_prev = W_prev = None
    for t in range(n_iter):
        last = t == n_iter - 1
        L = attend(X, last)
        if trace is not None:
            trace.record(L, L_prev, W_prev)
            W_prev, L_prev = R - L, L
        if last:
            break
        if grad_mode:
            R, X = _Update.apply(k, L, R, tau)
        else:
            R, X = _update(k, L, R, tau, spare=X if X is not R else None)
    if trace is not None:
        return L, trace.info
    return L


def _pap_compiled(
    k: Tensor, v: Tensor, q: Tensor | None, tau: Tensor, sdpa_mask: Tensor | None, sdpa_causal: bool,
    dropout_p: float, n_iter: int, sparse: bool, dual: bool,
) -> Tensor:
    """PAP as ``torch.compile`` sees it: Algorithm 1 in plain differentiable ops, every variant.

    With W = Y / mu:  S_t = shrink(K - L_{t-1} + W_{t-1}, tau) (0 when not ``sparse``),
    X_t = K - S_t - W_{t-1},  L_t = softmax(X_t X_t^T / sqrt(D)) V,  W_t = W_{t-1} + K - L_t - S_t
    (W stays 0 when not ``dual``). The eager path's hand-written autograd Functions, in-place buffers
    and blocked CPU softmax (out= writes into views, a thread-count query) are eager-mode
    optimisations that would each break the graph; the compiler fuses the elementwise work and
    derives the backward itself. The softmax steps are SDPA on an accelerator, and on the CPU
    :func:`_cutoff_attention_ops` (the cutoff of :func:`cutoff_attention` in plain ops, so that no
    subnormal arises in the compiled forward or backward either).
    """
    attention = _cutoff_attention_ops if _cpu_float(k) else F.scaled_dot_product_attention
    L: Tensor | None = None
    W: Tensor | None = None
    for t in range(n_iter):
        Z = k if L is None else (k - L if W is None else k - L + W)  # K - L_{t-1} + W_{t-1}
        S = Z - torch.clamp(Z, -tau, tau) if sparse else None  # shrink(Z, tau)
        X = k if S is None else k - S
        if W is not None:
            X = X - W
        L = attention(
            X if q is None else q, X, v, attn_mask=sdpa_mask, is_causal=sdpa_causal,
            dropout_p=dropout_p if t == n_iter - 1 else 0.0,
        )
        if dual and t < n_iter - 1:
            R = k - L if S is None else k - L - S
            W = R if W is None else W + R
    assert L is not None  # n_iter >= 1 (checked)
    return L


def _flat_tau(tau: Tensor, b: int, h: int) -> tuple[Tensor, Tensor]:
    """tau and -tau as ``(B * H, 1 | N, 1)``, indexed like the flattened ``(B * H, N, D)`` keys."""
    tau_f = torch.broadcast_to(tau, (b, h, tau.shape[-2], 1)).reshape(b * h, tau.shape[-2], 1)
    return tau_f, tau_f.neg()


def _pap_fused(
    k: Tensor, v: Tensor, q: Tensor | None, tau: Tensor, sdpa_mask: Tensor | None, sdpa_causal: bool,
    dropout_p: float, n_iter: int,
) -> Tensor:
    """PAP without an autograd graph on the CPU (float32 / float64): inference and evaluation.

    The same iteration as :func:`pap`'s loop, with every softmax step the cutoff softmax of
    :func:`cutoff_attention` (which equals SDPA's to rounding and never meets a subnormal, so no
    per-step dispatch check is needed) and the update between two steps done block by block, right
    after a block's output rows are computed, while they and the block's keys are still in the cache:
    the update's seven elementwise passes then run over ~1 MiB instead of over all of
    ``(B, H, N, D)`` in memory. Buffers: three ``(B, H, N, D)`` arrays for the whole call (X = R at
    step 1, the first update's spare, L) and one block of scores; the iterates swap between the
    first two.
    """
    b, h, nq, d = k.shape if q is None else q.shape
    n, dv = k.shape[-2], v.shape[-1]
    bh = b * h
    scale, cutoff = 1.0 / math.sqrt(d), softmax_cutoff(k.dtype)
    hidden, bias = _hidden_and_bias(sdpa_mask, sdpa_causal, nq, n, k.device)
    kf, vf = k.reshape(bh, n, d), v.reshape(bh, n, dv)
    qf = None if q is None else q.reshape(bh, nq, d)
    tau_f, ntau_f = _flat_tau(tau, b, h)
    blocks = _blocks(bh, nq, n)
    buf = _Scratch().get(0, blocks, nq, n, k)
    m = torch.empty(bh, nq, 1, dtype=k.dtype)
    l_sum = torch.empty_like(m)
    A = _clamp(kf, tau_f)  # step 1 (L0 = W0 = 0): X_1 = R_1 = clamp(K)
    C = torch.empty_like(A) if n_iter > 1 else A  # the first update's spare
    L = torch.empty(bh, nq, dv, dtype=k.dtype)
    # Every view a block needs, made once per call (4 steps x 32 blocks x ~15 views would cost ~3 ms in
    # slicing alone): the keys and queries of step t are A's or C's rows, by the parity of t.
    views = []
    for bs, qs in blocks:
        last_band = qs.stop == nq  # the head's rows are all done after this block: update them
        views.append((
            kf[bs], vf[bs], A[bs], C[bs], A[bs, qs], C[bs, qs], None if qf is None else qf[bs, qs],
            _block_of(buf, bs.stop - bs.start, qs.stop - qs.start, n), _mask_block(hidden, (b, h), bs, qs),
            _mask_block(bias, (b, h), bs, qs), L[bs, qs], L[bs], m[bs, qs],
            l_sum[bs, qs], tau_f[bs], ntau_f[bs], last_band,
        ))
    for t in range(n_iter):
        last = t == n_iter - 1
        p = dropout_p if last else 0.0
        # roles (_update leaves R_{t+1} in the spare's buffer, which from step 2 on is X_t's, and X_{t+1}
        # in R_t's): step 1 X = R = A (spare C); then (X, R) = (A, C), (C, A), (A, C), ...
        x_is_a, r_is_a = t == 0 or t % 2 == 1, t % 2 == 0
        for kb, vb, Ab, Cb, Aq, Cq, qb, S, hid, bias_b, ob, Lb, mb, lb, tb, ntb, last_band in views:
            Xb, Xq = (Ab, Aq) if x_is_a else (Cb, Cq)
            Rb = Ab if r_is_a else Cb
            _softmax_block(Xq if qb is None else qb, Xb, vb, S, hid, bias_b, scale, cutoff, p, ob, mb, lb)
            if last or not last_band:
                continue
            # every output row of these heads is done and their keys are needed no more:
            # (K, L_t, R_t) -> (R_{t+1}, X_{t+1}) for these rows
            _update(kb, Lb, Rb, tb, spare=Cb if t == 0 else Xb, neg_tau=ntb)
    return L.view(b, h, nq, dv)


_SAVED_P_FLOATS = 1 << 26  # probabilities _PAPSaved may keep for its backward: 256 MiB of float32


def _saves_probabilities(k: Tensor, q: Tensor | None, dropout_p: float, n_iter: int) -> bool:
    """Whether :class:`_PAPSaved` takes a graph-mode call: symmetric, no dropout, every softmax block
    holding whole rows, and the ``n_iter`` attention matrices within ``_SAVED_P_FLOATS``."""
    b, h, n, _ = k.shape
    if q is not None or dropout_p > 0 or n_iter * b * h * n * n > _SAVED_P_FLOATS:
        return False
    return all(qs.stop - qs.start == n for _, qs in _blocks(b * h, n, n))


class _PAPSaved(torch.autograd.Function):
    """PAP with an autograd graph on the CPU (float32 / float64), symmetric, when the attention matrices
    are small: the whole iteration as one Function that keeps each step's probabilities.

    Forward: :func:`_pap_fused`'s loop (every step the cutoff softmax, each block's update while its
    rows are in the cache), keeping X_t, L_t, C_t and the normalised probabilities P_t of every step
    (``n_iter * B * H * N * N`` floats, at most ``_SAVED_P_FLOATS``). Backward, step by step in reverse
    and block by block: with the saved P no score is recomputed, and since the queries are the keys,
    dX = (dS + dS^T) X / sqrt(D) takes two GEMMs where a query-key backward takes three (recomputing the
    scores, dQ, dK); the update's backward runs on a block's rows right after its dX. dK, dV and dtau
    accumulate in place. Against a Function per step (SDPA's flash backward recomputes the scores and
    forms dQ and dK; autograd sums the gradients out of place), PAP forward + backward is 8-13 % faster
    at 1 thread at ViT-tiny sizes (docs/benchmarks.md). Equal to the step-by-step graph to rounding
    (tests/test_pap.py). An additive mask receives no gradient (as in :func:`cutoff_attention`).
    """

    @staticmethod
    def forward(ctx, k: Tensor, v: Tensor, tau: Tensor, hidden: Tensor | None, bias: Tensor | None,
                n_iter: int) -> Tensor:
        b, h, n, d = k.shape
        bh = b * h
        scale, cutoff = 1.0 / math.sqrt(d), softmax_cutoff(k.dtype)
        kf, vf = k.reshape(bh, n, d), v.reshape(bh, n, d)
        tau_f, ntau_f = _flat_tau(tau, b, h)
        blocks = _blocks(bh, n, n)
        masks = [tuple(_mask_block(mask, (b, h), bs, qs) for mask in (hidden, bias)) for bs, qs in blocks]
        P = k.new_empty(n_iter, bh, n, n)
        m = k.new_empty(bh, n, 1)
        l_sum = torch.empty_like(m)
        X0 = _clamp(kf, tau_f)  # step 1 (L0 = W0 = 0): X_1 = R_1 = C_0 = clamp(K)
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
                _softmax_block(Xb, Xb, vf[bs], S, hid, bias_b, scale, cutoff, 0.0, Lb, mb, lb)
                S.div_(lb)
                if not last:  # (K, L_t, R_t) -> (C_t, R_{t+1}, X_{t+1}) for these rows
                    _update_into(kf[bs], Lb, R_in[bs], tau_f[bs], ntau_f[bs], Cs[-1][bs], Xs[-1][bs], R[bs])
        ctx.save_for_backward(kf, vf, tau_f, P, *Xs, *Ls, *Cs)
        ctx.n_iter, ctx.blocks, ctx.tau_shape = n_iter, blocks, tau.shape
        return Ls[-1].view(b, h, n, d)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        n_iter = ctx.n_iter
        kf, vf, tau_f, P, *rest = ctx.saved_tensors
        Xs, Ls, Cs = rest[:n_iter], rest[n_iter:2 * n_iter], rest[2 * n_iter:]
        bh, n, d = kf.shape
        b, h = g.shape[:2]
        scale = 1.0 / math.sqrt(d)
        need_tau = ctx.needs_input_grad[2]
        gf = g.reshape(bh, n, d)
        g_k, g_v, g_tau = torch.empty_like(kf), torch.empty_like(vf), torch.zeros_like(tau_f)
        dL = torch.empty_like(kf) if n_iter > 1 else None  # dLoss / dL_{t-1}, from update t-1's backward
        dR = torch.empty_like(kf) if n_iter > 1 else None  # dLoss / dR_{t-1}
        nb_max = max(bs.stop - bs.start for bs, _ in ctx.blocks)
        buf_dp = kf.new_empty(nb_max * n * n)
        buf_dx, buf_in, buf_out = (kf.new_empty(nb_max * n * d) for _ in range(3))
        for t in reversed(range(n_iter)):
            last = t == n_iter - 1
            X, L, C, G = Xs[t], Ls[t], Cs[t], (gf if last else dL)
            for bs, _ in ctx.blocks:
                nb = bs.stop - bs.start
                Xb, Gb, Pb = X[bs], G[bs], P[t, bs]
                delta = torch.bmm(Gb.reshape(-1, 1, d), L[bs].reshape(-1, d, 1)).view(nb, n, 1)
                dP = torch.bmm(Gb, vf[bs].transpose(1, 2), out=_block_of(buf_dp, nb, n, n))
                if last:
                    torch.bmm(Pb.transpose(1, 2), Gb, out=g_v[bs])
                else:
                    g_v[bs].baddbmm_(Pb.transpose(1, 2), Gb)
                dS = dP.sub_(delta).mul_(Pb)  # d(loss)/d(logits), unscaled
                dX = torch.bmm(dS, Xb, out=_block_of(buf_dx, nb, n, d))
                dX.baddbmm_(dS.transpose(1, 2), Xb).mul_(scale)  # X is the queries and the keys
                # back through the clamp that made X_t and R_t (C_0 = clamp(K), or update t-1):
                # dC = dR_t + dX_t; dZ = dC inside the clamp; dK += dZ; tau gets sum(dC * C / tau) outside.
                # dR[bs] holds dR_t until dC is formed in it, then dR_{t-1}.
                dC = dX if last else dR[bs].add_(dX)
                dZ, part = _clamp_backward(dC, C[bs], tau_f[bs], need_tau, out=_block_of(buf_in, nb, n, d),
                                           tmp=_block_of(buf_out, nb, n, d))
                if part is not None:
                    g_tau[bs] += part
                if last:
                    g_k[bs].copy_(dZ)
                else:
                    g_k[bs].add_(dZ)
                if t > 0:  # update t-1 made X_t and R_t: dL_{t-1} and dR_{t-1} for these rows
                    _update_backward(dC, dX, dZ, g_L=dL[bs], g_R=dR[bs])
        g_tau = g_tau.view(b, h, -1, 1).sum_to_size(ctx.tau_shape) if need_tau else None
        return g_k.view(b, h, n, d), g_v.view(b, h, n, d), g_tau, None, None, None


def _pap_ablated(
    k: Tensor, tau: Tensor, mu: Tensor, attend: Callable[[Tensor, bool], Tensor], n_iter: int,
    sparse: bool, dual: bool, attn_mask: Tensor | None, return_info: bool,
) -> Tensor | tuple[Tensor, dict]:
    """PAP with S forced to zero (``sparse=False``) and/or without the dual update (``dual=False``).

    S = 0 (dual kept), with W = Y / mu:  X_t = K - W_{t-1},  W_t = W_{t-1} + K - L_t.
    Y = 0 (shrinkage kept):  X_t = K - shrink(K - L_{t-1}, tau) = L_{t-1} + clamp(K - L_{t-1}, tau).
    Both off: X_t = K at every step (symmetric attention). Plain autograd is used except for the
    clamp, whose hand-written backward (:class:`_Clamp`) is cheaper than autograd's.
    """
    if not sparse:
        tau = torch.full_like(tau, float("inf"))  # S = shrink(., inf) = 0; reported as such in the trace
    trace = _Trace(k, mu, tau, _key_validity(attn_mask, tuple(k.shape)), dual=dual) if return_info else None
    grad_mode = torch.is_grad_enabled() and (k.requires_grad or tau.requires_grad)
    L_prev: Tensor | None = None
    W: Tensor | None = None  # W_{t-1} = Y_{t-1} / mu; None = 0
    L = k
    for t in range(n_iter):
        if sparse:  # dual is False here
            Z = k if L_prev is None else k - L_prev
            C = _Clamp.apply(Z, tau) if grad_mode else _clamp(Z, tau)
            X = C if L_prev is None else C + L_prev
        else:
            X = k if W is None else k - W
        L = attend(X, t == n_iter - 1)
        if trace is not None:
            trace.record(L, L_prev, W)
        if dual:  # S = 0 here: W_t = W_{t-1} + K - L_t
            W = k - L if W is None else W + (k - L)
        L_prev = L
    if trace is not None:
        return L, trace.info
    return L


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


def _cpu_float(t: Tensor) -> bool:
    """Whether the cutoff softmax applies to ``t``: float32 / float64 on the CPU (GPUs process
    subnormals at full speed; half precisions go through SDPA everywhere)."""
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)


def _uses_cutoff(query: Tensor, key: Tensor, sdpa_mask: Tensor | None) -> bool:
    """The softmax-step dispatch of :func:`pap` (see the comment above :func:`softmax_cutoff`)."""
    if not _cpu_float(key):
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
    return _cutoff(q, k, v, attn_mask, is_causal, dropout_p, cutoff)


def _cutoff(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool, dropout_p: float,
            cutoff: float, scratch: _Scratch | None = None) -> Tensor:
    """:func:`cutoff_attention` without its argument checks, with the block buffers of ``scratch``
    (PAP's softmax steps share one)."""
    hidden, bias = _hidden_and_bias(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.device)
    return _CutoffAttention.apply(q, k, v, hidden, bias, dropout_p, cutoff, scratch)


def _hidden_and_bias(attn_mask: Tensor | None, is_causal: bool, nq: int, n: int,
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


def _cutoff_attention_ops(
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
    hidden, bias = _hidden_and_bias(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.device)
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


def _blocks(bh: int, nq: int, n: int) -> list[tuple[slice, slice]]:
    """(batch-head slice, query slice) pairs covering ``(bh, nq)`` with ~_BLOCK_FLOATS logits each."""
    # With several threads every op is a parallel region ending in a barrier: fewer, larger blocks than at
    # one thread. How much larger depends on how OpenMP's idle threads wait. Spinning (the default), 4x the
    # single-thread block at 2 threads was fastest on a 2-core Xeon (PAP forward 4.6x SDPA, against 5.1x
    # with 16x blocks); with OMP_WAIT_POLICY=PASSIVE each region must wake a sleeping thread, and 16x
    # blocks were fastest (5.9x, against 7.2x with 4x) - docs/benchmarks.md.
    threads = torch.get_num_threads()
    budget = _BLOCK_FLOATS if threads <= 1 else _BLOCK_FLOATS * threads * (8 if _passive_wait() else 2)
    if nq * n <= budget:
        step = budget // (nq * n)
        return [(slice(i, min(i + step, bh)), slice(0, nq)) for i in range(0, bh, step)]
    rows = max(1, budget // n)
    return [(slice(i, i + 1), slice(r, min(r + rows, nq))) for i in range(bh) for r in range(0, nq, rows)]


def _mask_block(mask: Tensor | None, shape: tuple[int, int], bs: slice, qs: slice) -> Tensor | None:
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


class _Scratch:
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


def _block_of(buf: Tensor, nb: int, nq: int, n: int) -> Tensor:
    """The ``(nb, nq, N)`` view at the start of a :class:`_Scratch` buffer."""
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


def _softmax_block(
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
    torch.amax(S, dim=-1, keepdim=True, out=mb)
    if hid is not None:  # a query that sees no key: all P~ = 0, output 0 (as SDPA)
        mb.masked_fill_(mb == float("-inf"), 0.0)
    if s != 1.0:
        mb.mul_(s)  # the logits' row maximum (also for the backward)
    P = _probabilities(S, mb, hid, cutoff, s)
    torch.sum(P, dim=-1, keepdim=True, out=lb)  # >= 1 (the max) without a mask
    if hid is not None:
        lb.masked_fill_(lb == 0, 1.0)
    keep = None
    if dropout_p > 0:
        keep = torch.empty_like(P, dtype=torch.bool).bernoulli_(1.0 - dropout_p)
        P.masked_fill_(~keep, 0.0).div_(1.0 - dropout_p)
    torch.bmm(P, vb, out=ob).div_(lb)
    return keep


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
                dropout_p: float, cutoff: float, scratch: _Scratch | None = None) -> Tensor:
        # scratch: block buffers shared with other calls (PAP's steps) and this call's backward
        b, h, nq, d = q.shape
        n, dv = k.shape[-2], v.shape[-1]
        scale = 1.0 / math.sqrt(d)
        qf, kf, vf = q.reshape(b * h, nq, d), k.reshape(b * h, n, d), v.reshape(b * h, n, dv)
        out = torch.empty(b * h, nq, dv, dtype=q.dtype, device=q.device)
        m = torch.empty(b * h, nq, 1, dtype=q.dtype, device=q.device)
        l_sum = torch.empty_like(m)
        keeps: list[Tensor] = []
        ctx.blocks = blocks = _blocks(b * h, nq, n)  # the same blocks in the backward (and thread count)
        ctx.scratch = scratch = _Scratch() if scratch is None else scratch
        buf = scratch.get(0, blocks, nq, n, q)
        for bs, qs in blocks:
            S = _block_of(buf, bs.stop - bs.start, qs.stop - qs.start, n)
            bias_b = _mask_block(bias, (b, h), bs, qs)
            keep = _softmax_block(qf[bs, qs], kf[bs], vf[bs], S, _mask_block(hidden, (b, h), bs, qs), bias_b,
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
            S = _block_of(buf, bs.stop - bs.start, qs.stop - qs.start, n)
            bias_b = _mask_block(bias, (b, h), bs, qs)
            s = _block_logits(qf[bs, qs], kf[bs], S, bias_b, scale)
            hid = _mask_block(hidden, (b, h), bs, qs)
            P = _probabilities(S, m[bs, qs], hid, ctx.cutoff, s).div_(l_sum[bs, qs])
            gb = gf[bs, qs]
            dP = torch.bmm(gb, vf[bs].transpose(1, 2), out=_block_of(buf_dp, *S.shape))
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


# ----------------------------------------------------------------------------- fused update
#
# Between two softmax steps PAP does only elementwise work. Left to autograd, it is a dozen passes
# over (B, H, N, D) each way, and torch.minimum/maximum's backward (which splits the gradient at
# ties) alone costs more than the attention. The two Functions below do the same arithmetic with
# a hand-written backward in a few passes; tests/test_pap.py checks them with gradcheck.


def _clamp(z: Tensor, tau: Tensor, *, in_place: bool = False, neg_tau: Tensor | None = None) -> Tensor:
    """``clamp(z, -tau, tau)``, into ``z`` itself with ``in_place`` (``neg_tau``: -tau, if at hand).
    Two vectorised passes (min, max); clamp with tensor bounds is one pass but ~2x slower on CPU."""
    c = torch.minimum(z, tau, out=z) if in_place else torch.minimum(z, tau)
    return torch.maximum(c, -tau if neg_tau is None else neg_tau, out=c)


def _update(
    k: Tensor, L: Tensor, R: Tensor, tau: Tensor, spare: Tensor | None = None, *, keep_c: bool = False,
    neg_tau: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """One PAP update ``(K, L_t, R_t) -> (R_{t+1}, X_{t+1})``, overwriting ``R`` and ``spare``.

    With W_t = R_t - L_t:  C = clamp(K - L_t + W_t, tau),  R_{t+1} = C + L_t,
    X_{t+1} = C + L_t - 2 W_t = R_{t+1} + 2 (L_t - R_t). With ``keep_c`` also returns C (a fresh
    tensor, for the backward) and leaves ``R`` alone.
    """
    if keep_c:
        C, X_next, R_next = (torch.empty_like(L) for _ in range(3))
        _update_into(k, L, R, tau, neg_tau, C, X_next, R_next)
        return R_next, X_next, C
    C = torch.empty_like(L) if spare is None else spare
    _update_into(k, L, R, tau, neg_tau, C, R, C)  # X_{t+1} over R_t, R_{t+1} over C
    return C, R


def _update_into(k: Tensor, L: Tensor, R: Tensor, tau: Tensor, neg_tau: Tensor | None, C: Tensor, X: Tensor,
                 R_next: Tensor) -> None:
    """:func:`_update` into given buffers: C_t into ``C``, X_{t+1} into ``X``, R_{t+1} into ``R_next``.
    ``X`` or ``R_next`` may be ``R``, and ``R_next`` may be ``C``: every pass reads an element before it
    writes it, and R_t is not read after E_t. ``neg_tau`` is -tau, if at hand."""
    E = torch.sub(L, R, out=X)  # E_t = L_t - R_t = -W_t
    torch.sub(k, E, out=C).sub_(L)  # K - L_t + W_t
    _clamp(C, tau, in_place=True, neg_tau=neg_tau)
    torch.add(C, L, out=R_next)
    torch.add(R_next, E, alpha=2.0, out=E)


def _clamp_backward(g: Tensor, C: Tensor, tau: Tensor, need_tau: bool, out: Tensor | None = None,
                    tmp: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Gradients of ``C = clamp(Z, -tau, tau)`` w.r.t. Z and tau, given dL/dC = g (not modified);
    dZ is written into ``out`` and ``tmp`` holds a temporary, when given (else fresh tensors).

    Inside (|C| < tau) the gradient passes to Z; outside C = sign(Z) tau, so dC/dtau = C / tau.
    """
    g_z = torch.abs(C, out=out).lt_(tau).mul_(g)  # the 1.0 / 0.0 mask of "inside", times g
    g_tau = None
    if need_tau:
        g_tau = torch.sub(g, g_z, out=tmp).mul_(C).sum_to_size(tau.shape).div_(tau)
    return g_z, g_tau


def _update_backward(g_c: Tensor, g_x: Tensor | None, g_z: Tensor, g_L: Tensor | None = None,
                     g_R: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The update's backward after its clamp's: with Z = K - 2 L_t + R_t, C = clamp(Z), R' = C + L_t,
    X' = C + 3 L_t - 2 R_t, dC = dR' + dX' and dZ from :func:`_clamp_backward`, returns
    ``dL_t = dC + 2 dX' - 2 dZ`` (into ``g_L``, which may be ``g_c``) and ``dR_t = dZ - 2 dX'`` (into
    ``g_R``, which may be ``g_c`` or ``g_x``); fresh tensors where no buffer is given; ``g_x`` None is 0."""
    if g_x is None:
        return torch.add(g_c, g_z, alpha=-2.0, out=g_L), (g_z if g_R is None else g_R.copy_(g_z))
    g_L = torch.add(g_c, g_x, alpha=2.0, out=g_L).sub_(g_z, alpha=2.0)
    return g_L, torch.add(g_z, g_x, alpha=-2.0, out=g_R)


class _Clamp(torch.autograd.Function):
    """``clamp(z, -tau, tau)`` with a cheap backward (the first PAP step, X_1 = clamp(K))."""

    @staticmethod
    def forward(ctx, z: Tensor, tau: Tensor) -> Tensor:
        C = _clamp(z, tau)
        ctx.save_for_backward(C, tau)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor | None]:
        C, tau = ctx.saved_tensors
        return _clamp_backward(g, C, tau, ctx.needs_input_grad[1])


class _Update(torch.autograd.Function):
    """:func:`_update` with autograd: ``(K, L_t, R_t, tau) -> (R_{t+1}, X_{t+1})``.

    Backward, with Z = K - 2 L_t + R_t, C = clamp(Z), R' = C + L_t, X' = C + 3 L_t - 2 R_t:
    dC = dR' + dX';  dZ, dtau from the clamp;  dK = dZ;  dR_t = dZ - 2 dX';  dL_t = dR' + 3 dX' - 2 dZ.
    """

    @staticmethod
    def forward(ctx, k: Tensor, L: Tensor, R: Tensor, tau: Tensor) -> tuple[Tensor, Tensor]:
        R_next, X_next, C = _update(k, L, R, tau, keep_c=True)
        ctx.save_for_backward(C, tau)
        return R_next, X_next

    @staticmethod
    @once_differentiable
    def backward(ctx, g_r: Tensor | None, g_x: Tensor | None) -> tuple[Tensor | None, ...]:
        C, tau = ctx.saved_tensors
        if g_r is None and g_x is None:
            return None, None, None, None
        both = g_r is not None and g_x is not None
        g_c = g_r + g_x if both else (g_r if g_x is None else g_x)
        g_z, g_tau = _clamp_backward(g_c, C, tau, ctx.needs_input_grad[3])
        g_k = g_z if ctx.needs_input_grad[0] else None
        g_L, g_R = _update_backward(g_c, g_x, g_z, g_L=g_c if both else None)  # dC's buffer when ours
        return g_k, g_L, g_R, g_tau


class _Trace:
    """Per-iteration diagnostics of PAP (computed under no_grad, only when asked for).

    Keys of ``info`` (lists with one float per iteration, averaged over batch and heads;
    ``*_per_head`` lists hold ``(H,)`` tensors averaged over the batch):
    ``s_density`` fraction of non-zero entries of S; ``tau`` mean threshold; ``k_abs_max`` mean
    over (batch, head) of max |K|; ``primal_residual`` ||K - L - S||_F / ||K||_F; ``dual_norm``
    ||Y||_F / ||K||_F; ``l_change`` ||L_t - L_{t-1}||_F / ||L_t||_F (NaN at t = 1).
    """

    KEYS = ("s_density", "tau", "k_abs_max", "primal_residual", "dual_norm", "l_change")

    def __init__(
        self, k: Tensor, mu: Tensor, tau: Tensor, valid: Tensor | None, *, dual: bool = True
    ) -> None:
        self.dual = dual  # False: Y is never updated (ablation), so its norm is 0
        # statistics in at least float32: squares and counts overflow / round in half precision
        self.dtype = torch.promote_types(k.dtype, torch.float32)
        with torch.no_grad():
            self.k = k.detach().to(self.dtype)
            self.mu = mu.detach().to(self.dtype)
            self.tau = tau.detach().to(self.dtype)
            # Row weights: padded tokens take no part in the statistics either.
            self.row_w = None if valid is None else valid.to(self.dtype).unsqueeze(-1)
            self.k_norm = self._fro(self.k).clamp_min(torch.finfo(self.dtype).tiny)
            self.k_abs_max = self._masked(self.k.abs()).amax(dim=(-2, -1))
        self.info: dict[str, list] = {}
        for key in self.KEYS:
            self.info[key] = []
            self.info[key + "_per_head"] = []

    def _masked(self, x: Tensor) -> Tensor:
        return x if self.row_w is None else x * self.row_w

    def _fro(self, x: Tensor) -> Tensor:
        return self._masked(x).pow(2).sum(dim=(-2, -1)).sqrt()  # (B, H)

    def _add(self, key: str, per_bh: Tensor) -> None:
        per_head = per_bh.detach().cpu().double().mean(0)
        self.info[key].append(float(per_head.mean()))
        self.info[key + "_per_head"].append(per_head)

    @torch.no_grad()
    def record(self, L: Tensor, L_prev: Tensor | None, W_prev: Tensor | None) -> None:
        """One step: L_t, L_{t-1} and W_{t-1} = Y_{t-1} / mu (both None at t = 1)."""
        L = L.detach().to(self.dtype)
        L_prev = None if L_prev is None else L_prev.detach().to(self.dtype)
        W0 = torch.zeros_like(self.k) if W_prev is None else W_prev.detach().to(self.dtype)
        # S_t from its definition, not as K - X_t - W_{t-1}: that difference is zero only up to
        # rounding and would count every rounding error as a non-zero entry of S.
        Z = self.k if L_prev is None else self.k - L_prev + W0  # K - L_{t-1} + W_{t-1}
        S = Z - torch.maximum(torch.minimum(Z, self.tau), -self.tau)
        nonzero = self._masked((S != 0).to(self.dtype)).sum(dim=(-2, -1))
        n_rows = self.k.shape[-2] if self.row_w is None else self.row_w.sum(dim=(-2, -1))
        self._add("s_density", nonzero / (n_rows * self.k.shape[-1]))
        tau_rows = self.tau.expand(*self.k.shape[:3], 1)
        self._add("tau", self._masked(tau_rows).sum(dim=(-2, -1)) / n_rows)
        self._add("k_abs_max", self.k_abs_max)
        residual = self.k - L - S  # = W_t - W_{t-1}
        self._add("primal_residual", self._fro(residual) / self.k_norm)
        if self.dual:
            self._add("dual_norm", self._fro(self.mu * (W0 + residual)) / self.k_norm)
        else:
            self._add("dual_norm", torch.zeros(self.k.shape[:2], dtype=self.dtype))
        if L_prev is None:
            self._add("l_change", torch.full(self.k.shape[:2], float("nan")))
        else:
            self._add("l_change", self._fro(L - L_prev) / self._fro(L).clamp_min(1e-30))


#: the per-iteration quantities of ``pap(..., return_info=True)`` (see :class:`_Trace`)
TRACE_KEYS: tuple[str, ...] = _Trace.KEYS
