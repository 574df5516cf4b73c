"""Elliptical attention (Nielsen, Abdullaev, Teo, Nguyen, NeurIPS 2024): softmax with a Mahalanobis
metric whose per-dimension weights come from how much the values changed since the previous layer.

Per head, in layer l >= 1 (the official ``MahalaAttention.W_over_layers``, ``stefvk/Elliptical-Attention``,
``Elliptical_ImAttack/models.py``)::

    m_j   = mean_n |v^l_nj - v^{l-1}_nj| / delta                      (delta = 5)
    m_j  <- m_j / max_j' m_j'                                         (max-scaling, per sample and head)
    out   = softmax((Q diag(m)) K^T / sqrt(D)) V

computed per (sample, head). As the official code, m is computed WITHOUT gradient (``torch.no_grad`` on
detached inputs): white-box gradients see a constant metric. ``differentiable=True`` keeps m in the graph
(for adaptive attacks). The first layer has no previous values and computes plain attention; the values
of every layer reach the next one through the cross-layer state (``state["v_prev"]``, :mod:`.stateful`).

Published options of the official code: ``delta`` (5; None uses its other estimator, the difference
quotient ``(v^l - v^{l-1}) / (|q^l - q^{l-1}| + attenuation)`` with ``attenuation`` 1e-3) and ``median``
(the median over tokens instead of the mean). The official code divides by the max without a guard (0/0
when the values did not change); here the max is clamped to the smallest normal number, the only
difference (m = 0 then, which is plain attention with zero queries). A positive ``delta`` cancels in the
max-scaling, in the official code as here: every value gives the same metric (up to rounding), so of
``delta``'s settings only None (the other estimator) changes the model.

Which of mean and median the published numbers used is not settled here: the official training script
(``Elliptical_ImageNet/run_elliptical.sh``) passes no ``--grad-median`` and so trains with the mean (this
layer's default), while its attack scripts (``Elliptical_ImAttack/Scripts/run_*.sh``) pass ``--grad-median``;
the WikiText attack script builds its model with that flag but then replaces it with the unpickled trained
one, so there the flag never reaches the model; the ImageNet attack code that would tell was not readable
here. The official WikiText model also leaves the Mahalanobis logits unscaled (no 1 / sqrt(D)); this layer
follows the ImageNet code and the paper's 1 / sqrt(D) in every task.

Masks: with a mask or a causal mask the mean over tokens becomes the mean over the tokens each query may
see (``m`` per query), so a causal model sees nothing from the future (the official code has no mask and
averages over all tokens, which would leak future values into position t). ``median`` is only defined
without masks (a ValueError otherwise).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import Bool, Real
from ..pap import visible
from .hooks import HookPoint
from .registry import register_mechanism
from .stateful import State, StatefulAttention

__all__ = ["EllipticalAttention", "elliptical_metric"]


def elliptical_metric(
    q: Tensor,
    q_prev: Tensor | None,
    v: Tensor,
    v_prev: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    delta: float | None = 5.0,
    attenuation: float = 1e-3,
    median: bool = False,
    differentiable: bool = False,
) -> Tensor:
    """The metric weights m: ``(B, H, 1, D)`` without a mask, ``(B, H, N, D)`` (per query) with one."""
    with torch.set_grad_enabled(differentiable and torch.is_grad_enabled()):
        if not differentiable:
            v, v_prev = v.detach(), v_prev.detach()
            q = q.detach()
            q_prev = None if q_prev is None else q_prev.detach()
        # a constant delta divides after the reduction over tokens (every reduction below is linear or,
        # for the median, monotone): two passes over (B, H, N, D) fewer than dividing each element
        quot = torch.sub(v, v_prev).abs_()
        if delta is None:
            quot = quot / (torch.sub(q, q_prev).abs_() + attenuation)
        if attn_mask is None and not is_causal:
            m = quot.median(dim=-2, keepdim=True).values if median else quot.mean(dim=-2, keepdim=True)
        elif median:
            raise ValueError("EllipticalAttention: median=True is defined without masks only")
        elif attn_mask is None:  # causal: the mean over the prefix 0..t
            n = quot.shape[-2]
            count = torch.arange(1, n + 1, device=quot.device, dtype=quot.dtype).unsqueeze(-1)
            m = quot.cumsum(dim=-2) / count
        else:
            n = quot.shape[-2]
            vis = torch.broadcast_to(visible(attn_mask), (*quot.shape[:-2], n, n))
            if is_causal:
                vis = vis & torch.ones(n, n, dtype=torch.bool, device=quot.device).tril()
            w = vis.to(quot.dtype)
            m = (w @ quot) / w.sum(dim=-1, keepdim=True).clamp_min(1.0)
        if delta is not None:
            m = m / delta
        return m / m.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(m.dtype).tiny)


# FX: the metric branches on the mask and on is_causal, which are inputs of a traced ViT; one leaf call.
torch.fx.wrap("elliptical_metric")


class EllipticalAttention(StatefulAttention):
    """Elliptical attention ``softmax((Q diag(m)) K^T / sqrt(D)) V`` (see the module docstring).

    Args (besides timm's):
        delta: the step of the difference quotient (official 5; any positive value gives the same
            metric: it cancels in the max-scaling); None: the official alternative,
            ``|q^l - q^{l-1}| + attenuation``.
        attenuation: the stabiliser of the ``delta=None`` estimator (official 1e-3).
        median: the median over tokens instead of the mean (official option; no masks).
        differentiable: False (official): m is computed without gradient; True: m is differentiated.
        symmetric: True: W_Q = W_K (the metric scales the keys on the query side: K diag(m) K^T).
        applied: False: plain attention here (the layer's values are still recorded for the next one).

    Hook point (besides ``hook_q`` / ``hook_k`` / ``hook_v`` / ``hook_z``): ``hook_metric``, the metric
    weights m (:func:`elliptical_metric`: ``(B, H, 1, D)``, per query ``(B, H, N, D)`` under a mask), in
    every layer that applies it; ``hook_q`` holds the queries before m scales them.
    """

    #: an adaptive attack differentiates m (the values it gives are the same)
    adaptive_options = {"differentiable": True}
    parameter_constraints = {**StatefulAttention.parameter_constraints,
                             "delta": Real(min=0, min_open=True, allow_none=True), "attenuation": Real(min=0),
                             "median": Bool(), "differentiable": Bool()}

    def __init__(self, dim: int, num_heads: int = 8, *args: Any, delta: float | None = 5.0,
                 attenuation: float = 1e-3, median: bool = False, differentiable: bool = False,
                 **kwargs: Any) -> None:
        self.validate_options(delta=delta, attenuation=attenuation, median=median,
                              differentiable=differentiable)
        super().__init__(dim, num_heads, *args, **kwargs)
        self.delta = None if delta is None else float(delta)
        self.attenuation, self.median, self.differentiable = float(attenuation), median, differentiable
        self.hook_metric = HookPoint()

    def attend_state(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool,
                     state: State) -> tuple[Tensor, State]:
        q, k, v = qkv["q"], qkv["k"], qkv["v"]
        new_state = {**state, "v_prev": v}
        if self.delta is None:
            new_state["q_prev"] = q
        if self.applied and "v_prev" in state:
            if self.delta is None and "q_prev" not in state:
                raise ValueError("EllipticalAttention(delta=None) needs the previous layer's queries: the "
                                 "previous layer must be an EllipticalAttention with delta=None too")
            m = self.hook_metric(elliptical_metric(q, state.get("q_prev"), v, state["v_prev"], attn_mask,
                                                   is_causal, self.delta, self.attenuation, self.median,
                                                   self.differentiable))
            q = q * m
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                             dropout_p=self.dropout_p)
        return out, new_state

    def extra_repr(self) -> str:
        return (f"delta={self.delta}, attenuation={self.attenuation}, median={self.median}, "
                f"differentiable={self.differentiable}, {super().extra_repr()}")


register_mechanism(
    "elliptical", EllipticalAttention, dict(delta=5.0, attenuation=1e-3, median=False, differentiable=False),
    description="Elliptical attention: softmax((Q diag(m)) K^T / sqrt D) V, m from |V^l - V^{l-1}| / 5 "
                "(max-scaled, no gradient)",
)
