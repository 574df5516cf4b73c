"""PAP's other two loops behind :func:`~kpca_attention.pap.pap`'s dispatcher: the ablations
(``sparse=False`` / ``dual=False``) and the plain-ops loop ``torch.compile`` traces."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .inputs import cpu_float
from .softmax import cutoff_attention_ops
from .trace import Observer
from .updates import ClampTau, clamp_tau

__all__: list[str] = []


def pap_compiled(
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
    :func:`cutoff_attention_ops` (the cutoff of :func:`cutoff_attention` in plain ops, so that no
    subnormal arises in the compiled forward or backward either).
    """
    attention = cutoff_attention_ops if cpu_float(k) else F.scaled_dot_product_attention
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



def pap_ablated(
    k: Tensor, tau: Tensor, mu: Tensor, attend: Callable[[Tensor, bool], Tensor], n_iter: int,
    sparse: bool, dual: bool, attn_mask: Tensor | None, obs: Observer | None,
) -> Tensor:
    """PAP with S forced to zero (``sparse=False``) and/or without the dual update (``dual=False``).

    S = 0 (dual kept), with W = Y / mu:  X_t = K - W_{t-1},  W_t = W_{t-1} + K - L_t.
    Y = 0 (shrinkage kept):  X_t = K - shrink(K - L_{t-1}, tau) = L_{t-1} + clamp(K - L_{t-1}, tau).
    Both off: X_t = K at every step (symmetric attention). Plain autograd is used except for the
    clamp, whose hand-written backward (:class:`ClampTau`) is cheaper than autograd's.
    """
    if not sparse:
        tau = torch.full_like(tau, float("inf"))  # S = shrink(., inf) = 0; reported as such in the trace
    if obs is not None:
        tau = obs.start(k, mu, tau, attn_mask, dual)
    grad_mode = torch.is_grad_enabled() and (k.requires_grad or tau.requires_grad)
    L_prev: Tensor | None = None
    W: Tensor | None = None  # W_{t-1} = Y_{t-1} / mu; None = 0
    L = k
    for t in range(n_iter):
        if sparse:  # dual is False here
            Z = k if L_prev is None else k - L_prev
            C = ClampTau.apply(Z, tau) if grad_mode else clamp_tau(Z, tau)
            X = C if L_prev is None else C + L_prev
        else:
            X = k if W is None else k - W
        L = attend(X, t == n_iter - 1)
        if obs is not None:
            L = obs.output(t, L)
        if dual:  # S = 0 here: W_t = W_{t-1} + K - L_t
            W = k - L if W is None else W + (k - L)
        if obs is not None and obs.wants_dual:
            obs.dual_state(t, L, W, k)
        L_prev = L
    return L

