"""Feature-space Gram matrix of the keys, its eigenvectors, and the value vectors Theorem 1 predicts.

Notation (paper Sec. 2, one head): keys ``k_1..k_N`` in R^D, kernel ``k(x, y) = exp(x.y / sqrt(D))``,
``g(x) = sum_j k(x, k_j)``, feature kernel ``k_phi(x, y) = k(x, y) / (g(x) g(y))``.
``K_phi[i, j] = k_phi(k_i, k_j)``, centred ``Kc = H K_phi H`` with ``H = I - 11^T / N``.
Kernel PCA solves ``Kc a_d = N lambda_d a_d``; this module returns the eigenvalues ``mu_d = N lambda_d``
of ``Kc`` itself (what the critique reports), so ``lambda_d = mu_d / N``.

Everything is computed in float64 and in log space: ``log K_phi[i, j] = s_ij - log g_i - log g_j``
with ``s = K K^T / sqrt(D)`` and ``log g_i = logsumexp_j s_ij``. Because ``g_i >= exp(s_ij)`` for every
j and ``g_j >= exp(s_jj) >= 1``, ``log K_phi <= 0``: the Gram matrix never overflows for finite keys
(the critique's float32 ``exp(K K^T)`` overflows to inf/NaN for keys of moderate norm). Even the
scores ``s`` themselves overflow float64 for keys of norm above ~1e154, so they are kept as
``s = c^2 t`` with ``c`` a power of two >= max |k| per key set and ``|t| <= 1`` (exact: scaling by a
power of two does not round); the exponent ``c^2 (t_ij - m_i - m_j)`` (``m_i = max_l t_il``) is
formed as ``((t_ij - m_i - m_j) c) c`` and is never positive, so it can reach ``-inf`` (entry 0) but
never ``inf`` or NaN. ``log g`` itself can be ``inf`` for such keys (it is a number above float64's
range); ``1 / g`` is then 0.

Shapes: ``keys`` is ``(..., N, D)``; every leading dimension is a batch dimension (batch, head, ...).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "log_g",
    "feature_gram",
    "center_gram",
    "KPCAEigen",
    "kpca_eigen",
    "signal_columns",
    "predicted_values",
    "ORDERS",
    "SCALES",
    "CENTERINGS",
    "METHODS",
    "require_finite",
]

Order = Literal["abs", "signed"]
Scale = Literal["unit", "kpca"]
Centering = Literal["GHA", "HGA"]
Method = Literal["auto", "dense", "lowrank"]
ORDERS: tuple[str, ...] = ("abs", "signed")
SCALES: tuple[str, ...] = ("unit", "kpca")
CENTERINGS: tuple[str, ...] = ("GHA", "HGA")
METHODS: tuple[str, ...] = ("auto", "dense", "lowrank")

#: sequences longer than this use the randomized top-k eigensolver under ``method="auto"`` (measured on 2
#: cores: dense 0.5 / 2.2 s at N = 1024 / 2048, randomized top-64 3.8 / 3.5 / 7.7 s at 1024 / 2048 / 4096)
DENSE_MAX_TOKENS = 2048


def _check(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")


def require_finite(name: str, x: Tensor) -> None:
    """Raise ``ValueError`` naming ``name`` if ``x`` holds inf or NaN: every diagnostic of this package
    checks its inputs, so a NaN is never silently averaged into a result."""
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(
            f"{name} contain inf or NaN ({bad} of {x.numel()} entries); all entries must be finite"
        )


def _as_keys(keys: Tensor) -> Tensor:
    if not isinstance(keys, Tensor) or keys.dim() < 2:
        got = getattr(keys, "shape", type(keys))
        raise ValueError(f"keys must be a tensor of shape (..., N, D), got {got}")
    if keys.shape[-2] < 1 or keys.shape[-1] < 1:
        raise ValueError(f"keys must have N >= 1 tokens and D >= 1 features, got {tuple(keys.shape)}")
    require_finite("keys", keys)
    return keys.to(torch.float64)


def _scaled_scores(keys: Tensor) -> tuple[Tensor, Tensor]:
    """Scores ``s = K K^T / sqrt(D)`` as ``(t, c)`` with ``s = c^2 t``: ``c`` ``(..., 1, 1)`` the
    smallest power of two >= max |k| of each key set (1 for all-zero keys), ``t`` ``(..., N, N)``
    with ``|t| <= 1``. Dividing by a power of two is exact, so ``(t c) c`` is bitwise ``s``
    wherever ``s`` is finite."""
    amax = keys.abs().amax((-2, -1), keepdim=True)
    c = torch.ldexp(torch.ones_like(amax), torch.frexp(amax).exponent)
    kk = keys / c
    return kk @ kk.mT / math.sqrt(keys.shape[-1]), c


def _log_g_parts(t: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """``log g_i = c^2 m_i + r_i``: returns ``m = max_j t_ij`` and ``r = log sum_j exp(c^2 (t_ij - m_i))``
    in ``[0, log N]``, both ``(..., N)``."""
    m = t.amax(-1, keepdim=True)
    r = torch.log(torch.exp(((t - m) * c) * c).sum(-1))  # the max term is exp(0) = 1: no underflow to 0
    return m.squeeze(-1), r


def log_g(keys: Tensor) -> Tensor:
    """``log g(k_i) = logsumexp_j k_i.k_j / sqrt(D)``: ``(..., N, D)`` -> ``(..., N)`` float64
    (``inf`` only where the value exceeds float64's range, for keys of norm above ~1e154)."""
    t, c = _scaled_scores(_as_keys(keys))
    m, r = _log_g_parts(t, c)
    c = c.squeeze(-1)
    return (m * c) * c + r


def center_gram(gram: Tensor) -> Tensor:
    """``H K H`` (= K - 1_N K - K 1_N + 1_N K 1_N, paper Remark 1) for ``(..., N, N)``."""
    return (
        gram - gram.mean(-1, keepdim=True) - gram.mean(-2, keepdim=True) + gram.mean((-2, -1), keepdim=True)
    )


def _gram_and_log_g(keys: Tensor, centered: bool) -> tuple[Tensor, Tensor]:
    t, c = _scaled_scores(keys)
    m, r = _log_g_parts(t, c)
    # log K_phi = c^2 (t_ij - m_i - m_j) - r_i - r_j; t_ij <= m_i and m_j >= t_jj >= 0 hold exactly in
    # floating point, so the bracket is <= 0 and the product is in [-inf, 0]: no overflow, no NaN
    expo = ((t - m.unsqueeze(-1) - m.unsqueeze(-2)) * c) * c
    gram = torch.exp(expo - r.unsqueeze(-1) - r.unsqueeze(-2))
    c = c.squeeze(-1)
    lg = (m * c) * c + r
    return (center_gram(gram) if centered else gram), lg


def feature_gram(keys: Tensor, centered: bool = True) -> Tensor:
    """The feature-space Gram matrix ``K_phi`` (centred: ``Kc = H K_phi H``) of the keys.

    Args:
        keys: ``(..., N, D)``; any float dtype (computed in float64).
        centered: return ``H K_phi H`` (default) or ``K_phi``.

    Returns:
        ``(..., N, N)`` float64, symmetric (positive semi-definite up to rounding).
    """
    return _gram_and_log_g(_as_keys(keys), centered)[0]


@dataclass
class KPCAEigen:
    """Top eigenpairs of the centred feature Gram matrix of a batch of key sets.

    Attributes:
        eigenvalues: ``(..., k)`` eigenvalues ``mu_d`` of ``Kc`` (``= N lambda_d``), in the chosen order.
        eigenvectors: ``(..., N, k)`` unit-norm eigenvectors (columns), same order.
        log_g: ``(..., N)`` ``log g(k_j)``.
        gram: ``(..., N, N)`` the centred Gram matrix ``Kc`` (kept: the gamma test needs it).
    """

    eigenvalues: Tensor
    eigenvectors: Tensor
    log_g: Tensor
    gram: Tensor

    @property
    def num_tokens(self) -> int:
        return self.gram.shape[-1]


def _dense_eigh(mat: Tensor, workers: int | None = None) -> tuple[Tensor, Tensor]:
    """Batched symmetric eigendecomposition, ascending.

    On CPU: NumPy's batched ``eigh`` (LAPACK ``syevd``) is about 2x faster than ``torch.linalg.eigh`` for
    the many small float64 matrices of this analysis (1.1 vs 2.3 ms per 128 x 128 matrix, 2 idle
    cores). Multi-threaded BLAS inside one small ``syevd`` gains nothing and, on a busy machine, loses
    10-20x to spinning threads (measured 44.6 vs 3.7 ms); so BLAS runs single-threaded and the batch
    is split over ``workers`` (default ``torch.get_num_threads()``) Python threads instead (NumPy
    releases the GIL).
    On an accelerator, torch's batched solver is used.
    """
    if mat.device.type != "cpu":
        return torch.linalg.eigh(mat)
    from threadpoolctl import threadpool_limits

    arr = mat.numpy().reshape(-1, *mat.shape[-2:])
    workers = max(1, min(workers or torch.get_num_threads(), arr.shape[0] // 8))
    with threadpool_limits(1):
        if workers == 1:
            w, v = np.linalg.eigh(arr)
        else:
            with ThreadPoolExecutor(workers) as ex:
                parts = list(ex.map(np.linalg.eigh, np.array_split(arr, workers)))
            w, v = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    return torch.from_numpy(w).reshape(mat.shape[:-1]), torch.from_numpy(v).reshape(mat.shape)


def _lowrank_eigh(
    mat: Tensor, k: int, *, oversample: int = 16, niter: int = 10, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Top-``k`` (by |eigenvalue|) eigenpairs of symmetric ``(..., N, N)`` by randomized subspace
    iteration with Rayleigh-Ritz (Halko, Martinsson & Tropp 2011, Alg. 4.4 + 5.3).

    Written here rather than calling ``torch.svd_lowrank`` because that takes no generator (results
    would depend on the global RNG) and returns singular values, losing the eigenvalue signs.
    The returned pairs are unsorted; the caller sorts them.
    """
    n = mat.shape[-1]
    q = min(n, k + oversample)
    gen = torch.Generator(device=mat.device).manual_seed(seed)
    basis = torch.randn(*mat.shape[:-1], q, generator=gen, dtype=mat.dtype, device=mat.device)
    basis = torch.linalg.qr(mat @ basis).Q
    for _ in range(niter):  # each step multiplies the gap ratio |mu_{q+1} / mu_k|
        basis = torch.linalg.qr(mat @ basis).Q
    small = basis.mT @ mat @ basis  # (..., q, q) Rayleigh-Ritz
    w, u = torch.linalg.eigh((small + small.mT) / 2)
    return w, basis @ u


def _select(w: Tensor, v: Tensor, k: int, order: str) -> tuple[Tensor, Tensor]:
    key = w.abs() if order == "abs" else w
    idx = torch.argsort(key, dim=-1, descending=True)[..., :k]
    vec_idx = idx.unsqueeze(-2).expand(*v.shape[:-1], idx.shape[-1])
    return torch.gather(w, -1, idx), torch.gather(v, -1, vec_idx)


def kpca_eigen(
    keys: Tensor,
    k: int | None = None,
    order: Order = "abs",
    method: Method = "auto",
    *,
    niter: int = 10,
    oversample: int = 16,
    seed: int = 0,
    workers: int | None = None,
) -> KPCAEigen:
    """Top-``k`` eigenpairs of the centred feature Gram matrix ``Kc`` of each key set.

    Args:
        keys: ``(..., N, D)``.
        k: number of eigenpairs (default D, the head width = d_v); capped at N.
        order: ``"abs"`` - largest |eigenvalue| first (the critique's vision code); ``"signed"`` -
            largest eigenvalue first (its text code). ``Kc`` is PSD, so the two differ only through
            rounding-level negative eigenvalues.
        method: ``"dense"`` (LAPACK, all eigenpairs), ``"lowrank"`` (randomized subspace iteration,
            top-k only, for long sequences), ``"auto"`` (dense up to ``DENSE_MAX_TOKENS`` = 2048 tokens).
        niter, oversample, seed: randomized solver settings.
        workers: CPU threads splitting a dense batch (default ``torch.get_num_threads()``).

    Returns:
        :class:`KPCAEigen` with eigenvalues ``(..., k)``, unit eigenvectors ``(..., N, k)``.
    """
    _check("order", order, ORDERS)
    _check("method", method, METHODS)
    keys = _as_keys(keys)
    n, d = keys.shape[-2:]
    k = min(d if k is None else k, n)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    gram, lg = _gram_and_log_g(keys, centered=True)
    if method == "auto":
        method = "dense" if n <= DENSE_MAX_TOKENS else "lowrank"
    if method == "dense" or k + oversample >= n:
        w, v = _dense_eigh(gram, workers)
    else:
        w, v = _lowrank_eigh(gram, k, oversample=oversample, niter=niter, seed=seed)
    w, v = _select(w, v, k, order)
    return KPCAEigen(eigenvalues=w, eigenvectors=v, log_g=lg, gram=gram)


def signal_columns(eigen: KPCAEigen) -> Tensor:
    """``(..., k)`` bool: the eigenpairs of ``eigen`` above the rounding floor of ``Kc``, ``|mu_d| > N eps
    max_d |mu_d|`` (``numpy.linalg.matrix_rank``'s tolerance; the max over the selected pairs is the
    largest |eigenvalue| in both orders, ``Kc`` being PSD). Below it an eigenvalue is rounding noise and its
    eigenvector an arbitrary direction of a numerically null space - as happens for large keys, whose
    ``g`` spans hundreds of orders of magnitude."""
    mu = eigen.eigenvalues.abs()
    floor = eigen.num_tokens * torch.finfo(mu.dtype).eps * mu.amax(-1, keepdim=True)
    return mu > floor


def predicted_values(
    keys: Tensor,
    d_v: int | None = None,
    order: Order = "abs",
    scale: Scale = "unit",
    centering: Centering = "GHA",
    *,
    method: Method = "auto",
    eigen: KPCAEigen | None = None,
) -> Tensor:
    """Value vectors predicted by Theorem 1 from the keys alone: ``V_hat[:, d] = G H a_d``.

    Args:
        keys: ``(..., N, D)``.
        d_v: number of value columns (default D, the head width); if ``d_v > N`` only N
            eigenvectors exist (paper Remark 2) and the remaining columns are zero.
        order: eigenvector order, see :func:`kpca_eigen` (critique default ``"abs"``).
        scale: ``"unit"`` - unit-norm eigenvectors ``a_d`` (the critique's code); ``"kpca"`` -
            ``||a_d|| = 1 / sqrt(N lambda_d) = 1 / sqrt(mu_d)`` so the principal axis u_d has unit
            norm (paper Sec. 2); columns with ``mu_d <= 0`` are set to zero. In both scales, columns
            whose eigenvalue is at the rounding floor (:func:`signal_columns`) are zero: their
            eigenvectors are noise, not a prediction.
        centering: ``"GHA"`` - ``v_dj = (a_dj - mean(a_d)) / g(k_j)``, i.e. ``G (I - 1_N) A``: Theorem 1
            as derived in eq. (8) and the critique's ``G A - G 1_N A``; ``"HGA"`` - ``(I - 1_N) G A``,
            centring ``a_dj / g(k_j)`` over tokens (the other reading of the formula, listed in the
            project notes as the paper's). For eigenvectors with nonzero eigenvalue ``H a_d = a_d``
            (``Kc 1 = 0``), so GHA equals ``G A`` and HGA differs from it by a per-column constant.
        method: eigensolver, see :func:`kpca_eigen`.
        eigen: precomputed :func:`kpca_eigen` result for these keys (its ``k`` must be >= d_v or N).

    Returns:
        ``(..., N, d_v)`` float64.
    """
    _check("scale", scale, SCALES)
    _check("centering", centering, CENTERINGS)
    keys = _as_keys(keys)
    n, d = keys.shape[-2:]
    d_v = d if d_v is None else d_v
    if d_v < 1:
        raise ValueError(f"d_v must be >= 1, got {d_v}")
    k = min(d_v, n)
    if eigen is None:
        eigen = kpca_eigen(keys, k, order=order, method=method)
    elif eigen.eigenvectors.shape[-1] < k:
        raise ValueError(f"precomputed eigen has {eigen.eigenvectors.shape[-1]} eigenvectors, need {k}")
    a = eigen.eigenvectors[..., :k] * signal_columns(eigen)[..., :k].unsqueeze(-2)
    if scale == "kpca":
        mu = eigen.eigenvalues[..., :k]
        positive = mu > 0
        a = a * torch.where(positive, mu.clamp_min(torch.finfo(mu.dtype).tiny).rsqrt(), 0.0).unsqueeze(-2)
    inv_g = torch.exp(-eigen.log_g).unsqueeze(-1)  # (..., N, 1); underflows to 0, never overflows
    if centering == "GHA":
        v_hat = inv_g * (a - a.mean(-2, keepdim=True))
    else:
        ga = inv_g * a
        v_hat = ga - ga.mean(-2, keepdim=True)
    if d_v > k:
        v_hat = torch.cat([v_hat, v_hat.new_zeros(*v_hat.shape[:-1], d_v - k)], dim=-1)
    return v_hat
