"""NeuTRENO (Nguyen et al., NeurIPS 2023, "Mitigating Over-smoothing in Transformers via Regularized
Nonlocal Functionals"): attention plus a fidelity term toward the first layer's values.

Per head, in layer l >= 1::

    out^l = softmax(Q^l K^l^T / sqrt(D)) V^l + lam * (V^0 - V^l)

with V^0 the values of the first layer (the same forward pass, not detached: gradients flow into the
first layer's value projection through every later layer). The first layer computes plain attention and
records V^0. As the official DeiT code (``tamnguyen9520/NeuTRENO_NeurIPS2024``, ``DeiT/neutreno.py``):
lam multiplies (V^0 - V^l) per head before the heads are merged and projected; attention dropout acts
on the attention weights only; every layer after the first applies the term. Defaults: lam 0.6 for
vision (the official code), 0.4 for the language model (reference notes).

V^0 reaches later layers through the cross-layer state (``state["v0"]``, see :mod:`.stateful`), never
through a module attribute. The term is token-wise, so under a causal mask position t still sees
nothing after t.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import Real
from .base import fresh_or_inplace_add
from .hooks import HookPoint
from .registry import register_mechanism
from .stateful import State, StatefulAttention

__all__ = ["NeuTRENOAttention"]


class NeuTRENOAttention(StatefulAttention):
    """NeuTRENO: ``A V + lam (V^0 - V)`` (see the module docstring).

    Args (besides timm's):
        lam: the fidelity weight (official vision code 0.6; language models 0.4).
        symmetric: True: W_Q = W_K (a SymViT layer, softmax(K K^T / sqrt D)).
        applied: False: plain attention in this layer (V^0 is still recorded if this is the first).

    Hook point (besides ``hook_q`` / ``hook_k`` / ``hook_v`` / ``hook_z``): ``hook_error``, the fidelity
    error V^0 - V^l ``(B, H, N, D)`` before lam multiplies it (every layer after the first).
    """

    parameter_constraints = {**StatefulAttention.parameter_constraints, "lam": Real()}

    def __init__(self, dim: int, num_heads: int = 8, *args: Any, lam: float = 0.6, **kwargs: Any) -> None:
        self.validate_options(lam=lam)
        super().__init__(dim, num_heads, *args, **kwargs)
        self.lam = float(lam)
        self.hook_error = HookPoint()

    def attend_state(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool,
                     state: State) -> tuple[Tensor, State]:
        v = qkv["v"]
        out = F.scaled_dot_product_attention(qkv["q"], qkv["k"], v, attn_mask=attn_mask, is_causal=is_causal,
                                             dropout_p=self.dropout_p)
        if "v0" not in state:  # the first layer: record V^0, no fidelity term (it would be 0)
            return out, {**state, "v0": v}
        if self.applied:
            out = fresh_or_inplace_add(out, self.hook_error(torch.sub(state["v0"], v)), self.lam)
        return out, state

    def extra_repr(self) -> str:
        return f"lam={self.lam}, {super().extra_repr()}"


register_mechanism(
    "neutreno", NeuTRENOAttention, dict(lam=0.6), task_defaults={"lm": dict(lam=0.4)},
    description="NeuTRENO: A V + lambda (V^0 - V^l), V^0 the first layer's values "
                "(lambda 0.6 vision, 0.4 LM)",
)
