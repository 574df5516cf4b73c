"""Singular-value thresholding inside the robust PCA solver: full or partial (block subspace iteration)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__: list[str] = []

# Above this fraction of min(n1, n2) the SVT takes a full SVD: a block step with k columns costs about
# 6 n1 n2 k flops, so a few steps at k = 0.3 n cost as much as one LAPACK SVD (heuristic).
_PARTIAL_MAX_FRACTION = 0.3
# The partial SVD of iteration k is accurate to max(svd_tol, ETA_FACTOR * residual_{k-1}).
ETA_FACTOR = 0.3
# Below this min(n1, n2) a full SVD costs less than the bookkeeping of the partial one.
_PARTIAL_MIN_SIZE = 64


class SVT:
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


