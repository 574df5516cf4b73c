"""Principal Attention Pursuit (PAP), Algorithm 1 of Teo & Nguyen (NeurIPS 2024), batched: the entry
module, with :func:`pap` (one dispatcher choosing the path) and the reference loop :func:`pap_reference_loop`.

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
* Without an autograd graph on the CPU (inference, evaluation), :func:`~.fused.pap_fused` runs instead:
  every step is the cutoff softmax of :func:`~.softmax.cutoff_attention` (blocked, never subnormal) and each
  block's update is done while its rows are in the cache; one output buffer serves every step.
  Same numbers to rounding (tests/test_pap_numerics.py).
* With a graph on the CPU, symmetric, without dropout and with small attention matrices (training
  at ViT sizes), :class:`~.fused.PAPSaved` runs the same loop as one autograd Function that keeps each
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

Hooks: ``hooks`` maps state names (:data:`~.trace.STATES`: ``mu``, ``tau``, ``L.t``, ``W.t`` = Y_t / mu,
``S_density.t`` of shape (B, H), for steps t = 0 ... n_iter - 1) to callables; the RPC layer passes its
active hook points (``hook_mu``, ...; :mod:`kpca_attention.attention.rpc`). With any hook (or
``return_info``) the reference loop (or the ablations' loop) runs, which forms these states; without,
the fast paths do and nothing extra is computed.

Module map: :mod:`.inputs` (checks, masks, predicates; imports nothing of the package), :mod:`.softmax`
(the cutoff softmax and its autograd Function), :mod:`.updates` (the update between two steps, with
hand-written backwards), :mod:`.fused` (the fused CPU paths), :mod:`.variants` (ablations, the compiled
loop), :mod:`.trace` (diagnostics from the states), this module.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from .fused import PAPSaved, pap_fused, saves_probabilities
from .inputs import (
    RPC_OFFICIAL,
    Threshold,
    broadcasts_to,
    check_options,
    checks_values,
    cpu_float,
    merge_masks,
    normalise_mask,
    tracing,
    validate_inputs,
    visible,
)
from .softmax import Scratch, cutoff_step, hidden_and_bias, softmax_cutoff, uses_cutoff
from .trace import Observer
from .updates import ClampTau, UpdateStep, clamp_tau, update_step
from .variants import pap_ablated, pap_compiled

__all__ = ["pap", "pap_mu", "pap_tau"]


def pap_tau(lam: float, mu: Tensor, threshold: str = "lambda_mu") -> Tensor:
    """The shrinkage threshold from ``mu``: ``lam * mu`` (``"lambda_mu"``, the official code) or
    ``lam / mu`` (``"lambda_over_mu"``, the paper's convention)."""
    return lam * mu if threshold == "lambda_mu" else lam / mu


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
    if not isinstance(k, Tensor) or k.dim() != 4:
        raise ValueError(f"pap_mu: k must be a tensor of shape (B, H, N, D), got "
                         f"{tuple(k.shape) if isinstance(k, Tensor) else type(k).__name__}")
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



def pap(
    k: Tensor,
    v: Tensor,
    n_iter: int = RPC_OFFICIAL["n_iter"],
    lam: float = RPC_OFFICIAL["lam"],
    *,
    mu: Tensor | float | None = None,
    mu_dim: int | None = RPC_OFFICIAL["mu_dim"],
    threshold: Threshold = RPC_OFFICIAL["threshold"],
    q: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    sparse: bool = True,
    dual: bool = True,
    return_info: bool = False,
    validate: bool | None = None,
    hooks: Mapping[str, Callable[[Tensor], Tensor]] | None = None,
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
        return_info: also return a dict of per-iteration diagnostics (see :class:`~.trace.PAPTrace`).
        validate: whether the checks that read tensor values (NaN/Inf in k, v, q; NaN in an additive
            mask; a tensor ``mu`` > 0) run: None (default) in eager mode on the CPU only, True in eager
            mode on any device (each check is then a host-device synchronisation), False never. See
            :func:`checks_values`. Shapes, dtypes and options are checked in every eager call.
        hooks: ``{state name: callable}`` to read (or, for ``mu``, ``tau``, ``L.t``, change) PAP's inner
            states (see the module docstring); given, the reference loop runs instead of a fast path.

    Returns:
        ``L`` of shape ``(B, H, N, D)``, or ``(L, info)`` when ``return_info``. An empty input (B, H, N
        or D = 0) gives an empty ``L``, as softmax attention does (``return_info`` is then a ValueError).
    """
    check_options(n_iter=n_iter, lam=lam, threshold=threshold, mu_dim=mu_dim, dropout_p=dropout_p)
    if not (isinstance(sparse, bool) and isinstance(dual, bool)):
        raise ValueError(f"pap: sparse and dual must be bool, got sparse={sparse!r}, dual={dual!r}")
    if validate not in (None, True, False):
        raise ValueError(f"pap: validate must be None, True or False, got {validate!r}")
    if not all(isinstance(t, Tensor) for t in (k, v, *(() if q is None else (q,)))):
        got = ", ".join(type(t).__name__ for t in (k, v, q) if t is not None)
        raise TypeError(f"pap: k, v (and q) must be torch Tensors, got {got} (torch.as_tensor converts "
                        "an array)")
    check = checks_values(validate, k.device)
    validate_inputs(k, v, q, check)
    attn_mask = normalise_mask(attn_mask, k, check)
    if k.numel() == 0:
        return _empty_pap(k, v, q, return_info)
    if mu is None:
        mu_t = pap_mu(k, mu_dim, attn_mask=attn_mask, is_causal=is_causal)
    else:
        if not isinstance(mu, Tensor) and (
            isinstance(mu, bool) or not isinstance(mu, numbers.Real) or not (math.isfinite(mu) and mu > 0)
        ):
            raise ValueError(f"pap: mu must be finite and > 0, got {mu!r}")
        mu_t = torch.as_tensor(mu, dtype=torch.promote_types(k.dtype, torch.float32), device=k.device)
        per_query = (*k.shape[:3], 1)
        if not broadcasts_to(mu_t.shape, per_query):
            raise ValueError(f"pap: mu of shape {tuple(mu_t.shape)} does not broadcast to (B, H, N, 1) = "
                             f"{per_query}")
        if check and (not torch.isfinite(mu_t).all() or (mu_t <= 0).any()):
            raise ValueError("pap: mu must be finite and > 0")
    if hooks:
        states = {"mu", "tau", *(f"{s}.{t}" for s in ("L", "W", "S_density") for t in range(n_iter))}
        unknown = sorted(str(name) for name in hooks if name not in states)
        if unknown:  # a hook that would never run: an intervention silently not made
            raise ValueError(f"pap: hooks {unknown} name no state of {n_iter} iterations; valid: mu, tau, "
                             f"L.t, W.t, S_density.t for t = 0..{n_iter - 1}")
    obs = Observer(hooks, return_info) if hooks or return_info else None
    if obs is not None:
        mu_t = obs.emit("mu", mu_t)
    tau = pap_tau(lam, mu_t, threshold)
    if tau.dtype != k.dtype:  # half precision: mu and tau were computed in float32
        tau = tau.clamp(max=torch.finfo(k.dtype).max).to(k.dtype)
    if tau.dim() < 4:
        tau = tau.reshape(*([1] * (4 - tau.dim())), *tau.shape)
    sdpa_mask, sdpa_causal = merge_masks(attn_mask, is_causal, k.shape[-2], k.device)

    # The dispatcher: one loop, several implementations of it (docs/pap.md, "Which path runs").
    if torch.compiler.is_compiling() and obs is None:
        return pap_compiled(k, v, q, tau, sdpa_mask, sdpa_causal, dropout_p, n_iter, sparse, dual)
    attend = softmax_step(q, v, sdpa_mask, sdpa_causal, dropout_p)
    if not (sparse and dual):
        L = pap_ablated(k, tau, mu_t, attend, n_iter, sparse, dual, attn_mask, obs)
    else:
        grad_mode = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (k, v, q, tau)
        )
        if cpu_float(k) and obs is None and not tracing():
            if not grad_mode:
                return pap_fused(k, v, q, tau, sdpa_mask, sdpa_causal, dropout_p, n_iter)
            if saves_probabilities(k, q, dropout_p, n_iter):
                hidden, bias = hidden_and_bias(sdpa_mask, sdpa_causal, k.shape[-2], k.shape[-2], k.device)
                return PAPSaved.apply(k, v, tau, hidden, bias, n_iter)
        L = pap_reference_loop(k, tau, mu_t, attend, n_iter, grad_mode, attn_mask, obs)
    if return_info:
        assert obs is not None and obs.trace is not None
        return L, obs.trace.info
    return L


def _empty_pap(k: Tensor, v: Tensor, q: Tensor | None, return_info: bool) -> Tensor:
    """No batch element, head, token or channel: the output is empty too (as softmax attention's: the
    official mu = N C / (4 ||K||_1) is 0 / 0 there, but nothing is computed with it), connected to the
    inputs' graph; hooks see nothing. The per-iteration diagnostics are means over nothing: an error."""
    if return_info:
        raise ValueError(f"pap: return_info averages over batch, heads and tokens; the input "
                         f"{tuple(k.shape)} is empty (give at least one of each, and D >= 1)")
    anchor = k.sum() + v.sum() + (q.sum() if q is not None else 0.0)  # 0, in the graph of k, v, q
    return torch.zeros_like(v) + anchor * 0


def softmax_step(
    q: Tensor | None, v: Tensor, sdpa_mask: Tensor | None, sdpa_causal: bool, dropout_p: float
) -> Callable[[Tensor, bool], Tensor]:
    """``attend(X, last)``: one softmax step ``softmax(Q X^T / sqrt(D)) V`` (Q = X when symmetric), with
    dropout on the last step only; the cutoff softmax on the CPU where logits may span more than
    :func:`~.softmax.softmax_cutoff` (see :mod:`.softmax`), else SDPA."""
    scratch = Scratch()  # the cutoff steps' block buffers, shared by all steps of this call

    def attend(x: Tensor, last: bool) -> Tensor:
        query, p = (x if q is None else q), (dropout_p if last else 0.0)
        if uses_cutoff(query, x, sdpa_mask):  # CPU, logits may span > softmax_cutoff: see there
            return cutoff_step(query, x, v, sdpa_mask, sdpa_causal, p, softmax_cutoff(x.dtype), scratch)
        return F.scaled_dot_product_attention(
            query, x, v, attn_mask=sdpa_mask, is_causal=sdpa_causal, dropout_p=p
        )

    return attend


def pap_reference_loop(
    k: Tensor, tau: Tensor, mu: Tensor, attend: Callable[[Tensor, bool], Tensor], n_iter: int,
    grad_mode: bool, attn_mask: Tensor | None, obs: Observer | None,
) -> Tensor:
    """Algorithm 1, step by step (the reference every other path equals to rounding).

    With W = Y / mu and R_t = C_t + L_{t-1} (so that W_t = R_t - L_t; module docstring)::

        X_1 = R_1 = clamp(K, -tau, tau)                  (L_0 = W_0 = 0)
        for t = 1 ... n_iter:
            L_t = softmax(X_t X_t^T / sqrt(D)) V          attend
            C = clamp(K - L_t + W_t, -tau, tau)           the update: S_{t+1} = (K - L_t + W_t) - C
            R_{t+1} = C + L_t,  X_{t+1} = R_{t+1} + 2 (L_t - R_t)

    The update is one autograd Function with a hand-written backward (:mod:`.updates`); without a
    graph it reuses three buffers in place. ``obs`` (hooks, ``return_info``) sees tau, each L_t and W_t.
    """
    if obs is not None:
        tau = obs.start(k, mu, tau, attn_mask, dual=True)
    if grad_mode:
        X = R = ClampTau.apply(k, tau)
    else:
        # Without an autograd graph three buffers are reused in place: at this size the page
        # faults of fresh allocations cost more than the arithmetic.
        X = R = clamp_tau(k, tau)
    for t in range(n_iter):
        last = t == n_iter - 1
        L = attend(X, last)
        if obs is not None:
            L = obs.output(t, L)
            if obs.wants_dual:
                obs.dual_state(t, L, R - L, k)
        if last:
            break
        if grad_mode:
            R, X = UpdateStep.apply(k, L, R, tau)
        else:
            R, X = update_step(k, L, R, tau, spare=X if X is not R else None)
    return L
