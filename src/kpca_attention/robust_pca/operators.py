"""Robust PCA's operators: soft thresholding (``shrink``, also :func:`kpca_attention.pap.shrink`) and
singular-value thresholding (``svt``), NumPy or torch in and out; the input conversion and checks."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["shrink", "svt"]


def shrink_tensor(x: Tensor, tau: Tensor | float) -> Tensor:
    """Soft thresholding of a tensor, unchecked: ``x - clamp(x, -tau, tau)`` (softshrink for a float)."""
    return x - torch.clamp(x, -tau, tau) if isinstance(tau, Tensor) else F.softshrink(x, tau)


def to_tensor(x: Any, name: str) -> tuple[Tensor, bool]:
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


def check_matrix(M: Tensor, name: str) -> None:
    if M.dim() < 2:
        raise ValueError(f"{name} must be a matrix or a batch of matrices (..., n1, n2); got shape "
                         f"{tuple(M.shape)}")
    if M.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(M.shape)}); every dimension must be >= 1")
    if not bool(torch.isfinite(M).all()):
        n_nan = int(torch.isnan(M).sum())
        n_inf = int(torch.isinf(M).sum())
        raise ValueError(f"{name} contains non-finite values ({n_nan} NaN, {n_inf} Inf)")


def check_tau(tau: Any, name: str = "tau") -> Tensor | float:
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

    The one soft thresholding of the project (:func:`kpca_attention.pap.shrink` is this function).
    NumPy in -> NumPy out, torch in -> torch out; ``tau`` is checked.

    Args:
        x: array or tensor of any shape.
        tau: float >= 0, or an array/tensor >= 0 broadcastable to ``x``.
    """
    xt, from_numpy = to_tensor(x, "x")
    if not isinstance(tau, (int, float)):
        tau = torch.as_tensor(tau, dtype=xt.dtype, device=xt.device)
    out = shrink_tensor(xt, check_tau(tau))
    return out.numpy() if from_numpy else out



def svt(M: Any, tau: Any) -> Any:
    """Singular-value thresholding ``U diag(max(s - tau, 0)) V^T`` (exact, full SVD).

    The proximal map of ``tau * ||.||_*`` (nuclear norm): ``argmin_X tau ||X||_* + ||X - M||_F^2 / 2``.

    Args:
        M: ``(..., n1, n2)`` array or tensor (NumPy in -> NumPy out).
        tau: float >= 0, or one value per matrix (array/tensor of the batch shape ``...``).
    """
    Mt, from_numpy = to_tensor(M, "M")
    check_matrix(Mt, "M")
    if not isinstance(tau, (int, float)):
        tau = torch.as_tensor(tau, dtype=Mt.dtype, device=Mt.device)
        if tau.dim() > 0:
            tau = tau[..., None]  # one threshold per matrix, broadcast over its singular values
    tau = check_tau(tau)
    with torch.no_grad():
        U, s, Vh = torch.linalg.svd(Mt, full_matrices=False)
        out = (U * torch.clamp(s - tau, min=0).unsqueeze(-2)) @ Vh
    return out.numpy() if from_numpy else out

