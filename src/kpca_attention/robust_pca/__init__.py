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

Modules: :mod:`.operators` (``shrink``, ``svt``, input conversion and checks), :mod:`.partial_svd`
(the solver's singular-value thresholding, full or by block subspace iteration), :mod:`.solver`
(``robust_pca``: the one loop of both methods, which differ only in their start and mu schedule).
"""

from .operators import shrink, svt
from .solver import METHODS, SVD_METHODS, RobustPCAResult, robust_pca

__all__ = ["robust_pca", "RobustPCAResult", "svt", "shrink", "METHODS", "SVD_METHODS"]
