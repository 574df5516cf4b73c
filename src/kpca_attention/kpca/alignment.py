"""How close are learned value vectors V to the values V_hat that Theorem 1 predicts?

The measures of the critique (Saritas & Yildiz 2025, ``scripts/value_vectors.py``), batched:

* ``direct_cosine`` - mean over tokens of cos(v_i, v_hat_i); ``negative_pct`` - % of tokens with
  negative cosine; ``pearson`` - the same on row-centred vectors.
* ``optimal_cosine`` - tokens of V matched one-to-one to tokens of V_hat by the Hungarian algorithm
  (``scipy.optimize.linear_sum_assignment`` on -cos), mean matched cosine: an upper bound that forgives
  any permutation of tokens.
* ``linear_cka`` and ``kernel_cka`` (Kornblith et al. 2019), ``relative_frobenius``
  ``||V - V_hat||_F / ||V||_F`` (nearly 1 whenever the scales differ, as they do: V_hat ~ 1/(g sqrt N)).

CKA is invariant to orthogonal transforms and isotropic scaling of either side, hence to the
arbitrary signs of the eigenvectors; the cosines are not (an eigenvector's sign is arbitrary, so
the cosine measures can be lowered by sign flips of the columns of V_hat - ``signfix_cosine`` aligns
each column's sign with V first).

Kernel-CKA bandwidth: Kornblith et al. (``gram_rbf(x, threshold)``) set
``sigma^2 = threshold^2 * median of ALL squared distances`` (diagonal zeros included, ``np.median``);
the critique's ``CudaCKA.rbf`` uses ``sigma^2 = median of the NONZERO squared distances`` computed with
``torch.median`` (lower middle value), per representation. ``bandwidth="kornblith"`` (default) or
``"critique"`` selects one; the difference is small for N >> 1.

Shapes: ``v``, ``v_hat`` ``(..., N, d)`` (CKA also accepts different widths); results ``(...,)``. Leading
dimensions broadcast: ``v`` ``(draws, B, N, d)`` against ``v_hat`` ``(B, N, d)`` computes what depends on
``v_hat`` alone (its Gram matrices, its normalised rows) once, not once per draw - the null baselines of
:mod:`.chance` rely on it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from .gram import center_gram, require_finite

__all__ = [
    "row_cosine",
    "optimal_cosine",
    "linear_cka",
    "kernel_cka",
    "rbf_gram",
    "alignment",
    "BANDWIDTHS",
]

Bandwidth = Literal["kornblith", "critique"]
BANDWIDTHS: tuple[str, ...] = ("kornblith", "critique")


def _pair(x: Tensor, y: Tensor, same_width: bool = True) -> tuple[Tensor, Tensor]:
    """Both inputs in float64 after checking shapes (leading dims broadcast) and finiteness."""
    try:
        ok = x.dim() >= 2 and y.dim() >= 2 and x.shape[-2] == y.shape[-2]
        torch.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    except RuntimeError:
        ok = False
    if not ok or (same_width and x.shape[-1] != y.shape[-1]):
        need = "the same (..., N, d)" if same_width else "the same (..., N)"
        raise ValueError(
            f"inputs must be (..., N, d) with {need} (leading dims broadcast), "
            f"got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    require_finite("the first input (values)", x)
    require_finite("the second input (predicted values)", y)
    return x.to(torch.float64), y.to(torch.float64)


def _unit_rows(x: Tensor, eps: float = 0.0) -> Tensor:
    norm = x.norm(dim=-1, keepdim=True)
    return x / (norm + eps) if eps > 0 else x / norm.clamp_min(torch.finfo(x.dtype).tiny)


def row_cosine(v: Tensor, v_hat: Tensor, eps: float = 0.0) -> Tensor:
    """Cosine of corresponding rows (tokens): ``(..., N, d)`` x2 -> ``(..., N)``.

    ``eps`` is added to the row norms; the critique adds 1e-8, which biases the cosine towards 0
    for rows of V_hat whose norm is not >> 1e-8 (V_hat rows scale as 1 / g(k_j), and g grows
    exponentially with the key norms). Default 0: exact, scale-invariant.
    """
    v, v_hat = _pair(v, v_hat)
    return (_unit_rows(v, eps) * _unit_rows(v_hat, eps)).sum(-1)


def optimal_cosine(
    v: Tensor, v_hat: Tensor, return_matched: bool = False, eps: float = 0.0
) -> Tensor | tuple[Tensor, Tensor]:
    """Mean cosine after the best one-to-one matching of tokens (Hungarian algorithm).

    One ``linear_sum_assignment`` call per matrix (SciPy has no batched solver); the cosine matrices
    are built batched. Returns ``(...,)``, and with ``return_matched`` also the matched cosines
    ``(..., N)`` (in row order of ``v``). ``eps``: see :func:`row_cosine`.
    """
    v, v_hat = _pair(v, v_hat)
    cos = (_unit_rows(v, eps) @ _unit_rows(v_hat, eps).mT).cpu().numpy()
    flat = cos.reshape(-1, *cos.shape[-2:])
    matched = np.empty(flat.shape[:2])
    for b in range(flat.shape[0]):
        rows, cols = linear_sum_assignment(np.nan_to_num(-flat[b], nan=0.0))
        matched[b, rows] = flat[b, rows, cols]
    m = torch.from_numpy(matched.reshape(cos.shape[:-1])).to(v.device)
    return (m.mean(-1), m) if return_matched else m.mean(-1)


def linear_cka(x: Tensor, y: Tensor, eps: float = 0.0) -> Tensor:
    """Linear CKA: ``HSIC(XX^T, YY^T) / sqrt(HSIC(XX^T, XX^T) HSIC(YY^T, YY^T))``, ``HSIC(K, L) =
    sum((HKH) * (HLH))``; computed from features as ``||Xc^T Yc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)``
    (Kornblith et al. 2019, eq. after (3)) with Xc, Yc centred over tokens.

    ``eps`` is added to the denominator, as the critique's linear CKA adds 1e-10. That breaks the
    invariance to scale: for a V_hat of norm ~1e-11 (keys with scores ~50 make ``1 / g`` tiny) the
    numerator and the exact denominator are ~1e-22 |V|^2 and the epsilon turns CKA into ~1e-11.
    Default 0: exact.

    ``x`` ``(..., N, p)``, ``y`` ``(..., N, q)`` -> ``(...,)`` in [0, 1]; NaN if either side is constant
    (and ``eps == 0``).
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    x, y = _pair(x, y, same_width=False)
    xc, yc = x - x.mean(-2, keepdim=True), y - y.mean(-2, keepdim=True)
    num = (xc.mT @ yc).pow(2).sum((-2, -1))
    den = (xc.mT @ xc).norm(dim=(-2, -1)) * (yc.mT @ yc).norm(dim=(-2, -1))
    return num / (den + eps)


