"""PIDformer (Nguyen, Uribe, Nguyen, Baraniuk, ICML 2024, arXiv 2402.15989): attention with PID
feedback toward a reference, layer by layer.

No official code exists, and the paper's text could not be read while this was written (only its
abstract: "a PID closed-loop feedback control system with a reference point"). What is implemented is
the standard discrete PID controller on the layer error, chosen so that its P-only case is exactly
NeuTRENO (:mod:`.neutreno`), as the issue states. Per head, in layer l >= 1::

    e^l   = V^0 - V^l                                  (error: reference minus the layer's values)
    I^l   = sum_{m=1..l} e^m                            (integral, a running sum over layers, dt = 1)
    D^l   = e^l - e^{l-1}                               (derivative, backward difference; e^0 = 0)
    out^l = softmax(Q^l K^l^T / sqrt(D)) V^l + kp e^l + ki I^l + kd D^l

ASSUMPTIONS (not read from the paper): the reference f is V^0, the first layer's values (as in NeuTRENO;
the paper's abstract says "reference point", the reference notes "the input"); the time step is one
layer; the integral is an undamped sum starting at layer 1; e^0 = 0 (the first layer is its own
reference), so D^1 = e^1. The first layer computes plain attention and records V^0.

Defaults (ASSUMED, not verified against the paper): kp = NeuTRENO's lambda (0.6 vision, 0.4 LM), so that
``ki = kd = 0`` reproduces NeuTRENO exactly; ki = 0.1 and kd = 0.1. Every option can be set.

The reference, the integral and the previous error travel in the cross-layer state (``state["v0"]``,
``state["pid_integral"]``, ``state["pid_error"]``; :mod:`.stateful`). All terms are token-wise, so a
causal model sees nothing from the future. A layer with ``applied=False`` still updates the integral and
the previous error (the controller keeps measuring) but adds no feedback.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import Real
from ..pap import kernels, tracing
from ..pap.inputs import cpu_float
from .base import fresh_or_inplace_add
from .hooks import HookPoint
from .registry import register_mechanism
from .stateful import State, StatefulAttention

__all__ = ["PIDAttention"]


class PIDAttention(StatefulAttention):
    """PID-controlled attention ``A V + kp e + ki I + kd D`` (see the module docstring).

    Args (besides timm's):
        kp, ki, kd: the proportional, integral and derivative gains.
        symmetric: True: W_Q = W_K (a SymViT layer).
        applied: False: plain attention in this layer (the controller's state is still updated).

    Hook points (besides ``hook_q`` / ``hook_k`` / ``hook_v`` / ``hook_z``), ``(B, H, N, D)``, every layer
    after the first: ``hook_error`` (e^l = V^0 - V^l) and ``hook_integral`` (I^l, the sum of e over layers).
    """

    parameter_constraints = {**StatefulAttention.parameter_constraints,
                             "kp": Real(), "ki": Real(), "kd": Real()}

    def __init__(self, dim: int, num_heads: int = 8, *args: Any, kp: float = 0.6, ki: float = 0.1,
                 kd: float = 0.1, **kwargs: Any) -> None:
        self.validate_options(kp=kp, ki=ki, kd=kd)
        super().__init__(dim, num_heads, *args, **kwargs)
        self.kp, self.ki, self.kd = float(kp), float(ki), float(kd)
        self.hook_error, self.hook_integral = HookPoint(), HookPoint()

    def attend_state(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool,
                     state: State) -> tuple[Tensor, State]:
        v = qkv["v"]
        out = F.scaled_dot_product_attention(qkv["q"], qkv["k"], v, attn_mask=attn_mask, is_causal=is_causal,
                                             dropout_p=self.dropout_p)
        if "v0" not in state:  # the first layer: the reference, e^0 = 0 (nothing to store)
            return out, {**state, "v0": v}
        if self.applied and (fused := self._feedback(out, v, state)) is not None:
            err, integral = fused
            return out, {**state, "pid_integral": integral, "pid_error": err}
        err = self.hook_error(state["v0"] - v)
        integral = self.hook_integral(err if "pid_integral" not in state else state["pid_integral"] + err)
        if self.applied:
            # kp e + ki sum e + kd (e - e_prev) as (kp + kd) e + ki sum e - kd e_prev: three passes over the
            # values instead of seven (a new tensor first where SDPA's backward keeps its output)
            out = fresh_or_inplace_add(out, err, self.kp + self.kd).add_(integral, alpha=self.ki)
            if "pid_error" in state:
                out = out.sub_(state["pid_error"], alpha=self.kd)  # assigned: FX keeps in-place results used
        return out, {**state, "pid_integral": integral, "pid_error": err}

    def _feedback(self, out: Tensor, v: Tensor, state: State) -> tuple[Tensor, Tensor] | None:
        """The feedback below in one compiled pass (``csrc/pid_kernels.cpp``): ``out`` updated in place,
        ``(e, I)`` returned. Only where nothing records or reads the terms - no autograd, no tracing, no hook
        on ``hook_error`` / ``hook_integral`` - on CPU float tensors whose last dimension is contiguous, and
        where the kernels are built; else None (the eager ops run)."""
        ops = kernels.active()
        if ops is None or not hasattr(ops, "pid_feedback_") or self.hook_error.active \
                or self.hook_integral.active or tracing():
            return None
        prev = [state.get("pid_integral"), state.get("pid_error")]
        terms = [t for t in (out, v, state["v0"], *prev) if t is not None]
        if torch.is_grad_enabled() and any(t.requires_grad for t in terms):
            return None  # autograd records the feedback: the eager ops
        if any(not cpu_float(t) or t.dtype != out.dtype or t.shape != out.shape or t.stride(-1) != 1
               for t in terms):
            return None
        empty = out.new_empty(0)
        return ops.pid_feedback_(out, state["v0"], v, *(empty if t is None else t for t in prev),
                                 self.kp + self.kd, self.ki, self.kd)

    def extra_repr(self) -> str:
        return f"kp={self.kp}, ki={self.ki}, kd={self.kd}, {super().extra_repr()}"


register_mechanism(
    "pid", PIDAttention, dict(kp=0.6, ki=0.1, kd=0.1), task_defaults={"lm": dict(kp=0.4)},
    description="PIDformer: A V + kp e + ki sum e + kd (e - e_prev), e = V^0 - V^l (assumed discrete PID)",
)
