"""PAP's lowest module: input checks, mask helpers and the predicates every other PAP module asks.

Nothing here imports another module of the package: the cutoff softmax (:mod:`.softmax`), the fused
CPU paths (:mod:`.fused`) and the entry module (:mod:`.algorithm`) all import from here, never the
other way round (the softmax step must ask :func:`tracing` / :func:`visible` without a circle
through the entry module).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = [
    "RPC_OFFICIAL", "THRESHOLDS", "Threshold", "check_options", "checks_values", "tracing", "visible",
    "broadcasts_to",
]

Threshold = Literal["lambda_mu", "lambda_over_mu"]
THRESHOLDS: tuple[str, ...] = ("lambda_mu", "lambda_over_mu")

#: the official code's settings (README: 4 iterations in the first layer, lambda 4; its threshold rule and
#: mu over the full width): written here once - :func:`~kpca_attention.pap.pap`'s signature, RPCAttention's,
#: the mechanism registry, the ViTs' ``rpc_*`` defaults and the LM's config read them
RPC_OFFICIAL: MappingProxyType[str, Any] = MappingProxyType(
    dict(n_iter=4, lam=4.0, threshold="lambda_mu", mu_dim=None))


def tracing() -> bool:
    """True while code is traced or compiled: FX symbolic tracing, ``torch.jit`` tracing or scripting,
    ``torch.compile`` and ``torch.export``. Then nothing may branch in Python on a tensor's values:
    it would be a TraceError (FX), a constant baked into the trace (``jit.trace``) or a graph break."""
    return bool(
        torch.jit.is_scripting() or torch.jit.is_tracing() or torch.compiler.is_compiling()
        # torch has no public name for this flag (torch.fx._symbolic_trace is where FX keeps it)
        or torch.fx._symbolic_trace.is_fx_symbolic_tracing()
    )


def checks_values(validate: bool | None, device: torch.device) -> bool:
    """Whether input checks that read tensor values (NaN/Inf, a NaN mask, mu > 0) run.

    ``validate=None`` (the default of :func:`pap`): in eager mode on the CPU, where such a check is one
    pass over the data; not on an accelerator, where every check is a host-device synchronisation in
    every forward of every layer, and not while tracing or compiling (see :func:`tracing`).
    ``True``: in eager mode on every device (a debug mode). ``False``: never. Checks of shapes, dtypes
    and options need no values and always run in eager mode.
    """
    if validate is False or tracing():
        return False
    return validate is True or device.type == "cpu"


def _check_finite(name: str, t: Tensor) -> None:
    # Called only when checks_values(): this reads the tensor on the host.
    # A sum is one pass without allocation and propagates NaN/Inf; only when it is not finite
    # (or overflowed) is the exact elementwise check paid for.
    if torch.isfinite(t.sum()) or torch.isfinite(t).all():
        return
    n_nan = int(torch.isnan(t).sum())
    n_inf = int(torch.isinf(t).sum())
    raise ValueError(f"pap: {name} contains non-finite values ({n_nan} NaN, {n_inf} Inf)")


def visible(attn_mask: Tensor) -> Tensor:
    """Boolean "query i may attend to key j" of a normalised mask, shape ``(..., N | 1, N | 1)``.

    An additive mask hides a key with ``-inf`` or with a large negative number (at most half the
    dtype's lowest value, the convention of Hugging Face masks): either gives it softmax weight 0.
    """
    if attn_mask.dtype == torch.bool:
        return attn_mask
    return attn_mask > torch.finfo(attn_mask.dtype).min / 2


def valid_keys(attn_mask: Tensor | None, shape: tuple[int, int, int, int]) -> Tensor | None:
    """Which keys take part: ``(B, H, N)`` bool (False = padding, a key no query may attend to),
    or None without a mask."""
    if attn_mask is None:
        return None
    b, h, n, _ = shape
    valid = visible(attn_mask).any(dim=-2)
    valid = valid.reshape((1,) * (3 - valid.dim()) + tuple(valid.shape))
    # returned even when every key is valid: testing that would read the values on the host
    return torch.broadcast_to(valid, (b, h, n))


def merge_masks(
    attn_mask: Tensor | None, is_causal: bool, n: int, device: torch.device
) -> tuple[Tensor | None, bool]:
    """SDPA takes either a mask or is_causal; combine them into one mask when both are given."""
    if attn_mask is None or not is_causal:
        return attn_mask, is_causal
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    if attn_mask.dtype == torch.bool:
        return attn_mask & causal, False
    return attn_mask.masked_fill(~causal, float("-inf")), False


def _is_count(x: object) -> bool:
    """An integer, Python or NumPy, but not a bool (``True`` is no count of anything)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_options(
    *,
    n_iter: int = 4,
    lam: float = 4.0,
    threshold: str = "lambda_mu",
    mu_dim: int | None = None,
    dropout_p: float = 0.0,
    where: str = "pap",
) -> None:
    """Check PAP's scalar options; raise ValueError naming the option, the value and what is valid.

    Shared by :func:`pap` and the layers that call it (which check at construction). ``where``
    prefixes the message (the function or class name).
    """
    if not _is_count(n_iter) or n_iter < 1:
        raise ValueError(f"{where}: n_iter must be an integer >= 1 (softmax steps), got {n_iter!r}")
    if isinstance(lam, bool) or not (isinstance(lam, numbers.Real) and math.isfinite(lam) and lam > 0):
        raise ValueError(f"{where}: lam must be a finite number > 0, got {lam!r}")
    if not isinstance(threshold, str) or threshold not in THRESHOLDS:
        raise ValueError(f"{where}: unknown threshold {threshold!r}; valid: {', '.join(THRESHOLDS)}")
    if mu_dim is not None and (not _is_count(mu_dim) or mu_dim < 1):
        # mu_dim = 0 gives mu = tau = 0 (the output is the mean of V); a negative one a negative tau
        raise ValueError(
            f"{where}: mu_dim must be None (the full width H * D) or an integer >= 1, got {mu_dim!r}"
        )
    if isinstance(dropout_p, bool) or not (isinstance(dropout_p, numbers.Real) and 0.0 <= dropout_p < 1.0):
        raise ValueError(f"{where}: dropout_p must be in [0, 1), got {dropout_p!r}")


def validate_inputs(k: Tensor, v: Tensor, q: Tensor | None, check: bool) -> None:
    """Shapes and dtypes (always); NaN/Inf in k, v, q only when ``check`` (see :func:`checks_values`)."""
    if k.dim() != 4:
        raise ValueError(f"pap: k must have shape (B, H, N, D), got {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"pap: v must have shape (B, H, N, Dv) with (B, H, N) = {tuple(k.shape[:3])} of k, "
            f"got {tuple(v.shape)}"
        )
    if v.shape[-1] != k.shape[-1]:
        # L_t (shape of V) is subtracted from K in the next step, so both need width D.
        raise ValueError(f"pap: v must have the head width of k ({k.shape[-1]}), got {v.shape[-1]}")
    if q is not None and q.shape != k.shape:
        raise ValueError(f"pap: q must have the shape of k {tuple(k.shape)}, got {tuple(q.shape)}")
    if not k.is_floating_point() or v.dtype != k.dtype or (q is not None and q.dtype != k.dtype):
        raise ValueError(
            f"pap: k, v (and q) must share one floating dtype, got k {k.dtype}, v {v.dtype}"
            + (f", q {q.dtype}" if q is not None else "")
        )
    if not check:
        return
    _check_finite("k", k)
    _check_finite("v", v)
    if q is not None:
        _check_finite("q", q)


def broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """Whether a tensor of ``shape`` broadcasts to exactly ``target`` (not merely with it: a mask with a
    larger batch than the keys' broadcasts with them, to a larger output)."""
    try:
        return len(shape) <= len(target) and torch.broadcast_shapes(tuple(shape), tuple(target)) == tuple(
            target)
    except RuntimeError:
        return False


def normalise_mask(attn_mask: Tensor | None, k: Tensor, check: bool) -> Tensor | None:
    if attn_mask is None:
        return None
    b, _, n, _ = k.shape
    if attn_mask.dim() == 2 and attn_mask.shape == (b, n) and attn_mask.dtype == torch.bool:
        if b == n:
            raise ValueError(
                f"pap: a boolean attn_mask of shape {(b, n)} is ambiguous when B == N: pass a key-padding "
                "mask as (B, 1, 1, N) or a query-key mask as (1, 1, N, N)"
            )
        return attn_mask[:, None, None, :]  # key padding (B, N) -> (B, 1, 1, N)
    if not broadcasts_to(attn_mask.shape, (b, k.shape[1], n, n)):
        raise ValueError(
            f"pap: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (B, H, N, N) = "
            f"{(b, k.shape[1], n, n)}; a key-padding mask must be boolean (B, N) = {(b, n)}"
        )
    if attn_mask.dtype != torch.bool and attn_mask.dtype != k.dtype:
        raise ValueError(f"pap: attn_mask must be bool or {k.dtype}, got {attn_mask.dtype}")
    if check and attn_mask.dtype != torch.bool and torch.isnan(attn_mask).any():
        raise ValueError("pap: additive attn_mask contains NaN")
    if check and attn_mask.dtype != torch.bool and (attn_mask == float("inf")).any():
        raise ValueError("pap: additive attn_mask contains +inf (a hidden key is -inf; +inf makes the "
                         "softmax undefined)")
    return attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))  # (.., N) -> 4-D



def cpu_float(t: Tensor) -> bool:
    """Whether the cutoff softmax applies to ``t``: float32 / float64 on the CPU (GPUs process
    subnormals at full speed; half precisions go through SDPA everywhere)."""
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)

