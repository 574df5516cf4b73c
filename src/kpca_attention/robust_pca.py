"""Robust PCA by Principal Component Pursuit (the paper's Algorithm 2; Candes, Li, Ma, Wright 2011).

Given ``M`` of shape ``(n1, n2)`` (or a batch ``(..., n1, n2)`` of independent problems), find a
low-rank ``L`` and a sparse ``S`` with ``M = L + S`` by solving::

    minimize ||L||_* + lam ||S||_1   subject to   L + S = M

Two augmented-Lagrangian solvers, both iterating (``tau_L = 1 / mu``, ``tau_S = lam / mu``)::

    L_{k+1} = svt(M - S_k + Y_k / mu_k, 1 / mu_k)          singular-value thresholding
    S_{k+1} = shrink(M - L_{k+1} + Y_k / mu_k, lam / mu_k) soft thresholding
    Y_{k+1} = Y_k + mu_k (M - L_{k+1} - S_{k+1})

* ``method="admm"``: the algorithm of Candes et al. (2011, section 5): ``Y_0 = S_0 = 0`` and a fixed
  ``mu = n1 n2 / (4 ||M||_1)``. This is the paper's Algorithm 2 as written; it needs many
  iterations (each one SVD).
* ``method="ialm"`` (default): the inexact augmented Lagrange multiplier method of Lin, Chen & Ma
  (2010, Algorithm 5 and their reference code): ``Y_0 = M / max(||M||_2, max|M_ij| / lam)``,
  ``mu_0 = 1.25 / ||M||_2``, ``mu_{k+1} = min(rho mu_k, 1e7 mu_0)`` with ``rho = 1.5``. Same
  fixed point, typically ~20 SVDs to a relative residual of 1e-7.

Both stop when ``||M - L - S||_F <= tol ||M||_F`` (Candes: tol = 1e-7) and default to
``lam = 1 / sqrt(max(n1, n2))``.

The dual update is computed as ``Y_{k+1} = mu_k clamp(M - L_{k+1} + Y_k / mu_k, -lam / mu_k, lam / mu_k)``,
which equals the line above (``S_{k+1}`` is that argument minus its clamp) and saves passes.

Singular-value thresholding only needs the singular triplets above the threshold, and along the
iterations their number is small (the rank of L). Like Lin et al. (who used PROPACK), the
default ``svd="auto"`` predicts that number from the previous iteration and computes only those
triplets, here by a warm-started block subspace iteration with Rayleigh-Ritz (the previous right
singular vectors plus oversampling columns; pure torch, so batched and on GPU):

* a step is accepted when the Ritz residuals ``||A v_i - s_i u_i||`` of the kept triplets are below
  ``eta_k s_1``, and the first discarded Ritz value (a lower estimate of the next singular value,
  extrapolated by 10 times its last rise) exceeds the threshold by at most ``eta_k s_1``;
* ``eta_k = max(svd_tol, 0.3 r_{k-1})`` with ``r_{k-1}`` the relative residual of the previous
  iteration: loose SVTs while the iterates are far from the solution, accurate ones near it
  (summable errors, as inexact ALM schemes allow). The result agrees with ``svd="full"`` to about
  ``tol`` (at n = 500: relative difference of L ~3e-8);
* when a Ritz value above the threshold sits in the last columns, the block grows (Lin et al. add
  5% of n; here at least double) and the iteration goes on from the current subspace;
* when the block would exceed ``0.3 min(n1, n2)`` columns, or the iteration would not meet its
  tolerance within ``max_svd_steps`` steps, that SVT is a full ``torch.linalg.svd``; matrices with
  ``min(n1, n2) < 64`` always take the full one.

Both methods start with ``S_0 = 0`` and ``Y_0`` proportional to ``M``, so the first SVT is that of a
multiple of ``M``; its SVD also gives ``||M||_2`` for the ialm start.

Scale: PCP is scale-equivariant. For ``c > 0``, ``(c L, c S)`` solves the problem of ``c M`` with the
same ``lam`` (both the objective and the constraint scale by ``c``), and the iterations above map onto
each other with ``Y -> c Y``, ``mu -> mu / c`` (the thresholds ``1 / mu`` and ``lam / mu`` are in units
of ``M``; the default ``mu``s are ``1 / ||M||``). So each matrix is solved as ``M / c`` with
``c = max |M_ij|`` (exact to compute, never overflows, and puts the entries in [-1, 1], where Frobenius
norms neither underflow nor overflow) and ``L``, ``S`` are multiplied back by ``c``; a given ``mu`` or
``mu_max`` is multiplied by ``c`` for the scaled problem and the reported ``mu`` divided by it. Without
this, float32 input of magnitude 1e-25 had ``||M||_F`` underflow to 0 (and was "solved" by
``L = S = 0``) and magnitude 1e30 had it overflow to inf (NaN residuals).

A problem whose residual becomes NaN or inf (possible only with extreme user-given ``mu``/``lam``) is
stopped at its last finite iterate, reported with ``converged=False``, and a ``RuntimeWarning`` names
it; a result that does not fit the dtype once scaled back raises ``FloatingPointError``.

Batches: every problem in ``(..., n1, n2)`` runs its own iteration (its own lam, mu, mu growth)
and stops at its own tolerance; its iterates are frozen once it has converged and the loop ends
when every problem has converged or ``max_iter`` is reached. ``n_iter``, ``converged`` and
``rank`` then have the batch shape.

NumPy in -> NumPy out, torch in -> torch out (same device and dtype; computation on that device).
Supported dtypes: float32 and float64 (NumPy integer/bool/float16 input is computed in float64).
The solver runs under ``torch.no_grad``: it is not differentiable.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from .checks import check_int
from .pap import shrink as _shrink_tensor

Method = Literal["ialm", "admm"]
SVDMethod = Literal["auto", "full", "partial"]
METHODS: tuple[str, ...] = ("ialm", "admm")
SVD_METHODS: tuple[str, ...] = ("auto", "full", "partial")

# Above this fraction of min(n1, n2) the SVT takes a full SVD: a block step with k columns costs about
# 6 n1 n2 k flops, so a few steps at k = 0.3 n cost as much as one LAPACK SVD (heuristic).
_PARTIAL_MAX_FRACTION = 0.3
# The partial SVD of iteration k is accurate to max(svd_tol, _ETA_FACTOR * residual_{k-1}).
_ETA_FACTOR = 0.3
# Below this min(n1, n2) a full SVD costs less than the bookkeeping of the partial one.
_PARTIAL_MIN_SIZE = 64

__all__ = ["robust_pca", "RobustPCAResult", "svt", "shrink", "METHODS", "SVD_METHODS"]


@dataclass
class RobustPCAResult:
    """Result of :func:`robust_pca`.

    Attributes:
        L: low-rank part, same type, shape, dtype and device as ``M``.
        S: sparse part, same type, shape, dtype and device as ``M``.
        n_iter: iterations (= SVTs) run; ``int`` for one matrix, ``np.ndarray`` of the batch shape.
        converged: whether ``||M - L - S||_F <= tol ||M||_F`` was reached; ``bool`` or array.
        residuals: history of ``||M - L - S||_F / ||M||_F``, shape ``(n_iter,)`` for one matrix,
            ``(max n_iter, *batch)`` for a batch (a converged problem repeats its last value).
        rank: rank of ``L`` (the number of singular values kept by the last SVT); int or array.
        lam: the sparsity weight used; float or array of the batch shape.
        mu: the last penalty used (fixed for ``admm``); float or array of the batch shape.
        method: ``"ialm"`` or ``"admm"``.
        info: counters of the SVD work: ``full_svds`` (iterations that took a full SVD),
            ``partial_svds`` (iterations that took the block iteration) and ``subspace_steps``
            (block-iteration steps in all).
    """

    L: Any
    S: Any
    n_iter: Any
    converged: Any
    residuals: np.ndarray
    rank: Any
    lam: Any
    mu: Any
    method: str
    info: dict[str, int] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# Operators
# ----------------------------------------------------------------------------------------------


def _to_tensor(x: Any, name: str) -> tuple[Tensor, bool]:
    """Tensor view of ``x`` and whether it came from NumPy (or an array-like)."""
    if isinstance(x, Tensor):
        if x.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name}: dtype {x.dtype} is not supported; use float32 or float64")
        return x, False
    arr = np.asarray(x)
    if np.iscomplexobj(arr):
        raise ValueError(f"{name}: complex input is not supported; use a real float32/float64 array")
    if arr.dtype not in (np.float32, np.float64):
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise ValueError(f"{name}: dtype {arr.dtype} is not numeric")
        arr = arr.astype(np.float64)
    return torch.from_numpy(np.ascontiguousarray(arr)), True


def _check_matrix(M: Tensor, name: str) -> None:
    if M.dim() < 2:
        raise ValueError(f"{name} must be a matrix or a batch of matrices (..., n1, n2); got shape "
                         f"{tuple(M.shape)}")
    if M.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(M.shape)}); every dimension must be >= 1")
    if not bool(torch.isfinite(M).all()):
        n_nan = int(torch.isnan(M).sum())
        n_inf = int(torch.isinf(M).sum())
        raise ValueError(f"{name} contains non-finite values ({n_nan} NaN, {n_inf} Inf)")


def _check_tau(tau: Any, name: str = "tau") -> Tensor | float:
    if isinstance(tau, Tensor):
        if not bool(torch.isfinite(tau).all()) or bool((tau < 0).any()):
            raise ValueError(f"{name} must be finite and >= 0")
        return tau
    tau_f = float(tau)
    if not math.isfinite(tau_f) or tau_f < 0:
        raise ValueError(f"{name} must be finite and >= 0; got {tau!r}")
    return tau_f


def shrink(x: Any, tau: Any) -> Any:
    """Soft thresholding ``sign(x) * max(|x| - tau, 0)``: the proximal map of ``tau * ||.||_1``.

    The torch computation is :func:`kpca_attention.pap.shrink`; this wrapper also takes NumPy
    arrays (NumPy in -> NumPy out) and checks ``tau``.

    Args:
        x: array or tensor of any shape.
        tau: float >= 0, or an array/tensor >= 0 broadcastable to ``x``.
    """
    xt, from_numpy = _to_tensor(x, "x")
    if not isinstance(tau, (int, float)):
        tau = torch.as_tensor(tau, dtype=xt.dtype, device=xt.device)
    out = _shrink_tensor(xt, _check_tau(tau))
    return out.numpy() if from_numpy else out


def svt(M: Any, tau: Any) -> Any:
    """Singular-value thresholding ``U diag(max(s - tau, 0)) V^T`` (exact, full SVD).

    The proximal map of ``tau * ||.||_*`` (nuclear norm): ``argmin_X tau ||X||_* + ||X - M||_F^2 / 2``.

    Args:
        M: ``(..., n1, n2)`` array or tensor (NumPy in -> NumPy out).
        tau: float >= 0, or one value per matrix (array/tensor of the batch shape ``...``).
    """
    Mt, from_numpy = _to_tensor(M, "M")
    _check_matrix(Mt, "M")
    if not isinstance(tau, (int, float)):
        tau = torch.as_tensor(tau, dtype=Mt.dtype, device=Mt.device)
        if tau.dim() > 0:
            tau = tau[..., None]  # one threshold per matrix, broadcast over its singular values
    tau = _check_tau(tau)
    with torch.no_grad():
        U, s, Vh = torch.linalg.svd(Mt, full_matrices=False)
        out = (U * torch.clamp(s - tau, min=0).unsqueeze(-2)) @ Vh
    return out.numpy() if from_numpy else out


# ----------------------------------------------------------------------------------------------
# Singular-value thresholding inside the solver: full or partial (block subspace iteration)
# ----------------------------------------------------------------------------------------------


class _SVT:
    """SVT of a ``(B, n1, n2)`` batch with one threshold per matrix, keeping warm-start state.

    ``__call__(A, tau, need, eta, factors=None)`` takes ``A`` ``(B, n1, n2)``, thresholds ``tau``
    ``(B, 1, 1)``, ``need`` ``(B,)`` (the matrices whose result is used; the others are frozen
    problems, whose convergence is not waited for), ``eta`` ``(B,)`` (the relative accuracy of a
    partial SVD) and optionally ``factors``, an SVD of ``A`` already known. It returns ``(L, svp)``:
    the thresholded matrices ``(B, n1, n2)`` and the number of singular values kept ``(B,)``.
    """

    def __init__(self, shape: tuple[int, int, int], mode: str, max_steps: int,
                 oversample: int, generator: torch.Generator) -> None:
        _, n1, n2 = shape
        self.nmin = min(n1, n2)
        self.mode = mode
        self.max_steps = max_steps
        self.oversample = oversample
        self.gen = generator
        self.V: Tensor | None = None  # (B, n2, k) right singular vectors of the last SVT
        self.k = min(self.nmin, 10)  # Lin et al. start from 10 predicted singular values
        self.small_failed = False  # a block of half the cap was too small since counts exceed it
        self.full_svds = 0
        self.partial_svds = 0
        self.steps = 0

    def _use_partial(self, k: int) -> bool:
        if self.mode == "full":
            return False
        if self.mode == "partial":
            return k < self.nmin
        return self.nmin >= _PARTIAL_MIN_SIZE and k <= _PARTIAL_MAX_FRACTION * self.nmin

    def _full(self, A: Tensor, tau: Tensor, factors: tuple[Tensor, Tensor, Tensor] | None = None
              ) -> tuple[Tensor, Tensor]:
        self.full_svds += 1
        U, s, Vh = torch.linalg.svd(A, full_matrices=False) if factors is None else factors
        svp = (s > tau[:, :, 0]).sum(-1)
        r = max(int(svp.max()), 1)
        self.V = Vh[:, :r].mT
        L = (U[:, :, :r] * torch.clamp(s[:, :r] - tau[:, :, 0], min=0).unsqueeze(-2)) @ Vh[:, :r]
        return L, svp

    def _start_block(self, A: Tensor, k: int) -> tuple[Tensor, bool]:
        """``(B, n2, k)`` start block: the last right singular vectors, completed with Gaussian
        columns; and whether it is orthonormal (no random columns)."""
        B, _, n2 = A.shape
        V = self.V
        if V is not None and V.shape[-1] >= k:
            return V[..., :k], True
        fresh = torch.randn(B, n2, k - (0 if V is None else V.shape[-1]), dtype=A.dtype,
                            device=A.device, generator=self.gen)
        return (fresh if V is None else torch.cat([V, fresh], dim=-1)), False

    def __call__(self, A: Tensor, tau: Tensor, need: Tensor, eta: Tensor,
                 factors: tuple[Tensor, Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if factors is not None:  # the SVD of A is known already
            L, svp = self._full(A, tau, factors)
            self.k = min(self.nmin, int(svp[need].max()) + 1 + self.oversample)
            return L, svp
        k = min(self.nmin, self.k)
        cap = int(_PARTIAL_MAX_FRACTION * self.nmin)
        tried_small = False
        if self.mode == "auto" and k > cap and not self.small_failed:
            # The prediction from the last count is too large for a block; that count is often
            # transient (the first SVTs of ialm, before S has taken the outliers), so try half the
            # cap: if more are above the threshold the block doubles past the cap and a full SVD
            # follows, and no such try is made again while the counts stay above the cap (the
            # early iterates of admm have nearly full rank).
            k = cap // 2
            tried_small = True
        while self._use_partial(k):
            out = self._partial(A, tau, need, k, eta)
            if out is None:  # the block iteration would not converge: take the exact route
                break
            if isinstance(out, int):  # the block is too small: go on with a wider one
                k = min(self.nmin, out)
                continue
            L, svp = out
            self.partial_svds += 1
            self.k = min(self.nmin, int(svp[need].max()) + 1 + self.oversample)
            return L, svp
        L, svp = self._full(A, tau)
        self.k = min(self.nmin, int(svp[need].max()) + 1 + self.oversample)
        self.small_failed = tried_small or (self.small_failed and self.k > cap)
        return L, svp

    def _partial(self, A: Tensor, tau: Tensor, need: Tensor, k: int, eta: Tensor
                 ) -> tuple[Tensor, Tensor] | int | None:
        """Block subspace iteration with Rayleigh-Ritz on ``k`` columns.

        Returns ``(L, svp)`` when converged, the number of columns to go on with when the block
        is too small, None when it would not converge within ``max_steps``.
        """
        V, orthonormal = self._start_block(A, k)
        tau_v = tau[:, :, 0]  # (B, 1)
        idx = torch.arange(k, device=A.device)
        U = s = s_prev = None
        worst_prev = math.inf
        for step in range(self.max_steps + 1):
            W = A @ V  # (B, n1, k)
            self.steps += 1
            if U is not None and s is not None:
                svp = (s > tau_v).sum(-1)  # (B,)
                most = int(torch.where(need, svp, 0).max())
                if most >= k:
                    # A Ritz value is a lower bound of its singular value, so when the k-th one is
                    # already above tau there are more than k singular values to keep: at least
                    # double the block (Lin et al. add 5% of n).
                    self.V = V
                    return k + max(self.oversample, round(0.05 * self.nmin), k)
                if most + 1 + self.oversample // 2 > k:
                    # Too few columns beyond the kept ones: the iteration would crawl at the rate
                    # s_{k+1} / s_svp. Widen the block to the usual oversampling.
                    self.V = V
                    return most + 1 + self.oversample
                # Ritz triplets (u_i, s_i, v_i) of the last step satisfy A^T u_i = s_i v_i exactly,
                # so ||A v_i - s_i u_i|| is their whole residual; the kept ones must be accurate.
                res = torch.linalg.vector_norm(W - U * s.unsqueeze(-2), dim=-2)  # (B, k)
                kept = (idx.unsqueeze(0) < svp.unsqueeze(-1)) & need.unsqueeze(-1)
                ratio = torch.where(kept, res / (eta[:, None] * s[:, :1]), 0.0).amax(-1)  # (B,)
                # The count: the first discarded Ritz value is a lower estimate of s_{svp+1} that
                # rises with the steps (geometrically); its limit is estimated as the value plus 10
                # times its last rise. Discarding a singular value s > tau errs by s - tau in L, so
                # that excess must fit the same budget eta * s_1 as the residuals.
                j = svp.clamp(max=k - 1).unsqueeze(-1)
                first_out = s.gather(-1, j).squeeze(-1)
                rise = torch.clamp(first_out - s_prev.gather(-1, j).squeeze(-1), min=0)
                excess = torch.clamp(first_out + 10 * rise - tau_v[:, 0], min=0)
                settle = excess / (eta * s[:, 0])
                worst = float(torch.where(need, torch.maximum(ratio, settle), 0.0).max())
                if worst <= 1:
                    r = max(int(svp.max()), 1)
                    self.V = V
                    L = (U[:, :, :r] * torch.clamp(s[:, :r] - tau_v, min=0).unsqueeze(-2)) \
                        @ V[:, :, :r].mT
                    return L, svp
                # Linear convergence: give up early when the rate cannot reach 1 in the steps left.
                left = self.max_steps - step
                if step >= 3 and worst > 1 and (worst >= worst_prev
                                                 or worst * (worst / worst_prev) ** left > 1):
                    return None
                worst_prev = worst
            if step == self.max_steps:
                return None
            # Rayleigh-Ritz: SVD of Q^T A (k x n2) through the QR of its transpose, so that only a
            # k x k SVD is taken (a wide LAPACK SVD costs several times more).
            Q, R = torch.linalg.qr(W)  # (B, n1, k) orthonormal basis of the range of A V
            Q2, R2 = torch.linalg.qr(A.mT @ Q)  # A^T Q = Q2 R2, so Q^T A = R2^T Q2^T
            Ur, s_new, Vrh = torch.linalg.svd(R2.mT)
            if s is None:
                # The singular values of A V = Q R for an orthonormal V (the warm start) are lower
                # bounds of A's as well: the first "previous" Ritz values, one step for free.
                s_prev = torch.linalg.svdvals(R) if orthonormal else torch.zeros_like(s_new)
            else:
                s_prev = s
            s = s_new
            U = Q @ Ur
            V = Q2 @ Vrh.mT
        return None


# ----------------------------------------------------------------------------------------------
# The solver
# ----------------------------------------------------------------------------------------------


def _positive(value: Any, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive finite number; got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a positive finite number; got {value!r}")
    return v


def robust_pca(
    M: Any,
    lam: float | None = None,
    mu: float | None = None,
    tol: float = 1e-7,
    max_iter: int = 1000,
    *,
    method: Method = "ialm",
    rho: float = 1.5,
    mu_max: float | None = None,
    svd: SVDMethod = "auto",
    svd_tol: float | None = None,
    max_svd_steps: int = 20,
    seed: int = 0,
    progress: bool = False,
) -> RobustPCAResult:
    """Principal Component Pursuit: ``M = L + S`` with ``L`` low-rank and ``S`` sparse.

    Args:
        M: ``(n1, n2)`` or ``(..., n1, n2)`` NumPy array or torch tensor (CPU or GPU), finite.
        lam: weight of ``||S||_1``; default ``1 / sqrt(max(n1, n2))`` (Candes et al.).
        mu: penalty. ``admm``: the fixed mu, default ``n1 n2 / (4 ||M||_1)`` (Candes et al.);
            ``ialm``: the initial mu, default ``1.25 / ||M||_2`` (Lin et al.). Per matrix.
        tol: stop when ``||M - L - S||_F <= tol ||M||_F``. float32 reaches 1e-7 on the Candes
            problems (n = 500: relative error of L 1.7e-6, as in float64) but sits close to its
            rounding floor there; if a float32 run ends with ``converged=False``, use ``tol=1e-6``.
        max_iter: most iterations (one SVT each).
        method: ``"ialm"`` (inexact ALM of Lin, Chen & Ma 2010; default, fast) or ``"admm"``
            (fixed-mu ADMM of Candes et al. 2011, the paper's Algorithm 2).
        rho: ``ialm`` only: growth factor of mu (> 1); Lin et al.'s code uses 1.5.
        mu_max: ``ialm`` only: cap on mu; default ``1e7 * mu_0``.
        svd: ``"auto"`` (partial SVD when the predicted rank is below 0.3 min(n1, n2), else full),
            ``"full"`` (always ``torch.linalg.svd``: every SVT exact) or ``"partial"`` (block
            iteration whenever the predicted rank is below min(n1, n2)). See the module docstring.
        svd_tol: floor of the partial SVD's relative accuracy ``eta_k``; default
            ``max(tol / 100, 100 eps)`` of the dtype.
        max_svd_steps: steps of the block iteration before that SVT falls back to a full SVD.
        seed: seed of the random start block of the partial SVD (results are reproducible).
        progress: show a tqdm progress bar with the residual.

    Returns:
        :class:`RobustPCAResult` with ``L``, ``S`` (NumPy in -> NumPy out, torch in -> torch out,
        same shape, dtype and device), ``n_iter``, ``converged``, ``residuals``, ``rank``, ``lam``,
        ``mu``, ``method`` and SVD counters in ``info``.

    Raises:
        ValueError: ``M`` not a (batch of) matrix, empty, non-finite or of an unsupported dtype;
            ``lam``, ``mu``, ``tol``, ``rho``, ``mu_max``, ``svd_tol`` not positive finite;
            ``max_iter``, ``max_svd_steps`` not integers >= 1, ``seed`` not an integer >= 0; unknown
            ``method`` or ``svd``.
        FloatingPointError: ``L`` or ``S`` does not fit the dtype at the scale of ``M`` (entries near
            the dtype's largest value).

    Warns:
        RuntimeWarning: a problem's residual became NaN or inf; it is reported with
            ``converged=False`` and its last finite iterate.

    Example:
        >>> res = robust_pca(M)                       # M = L0 + S0, (n1, n2) float64
        >>> res.L, res.S, res.n_iter, res.converged   # doctest: +SKIP
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if svd not in SVD_METHODS:
        raise ValueError(f"svd must be one of {SVD_METHODS}; got {svd!r}")
    tol = _positive(tol, "tol")
    lam_v = None if lam is None else _positive(lam, "lam")
    mu_v = None if mu is None else _positive(mu, "mu")
    mu_max_v = None if mu_max is None else _positive(mu_max, "mu_max")
    rho = _positive(rho, "rho")
    if method == "ialm" and rho <= 1:
        raise ValueError(f"rho must be > 1 (mu grows geometrically); got {rho}")
    check_int(max_iter, "max_iter", min=1)
    check_int(max_svd_steps, "max_svd_steps", min=1)
    check_int(seed, "seed", min=0)

    Mt, from_numpy = _to_tensor(M, "M")
    _check_matrix(Mt, "M")
    batch_shape = tuple(Mt.shape[:-2])
    n1, n2 = Mt.shape[-2:]
    eps = torch.finfo(Mt.dtype).eps
    svd_tol_v = max(tol / 100, 100 * eps) if svd_tol is None else _positive(svd_tol, "svd_tol")

    with torch.no_grad():
        L, S, stats = _solve(Mt.reshape(-1, n1, n2), lam_v, mu_v, tol, int(max_iter), method, rho,
                             mu_max_v, svd, svd_tol_v, int(max_svd_steps), seed, progress)
    L = L.reshape(Mt.shape)
    S = S.reshape(Mt.shape)
    if from_numpy:
        L, S = L.numpy(), S.numpy()

    def shaped(a: np.ndarray, scalar: type) -> Any:
        return scalar(a.reshape(-1)[0]) if not batch_shape else a.reshape(batch_shape)

    residuals = stats["residuals"]
    residuals = residuals[:, 0] if not batch_shape else residuals.reshape(-1, *batch_shape)
    return RobustPCAResult(
        L=L,
        S=S,
        n_iter=shaped(stats["n_iter"], int),
        converged=shaped(stats["converged"], bool),
        residuals=residuals,
        rank=shaped(stats["rank"], int),
        lam=shaped(stats["lam"], float),
        mu=shaped(stats["mu"], float),
        method=method,
        info=stats["info"],
    )


def _solve(M: Tensor, lam: float | None, mu: float | None, tol: float, max_iter: int, method: str,
           rho: float, mu_max: float | None, svd: str, svd_tol: float, max_svd_steps: int, seed: int,
           progress: bool) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """The iteration on a ``(B, n1, n2)`` batch; see :func:`robust_pca`."""
    B, n1, n2 = M.shape
    dtype, device = M.dtype, M.device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    # Solve M / c with c = max |M_ij| per matrix and scale back (PCP is scale-equivariant, see the
    # module docstring): the norms below then neither underflow nor overflow.
    scale = M.abs().amax(dim=(-2, -1))  # (B,)
    active = scale > 0  # an all-zero matrix is solved by L = S = 0 before any iteration
    scale = torch.where(active, scale, torch.ones_like(scale))
    M = M / scale[:, None, None]
    # A given mu (units 1 / M) becomes mu * c for M / c.
    mu_given = None if mu is None else torch.full((B,), mu, dtype=dtype, device=device) * scale
    cap_given = None if mu_max is None else torch.full((B,), mu_max, dtype=dtype, device=device) * scale

    norm_fro = torch.linalg.matrix_norm(M)  # (B,)
    safe = torch.where(active, norm_fro, torch.ones_like(norm_fro))

    # Both methods start from S_0 = 0 and a Y_0 proportional to M (0 for admm), so the first SVT
    # is that of a multiple of M: one SVD of M serves it and gives ||M||_2 for the ialm start.
    U_M, s_M, Vh_M = torch.linalg.svd(M, full_matrices=False)
    lam_t = torch.full((B,), lam if lam is not None else 1 / math.sqrt(max(n1, n2)), dtype=dtype,
                       device=device)
    if method == "admm":
        if mu_given is not None:
            mu_t = mu_given
        else:
            l1 = M.abs().sum(dim=(-2, -1))
            mu_t = n1 * n2 / (4 * torch.where(active, l1, torch.ones_like(l1)))
        Y = torch.zeros_like(M)
        mu_cap = mu_t
        first_scale = torch.ones_like(mu_t)
    else:
        norm2 = torch.where(active, s_M[:, 0], torch.ones_like(norm_fro))
        mu_t = 1.25 / norm2 if mu_given is None else mu_given
        mu_cap = mu_t * 1e7 if cap_given is None else cap_given
        # Y_0 = M / J(M): a dual-feasible start (Lin et al., eq. 10), J = max(||M||_2, ||M||_inf / lam)
        inf_norm = M.abs().amax(dim=(-2, -1))
        J = torch.maximum(norm2, inf_norm / lam_t)
        J = torch.where(active, J, torch.ones_like(J))
        Y = M / J[:, None, None]
        first_scale = 1 + 1 / (mu_t * J)

    L = torch.zeros_like(M)
    S = torch.zeros_like(M)
    svt_op = _SVT((B, n1, n2), svd, max_svd_steps, oversample=max(5, min(n1, n2) // 50),
                  generator=gen)
    n_iter = torch.zeros(B, dtype=torch.long)
    converged = ~active.cpu()
    rank = torch.zeros(B, dtype=torch.long)
    last_res = torch.ones(B, dtype=torch.float64)
    failed = torch.zeros(B, dtype=torch.bool)
    history: list[Tensor] = []
    mu_used = mu_t

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=max_iter, desc=f"robust_pca ({method})", unit="it")
    for it in range(max_iter):
        act_cpu = active.cpu()
        if not bool(act_cpu.any()):
            break
        mu_b = mu_t[:, None, None]
        inv_mu = 1 / mu_b
        # Inexact steps early, exact ones at the end: the SVT accuracy follows the residual.
        eta = torch.clamp(torch.nan_to_num(_ETA_FACTOR * last_res, nan=1.0), min=svd_tol).to(device, dtype)
        Z = torch.addcmul(M, Y, inv_mu)  # M + Y / mu
        factors = None
        if it == 0:  # A = M + Y_0 / mu_0 = c M
            factors = (U_M, s_M * first_scale[:, None], Vh_M)
        L_new, svp = svt_op(Z - S, inv_mu, active, eta, factors)
        T = Z.sub_(L_new)  # M - L + Y / mu
        S_new = _shrink_tensor(T, lam_t[:, None, None] * inv_mu)
        # With C = T - S = clamp(T, -lam / mu, lam / mu) the residual is M - L - S = C - Y / mu and
        # the dual update Y + mu (M - L - S) is just mu C: Y stays in [-lam, lam] entrywise.
        C = T.sub_(S_new)
        res = torch.linalg.matrix_norm(torch.addcmul(C, Y, inv_mu, value=-1)) / safe
        Y_new = C.mul_(mu_b)
        res_cpu = res.to("cpu", torch.float64)
        # A NaN/inf residual (only reachable with extreme given mu or lam) ends that problem at its
        # last finite iterate, not converged; NaN <= tol is False, so it is never counted as converged.
        broken = act_cpu & ~torch.isfinite(res_cpu)
        if bool(broken.any()):
            failed |= broken
            act_cpu = act_cpu & ~broken
            active = active & ~broken.to(device)
        if bool(act_cpu.all()):
            L, S, Y = L_new, S_new, Y_new
        else:  # freeze the problems that have converged (or failed)
            a = active[:, None, None]
            L = torch.where(a, L_new, L)
            S = torch.where(a, S_new, S)
            Y = torch.where(a, Y_new, Y)
        svp_cpu = svp.cpu()
        n_iter += (act_cpu | broken).long()
        last_res = torch.where(act_cpu | broken, res_cpu, last_res)
        rank = torch.where(act_cpu, svp_cpu, rank)
        history.append(last_res.clone())
        mu_used = torch.where(active, mu_t, mu_used)  # report the mu of each one's last iteration
        done = act_cpu & (res_cpu <= tol)
        converged |= done
        active = active & ~done.to(device)
        if method == "ialm":
            mu_t = torch.where(active, torch.minimum(mu_t * rho, mu_cap), mu_t)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(residual=f"{float(last_res.max()):.2e}")
    if bar is not None:
        bar.close()
    if bool(failed.any()):
        which = torch.nonzero(failed).flatten().tolist()
        where = "" if B == 1 else f" (problems {which[:10]}{' ...' if len(which) > 10 else ''} of the " \
            "flattened batch)"
        warnings.warn(f"robust_pca: the residual became NaN or inf{where}; those problems stopped at "
                      "their last finite iterate and are reported with converged=False. Check mu and lam "
                      "(the defaults do not do this).", RuntimeWarning, stacklevel=3)

    # Back to the scale of M; the reported mu is in units of 1 / M.
    L = L * scale[:, None, None]
    S = S * scale[:, None, None]
    mu_used = mu_used / scale
    if not (bool(torch.isfinite(L).all()) and bool(torch.isfinite(S).all())):
        raise FloatingPointError(
            f"robust_pca: L or S does not fit {dtype} at the scale of M (max |M_ij| = "
            f"{float(scale.max()):.3g}, the dtype's largest value is {torch.finfo(dtype).max:.3g}); "
            "use float64 or solve M / c and multiply L and S by c")

    residuals = torch.stack(history).numpy() if history else np.zeros((0, B))
    stats = {
        "n_iter": n_iter.numpy(),
        "converged": converged.numpy(),
        "rank": rank.numpy(),
        "lam": lam_t.cpu().numpy(),
        "mu": mu_used.cpu().numpy(),
        "residuals": residuals,
        "info": {"full_svds": svt_op.full_svds, "partial_svds": svt_op.partial_svds,
                 "subspace_steps": svt_op.steps},
    }
    return L, S, stats