def rbf_gram(x: Tensor, threshold: float = 1.0, bandwidth: Bandwidth = "kornblith") -> Tensor:
    """RBF Gram ``exp(-||x_i - x_j||^2 / (2 sigma^2))`` with the median heuristic (see module doc).

    ``(..., N, p)`` -> ``(..., N, N)`` float64.
    """
    if bandwidth not in BANDWIDTHS:
        raise ValueError(f"unknown bandwidth {bandwidth!r}; valid: {', '.join(BANDWIDTHS)}")
    if threshold <= 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    x = x.to(torch.float64)
    dots = x @ x.mT
    sq_norms = dots.diagonal(dim1=-2, dim2=-1)
    sq = (sq_norms.unsqueeze(-1) + sq_norms.unsqueeze(-2) - 2 * dots).clamp_min(0)
    n = sq.shape[-1]
    sq = sq * (1 - torch.eye(n, dtype=sq.dtype, device=sq.device))  # exact zeros on the diagonal
    flat = sq.flatten(-2)
    if bandwidth == "kornblith":
        # = np.median over all N^2 entries (mean of the two middle values); selection, not a sort
        m = flat.shape[-1]
        k = (m - 1) // 2 + 1
        lo = torch.kthvalue(flat, k, dim=-1).values
        if m % 2:
            med = lo
        else:  # the (k+1)-th smallest: lo again if it is tied, else the smallest entry above it
            tied = (flat <= lo.unsqueeze(-1)).sum(-1) > k
            above = flat.masked_fill(flat <= lo.unsqueeze(-1), float("inf")).amin(-1)
            med = (lo + torch.where(tied, lo, above)) / 2
    else:
        med = torch.nanmedian(flat.masked_fill(flat == 0, float("nan")), dim=-1).values
    sigma_sq = (threshold**2) * med
    return torch.exp(-sq / (2 * sigma_sq.unsqueeze(-1).unsqueeze(-1)))


