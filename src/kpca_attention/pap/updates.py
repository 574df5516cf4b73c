"""PAP's elementwise update between two softmax steps, with hand-written backwards.

Between two softmax steps PAP does only elementwise work. Left to autograd, it is a dozen passes
over (B, H, N, D) each way, and torch.minimum/maximum's backward (which splits the gradient at
ties) alone costs more than the attention. The two Functions below do the same arithmetic with
a hand-written backward in a few passes; tests/test_pap.py checks them with gradcheck.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import kernels
from .inputs import tracing

__all__: list[str] = []


def clamp_tau(z: Tensor, tau: Tensor, *, in_place: bool = False, neg_tau: Tensor | None = None) -> Tensor:
    """``clamp(z, -tau, tau)``, into ``z`` itself with ``in_place`` (``neg_tau``: -tau, if at hand).
    Two vectorised passes (min, max); clamp with tensor bounds is one pass but ~2x slower on CPU."""
    c = torch.minimum(z, tau, out=z) if in_place else torch.minimum(z, tau)
    return torch.maximum(c, -tau if neg_tau is None else neg_tau, out=c)


def update_step(
    k: Tensor, L: Tensor, R: Tensor, tau: Tensor, spare: Tensor | None = None, *, keep_c: bool = False,
    neg_tau: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """One PAP update ``(K, L_t, R_t) -> (R_{t+1}, X_{t+1})``, overwriting ``R`` and ``spare``.

    With W_t = R_t - L_t:  C = clamp(K - L_t + W_t, tau),  R_{t+1} = C + L_t,
    X_{t+1} = C + L_t - 2 W_t = R_{t+1} + 2 (L_t - R_t). With ``keep_c`` also returns C (a fresh
    tensor, for the backward) and leaves ``R`` alone.
    """
    if keep_c:
        C, X_next, R_next = (torch.empty_like(L) for _ in range(3))
        update_into(k, L, R, tau, neg_tau, C, X_next, R_next)
        return R_next, X_next, C
    C = torch.empty_like(L) if spare is None else spare
    update_into(k, L, R, tau, neg_tau, C, R, C)  # X_{t+1} over R_t, R_{t+1} over C
    return C, R


def update_into(k: Tensor, L: Tensor, R: Tensor, tau: Tensor, neg_tau: Tensor | None, C: Tensor, X: Tensor,
                 R_next: Tensor) -> None:
    """:func:`update_step` into given buffers: C_t into ``C``, X_{t+1} into ``X``, R_{t+1} into ``R_next``.
    ``X`` or ``R_next`` may be ``R``, and ``R_next`` may be ``C``: every pass reads an element before it
    writes it, and R_t is not read after E_t. ``neg_tau`` is -tau, if at hand. One pass with the compiled
    kernel (kernels.py) on ``(nb, N, D)`` blocks whose tau is ``(nb, 1 | N, 1)``, else five eager passes."""
    kern = kernels.active()
    if kern is not None and _kernel_fits(k, L, R, tau, C, X, R_next):
        kern.update_(k, L, R, tau, C, X, R_next)
        return
    E = torch.sub(L, R, out=X)  # E_t = L_t - R_t = -W_t
    torch.sub(k, E, out=C).sub_(L)  # K - L_t + W_t
    clamp_tau(C, tau, in_place=True, neg_tau=neg_tau)
    torch.add(C, L, out=R_next)
    torch.add(R_next, E, alpha=2.0, out=E)


def _kernel_fits(k: Tensor, *rest: Tensor) -> bool:
    """Whether :func:`update_into`'s arguments are what the compiled kernel takes: contiguous CPU blocks
    ``(nb, N, D)`` of one float dtype, tau ``(nb, 1 | N, 1)``, outside tracing."""
    tau = rest[2]
    if k.dim() != 3 or k.device.type != "cpu" or k.dtype not in (torch.float32, torch.float64) or tracing():
        return False
    if tau.dim() != 3 or tau.shape[0] != k.shape[0] or tau.shape[2] != 1 \
            or tau.shape[1] not in (1, k.shape[1]):
        return False
    return all(t.is_contiguous() and t.dtype == k.dtype and t.device == k.device for t in (k, *rest)) and all(
        t.shape == k.shape for i, t in enumerate(rest) if i != 2)


def clamp_backward(g: Tensor, C: Tensor, tau: Tensor, need_tau: bool, out: Tensor | None = None,
                    tmp: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Gradients of ``C = clamp(Z, -tau, tau)`` w.r.t. Z and tau, given dL/dC = g (not modified);
    dZ is written into ``out`` and ``tmp`` holds a temporary, when given (else fresh tensors).

    Inside (|C| < tau) the gradient passes to Z; outside C = sign(Z) tau, so dC/dtau = C / tau.
    """
    g_z = torch.abs(C, out=out).lt_(tau).mul_(g)  # the 1.0 / 0.0 mask of "inside", times g
    g_tau = None
    if need_tau:
        g_tau = torch.sub(g, g_z, out=tmp).mul_(C).sum_to_size(tau.shape).div_(tau)
    return g_z, g_tau


