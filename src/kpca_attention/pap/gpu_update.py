"""PAP's update between two softmax steps, fused on a GPU: one generated kernel each way.

On the CPU the update is one pass of the compiled C++ kernel (:mod:`.kernels`). On a GPU the eager ops
take five passes forward (:func:`~.updates.update_into`) and about eight backward
(:meth:`~.updates.UpdateStep.backward`), each a kernel launch over ``(B, H, N, D)``; measured on an H200
(docs/benchmarks.md), eager RPC-SymViT-tiny trained at 0.895 of SymViT-tiny's speed and the same models
under ``torch.compile`` - which fuses these passes - at 0.949. Here the same arithmetic, in the same order
of operations, is handed to ``torch.compile`` (inductor writes one Triton kernel for each direction) and
used by :class:`~.updates.UpdateStep` on CUDA tensors, so an eager model gets the fused update without
compiling the model. Hand-written CUDA would do no better for an elementwise map: the passes are memory
bound and inductor's kernel reads each input and writes each output once.

``KPCA_ATTENTION_GPU_FUSED=0`` turns it off (the eager ops run); where compiling fails (no Triton, say) it
turns itself off with one warning and the eager ops run. Both give the same numbers to rounding
(tests/test_pap_gpu_update.py, on the CPU through :data:`DEVICE_TYPES`; benchmarks/gpu_check.py on a GPU).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch import Tensor

from .inputs import tracing

__all__ = ["DEVICE_TYPES", "applies", "forward", "backward"]

#: the device types the fused update is used on (the tests add "cpu", where it is otherwise never used:
#: the C++ kernel is faster there and compiles nothing)
DEVICE_TYPES: tuple[str, ...] = ("cuda",)
_ENABLED = os.environ.get("KPCA_ATTENTION_GPU_FUSED", "1").strip() != "0"
_compiled: dict[str, Any] = {}
_proven: set[str] = set()  # compiled and run once: from then on an error is an error, not a missing compiler


def _forward(k: Tensor, L: Tensor, R: Tensor, tau: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    # update_into's operations in its order: E = L - R, C = clamp(K - E - L), R' = C + L, X' = R' + 2 E
    E = L - R
    C = torch.maximum(torch.minimum(k - E - L, tau), -tau).to(L.dtype)  # eager writes C in L's dtype
    R_next = C + L
    return R_next, R_next + 2.0 * E, C


def _backward(g_r: Tensor, g_x: Tensor, C: Tensor, tau: Tensor, need_tau: bool
              ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    # UpdateStep.backward's: dC = dR' + dX'; dZ = dC inside the clamp; dK = dZ; dL = dC + 2 dX' - 2 dZ;
    # dR = dZ - 2 dX'; dtau = sum over tau's broadcast of (dC - dZ) C / tau
    g_c = g_r + g_x
    g_z = torch.where(C.abs() < tau, g_c, torch.zeros_like(g_c))
    g_L = g_c + 2.0 * g_x - 2.0 * g_z
    g_R = g_z - 2.0 * g_x
    g_tau = ((g_c - g_z) * C).sum_to_size(tau.shape) / tau if need_tau else None
    return g_z, g_L, g_R, g_tau


def applies(k: Tensor) -> bool:
    """Whether the fused update runs for these keys: on :data:`DEVICE_TYPES`, enabled, outside tracing."""
    return _ENABLED and k.device.type in DEVICE_TYPES and not tracing()


def _call(name: str, fn: Any, *args: Any) -> Any:
    global _ENABLED
    if name not in _compiled:
        _compiled[name] = torch.compile(fn, dynamic=True, fullgraph=True)
    if name in _proven:
        return _compiled[name](*args)
    try:
        out = _compiled[name](*args)
    except Exception as exc:  # the first compilation: a machine without a working compiler
        _ENABLED = False
        warnings.warn(f"PAP's fused GPU update could not be compiled ({type(exc).__name__}: {exc}); "
                      "the eager update runs instead", RuntimeWarning, stacklevel=3)
        return None
    _proven.add(name)
    return out


def forward(k: Tensor, L: Tensor, R: Tensor, tau: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    """``(R_{t+1}, X_{t+1}, C)`` of one update (:func:`~.updates.update_step` with ``keep_c``), or None
    when the fused kernel could not be compiled (the caller then runs the eager ops)."""
    return _call("forward", _forward, k, L, R, tau)


def backward(g_r: Tensor, g_x: Tensor, C: Tensor, tau: Tensor, need_tau: bool
             ) -> tuple[Tensor, Tensor, Tensor, Tensor | None] | None:
    """``(dK, dL_t, dR_t, dtau)`` of one update given both output gradients, or None (as :func:`forward`)."""
    return _call("backward", _backward, g_r, g_x, C, tau, need_tau)
