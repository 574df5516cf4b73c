"""The robust PCA solver (:func:`robust_pca`): one loop for both methods (``ialm``, ``admm``); see the
package docstring for the algorithm."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from ..checks import check_int
from .operators import check_matrix, shrink_tensor, to_tensor
from .partial_svd import ETA_FACTOR, SVT

__all__ = ["robust_pca", "RobustPCAResult", "METHODS", "SVD_METHODS"]

Method = Literal["ialm", "admm"]
SVDMethod = Literal["auto", "full", "partial"]
METHODS: tuple[str, ...] = ("ialm", "admm")
SVD_METHODS: tuple[str, ...] = ("auto", "full", "partial")


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

    Mt, from_numpy = to_tensor(M, "M")
    check_matrix(Mt, "M")
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
    svt_op = SVT((B, n1, n2), svd, max_svd_steps, oversample=max(5, min(n1, n2) // 50),
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
        eta = torch.clamp(torch.nan_to_num(ETA_FACTOR * last_res, nan=1.0), min=svd_tol).to(device, dtype)
        Z = torch.addcmul(M, Y, inv_mu)  # M + Y / mu
        factors = None
        if it == 0:  # A = M + Y_0 / mu_0 = c M
            factors = (U_M, s_M * first_scale[:, None], Vh_M)
        L_new, svp = svt_op(Z - S, inv_mu, active, eta, factors)
        T = Z.sub_(L_new)  # M - L + Y / mu
        S_new = shrink_tensor(T, lam_t[:, None, None] * inv_mu)
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