def update_backward(g_c: Tensor, g_x: Tensor | None, g_z: Tensor, g_L: Tensor | None = None,
                     g_R: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The update's backward after its clamp's: with Z = K - 2 L_t + R_t, C = clamp(Z), R' = C + L_t,
    X' = C + 3 L_t - 2 R_t, dC = dR' + dX' and dZ from :func:`clamp_backward`, returns
    ``dL_t = dC + 2 dX' - 2 dZ`` (into ``g_L``, which may be ``g_c``) and ``dR_t = dZ - 2 dX'`` (into
    ``g_R``, which may be ``g_c`` or ``g_x``); fresh tensors where no buffer is given; ``g_x`` None is 0."""
    if g_x is None:
        return torch.add(g_c, g_z, alpha=-2.0, out=g_L), (g_z if g_R is None else g_R.copy_(g_z))
    g_L = torch.add(g_c, g_x, alpha=2.0, out=g_L).sub_(g_z, alpha=2.0)
    return g_L, torch.add(g_z, g_x, alpha=-2.0, out=g_R)


def update_backward_fused(dX: Tensor, dR: Tensor | None, C: Tensor, tau: Tensor, g_k: Tensor,
                          dL: Tensor | None, g_tau: Tensor | None, *, dr_in: bool,
                          accumulate_k: bool) -> bool:
    """:func:`clamp_backward` then :func:`update_backward` on one block of PAPSaved's backward in one pass
    (the compiled ``update_backward_``), where the kernels run and the blocks fit; returns whether it ran.

    dC = dX (+ dR when ``dr_in``); dZ = dC inside the clamp (|C| < tau); ``g_k`` = dZ (+ ``g_k`` when
    ``accumulate_k``); ``g_tau`` += sum(dC * C / tau) outside (when given); when ``dL`` is given (a step
    after the first): ``dL`` = dC + 2 dX - 2 dZ and ``dR`` = dZ - 2 dX (over dR_t)."""
    ops = kernels.active()
    others = [t for t in (dR, dL) if t is not None]
    if ops is None or not _kernel_fits(dX, C, g_k, tau, *others) \
            or (g_tau is not None and not (g_tau.is_contiguous() and g_tau.shape == tau.shape)):
        return False
    empty = dX.new_empty(0)
    ops.update_backward_(dX, empty if dR is None else dR, C, tau, g_k, empty if dL is None else dL,
                         empty if g_tau is None else g_tau, dr_in, accumulate_k, dL is not None)
    return True


class ClampTau(torch.autograd.Function):
    """``clamp(z, -tau, tau)`` with a cheap backward (the first PAP step, X_1 = clamp(K))."""

    @staticmethod
    def forward(ctx, z: Tensor, tau: Tensor) -> Tensor:
        C = clamp_tau(z, tau)
        ctx.save_for_backward(C, tau)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor | None]:
        C, tau = ctx.saved_tensors
        return clamp_backward(g, C, tau, ctx.needs_input_grad[1])


class UpdateStep(torch.autograd.Function):
    """:func:`update_step` with autograd: ``(K, L_t, R_t, tau) -> (R_{t+1}, X_{t+1})``.

    Backward, with Z = K - 2 L_t + R_t, C = clamp(Z), R' = C + L_t, X' = C + 3 L_t - 2 R_t:
    dC = dR' + dX';  dZ, dtau from the clamp;  dK = dZ;  dR_t = dZ - 2 dX';  dL_t = dR' + 3 dX' - 2 dZ.
    """

    @staticmethod
    def forward(ctx, k: Tensor, L: Tensor, R: Tensor, tau: Tensor) -> tuple[Tensor, Tensor]:
        R_next, X_next, C = update_step(k, L, R, tau, keep_c=True)
        ctx.save_for_backward(C, tau)
        return R_next, X_next

    @staticmethod
    @once_differentiable
    def backward(ctx, g_r: Tensor | None, g_x: Tensor | None) -> tuple[Tensor | None, ...]:
        C, tau = ctx.saved_tensors
        if g_r is None and g_x is None:
            return None, None, None, None
        both = g_r is not None and g_x is not None
        g_c = g_r + g_x if both else (g_r if g_x is None else g_x)
        g_z, g_tau = clamp_backward(g_c, C, tau, ctx.needs_input_grad[3])
        g_k = g_z if ctx.needs_input_grad[0] else None
        g_L, g_R = update_backward(g_c, g_x, g_z, g_L=g_c if both else None)  # dC's buffer when ours
        return g_k, g_L, g_R, g_tau



def flat_tau(tau: Tensor, b: int, h: int) -> tuple[Tensor, Tensor]:
    """tau and -tau as ``(B * H, 1 | N, 1)``, indexed like the flattened ``(B * H, N, D)`` keys."""
    tau_f = torch.broadcast_to(tau, (b, h, tau.shape[-2], 1)).reshape(b * h, tau.shape[-2], 1)
    return tau_f, tau_f.neg()