def kernel_cka(x: Tensor, y: Tensor, threshold: float = 1.0, bandwidth: Bandwidth = "kornblith") -> Tensor:
    """RBF-kernel CKA with ``sigma^2 = threshold^2 * median squared distance`` chosen per
    representation (Kornblith et al. 2019; ``bandwidth="critique"``: median of nonzero distances).

    ``x`` ``(..., N, p)``, ``y`` ``(..., N, q)`` -> ``(...,)``.
    """
    x, y = _pair(x, y, same_width=False)
    # HSIC(K, L) = sum((HKH) * (HLH)): centre each Gram matrix once, reuse it for all three HSICs
    kx, ky = center_gram(rbf_gram(x, threshold, bandwidth)), center_gram(rbf_gram(y, threshold, bandwidth))
    hsic = (kx * ky).sum((-2, -1))
    return hsic / (kx.pow(2).sum((-2, -1)) * ky.pow(2).sum((-2, -1))).sqrt()


def alignment(
    v: Tensor,
    v_hat: Tensor,
    *,
    optimal: bool = True,
    threshold: float = 1.0,
    bandwidth: Bandwidth = "kornblith",
    row_eps: float = 0.0,
    cka_eps: float = 0.0,
) -> dict[str, Tensor]:
    """All alignment measures between learned values ``v`` and predicted ``v_hat``.

    Args:
        v, v_hat: ``(..., N, d)``.
        optimal: also run the Hungarian matching (one SciPy call per matrix).
        threshold, bandwidth: kernel-CKA bandwidth, see :func:`kernel_cka`.
        row_eps: added to row norms in the cosines (critique: 1e-8), see :func:`row_cosine`.
        cka_eps: added to the linear-CKA denominator (critique: 1e-10), see :func:`linear_cka`.

    Returns:
        ``direct_cosine``, ``negative_pct``, ``signfix_cosine``, ``pearson``, ``optimal_cosine``
        (if asked), ``linear_cka``, ``kernel_cka``, ``relative_frobenius``; each ``(...,)`` float64.
    """
    v, v_hat = _pair(v, v_hat)
    cos = row_cosine(v, v_hat, row_eps)
    # Columns of V_hat have arbitrary signs (eigenvectors): flip each to agree with V's column.
    signs = torch.where((v * v_hat).sum(-2, keepdim=True) < 0, -1.0, 1.0)
    vc, vhc = v - v.mean(-1, keepdim=True), v_hat - v_hat.mean(-1, keepdim=True)
    out = {
        "direct_cosine": cos.mean(-1),
        "negative_pct": 100.0 * (cos < 0).to(torch.float64).mean(-1),
        "signfix_cosine": row_cosine(v, v_hat * signs, row_eps).mean(-1),
        "pearson": row_cosine(vc, vhc, row_eps).mean(-1),
    }
    if optimal:
        out["optimal_cosine"] = optimal_cosine(v, v_hat, eps=row_eps)
    out["linear_cka"] = linear_cka(v, v_hat, cka_eps)
    out["kernel_cka"] = kernel_cka(v, v_hat, threshold, bandwidth)
    out["relative_frobenius"] = (v - v_hat).norm(dim=(-2, -1)) / v.norm(dim=(-2, -1))
    return out
