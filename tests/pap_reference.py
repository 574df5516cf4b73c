"""A direct transcription of Principal Attention Pursuit (Algorithm 1) as the official code runs it.

Deliberately naive - every matrix of the algorithm is formed (S, X, the N x N softmax matrix, the
dual Y with mu) - so that it can be read against the paper line by line. The tests compare
:func:`kpca_attention.pap.pap` with it in float64; ``benchmarks/bench_pap.py`` times it in float32 to
show what the fused implementation buys.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def shrink_ref(x: Tensor, tau: Tensor | float) -> Tensor:
    """sign(x) * max(|x| - tau, 0)."""
    return torch.sign(x) * torch.clamp(torch.abs(x) - tau, min=0.0)


def pap_reference(
    k: Tensor,
    v: Tensor,
    n_iter: int = 4,
    lam: float = 4.0,
    *,
    mu: Tensor | float | None = None,
    mu_dim: int | None = None,
    threshold: str = "lambda_mu",
    q: Tensor | None = None,
    history: list[dict[str, Tensor]] | None = None,
    sparse: bool = True,
    dual: bool = True,
) -> Tensor:
    """Algorithm 1 on ``(B, H, N, D)`` keys and values, with L0 = Y0 = 0 and n_iter softmax steps.

    mu = N * mu_dim / (4 * ||K_bh||_1) per (batch, head), mu_dim = H * D by default (official code);
    tau = lam * mu (official code) or lam / mu (paper). ``q`` given: softmax(Q X^T / sqrt(D)) V.
    Ablations: ``sparse=False`` sets S = 0 at every step; ``dual=False`` skips the Y update (Y = 0).
    """
    b, h, n, d = k.shape
    if mu is None:
        mu_dim = h * d if mu_dim is None else mu_dim
        mu = n * mu_dim / (4.0 * k.abs().sum(dim=(-2, -1), keepdim=True))
    tau = lam * mu if threshold == "lambda_mu" else lam / mu
    L = torch.zeros_like(k)
    Y = torch.zeros_like(k)
    for _ in range(n_iter):
        S = shrink_ref(k - L + Y / mu, tau) if sparse else torch.zeros_like(k)
        X = k - S - Y / mu
        queries = X if q is None else q
        A = torch.softmax(queries @ X.transpose(-2, -1) / math.sqrt(d), dim=-1)
        L = A @ v
        if dual:
            Y = Y + mu * (k - L - S)
        if history is not None:
            history.append({"S": S, "X": X, "L": L, "Y": Y, "mu": mu})
    return L
