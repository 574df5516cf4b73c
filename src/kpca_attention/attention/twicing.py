"""Twicing attention (Abdullaev & Nguyen, ICLR 2025, "Transformer Meets Twicing: Harnessing Unattended
Residual Information"): Tukey's twicing applied to the attention smoother.

Per head, with A = softmax(Q K^T / sqrt(D))::

    out = (2 A - A^2) V = A V + A (V - A V)

computed as written on the right with two fused attention calls (``F.scaled_dot_product_attention``): the
first gives A V, the second smooths the residual V - A V with the same A. No N x N matrix is formed.

Where it applies (official code, ``lazizcodes/twicing_attention``): every layer of the DeiT
(``SharpVisionTransformer``); in the language model only the last layers (``layer_num >= 14`` of 16, the
last eighth) - the registry's ``layers`` (``attn_layers=`` overrides).

Differences from the official code: with attention dropout the official code drops entries of A once and
uses the same dropped A twice (``A @ res``); here each fused call draws its own dropout mask (the models
use ``attn_drop=0``, where both agree exactly). The official LM forms ``2 A - A^2`` and applies dropout to
it; without dropout that is the same number.

Masks: the two calls take the same ``attn_mask`` / ``is_causal``, so A is the masked attention matrix and
(2 A - A^2) is causal when A is (a product of lower-triangular matrices): no leak from the future.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from .base import QueryOptionalAttention
from .hooks import HookPoint
from .registry import register_mechanism

__all__ = ["TwicingAttention", "last_eighth"]


def last_eighth(depth: int) -> list[int]:
    """The official LM's blocks: ``layer >= 14`` of 16, i.e. the last eighth (at least the last block)."""
    return list(range(depth - max(1, depth // 8), depth))


class TwicingAttention(QueryOptionalAttention):
    """Twicing attention ``(2 A - A^2) V = A V + A (V - A V)`` with two fused attention calls.

    Args (besides timm's):
        symmetric: True: W_Q = W_K (a SymViT layer, A = softmax(K K^T / sqrt D)).

    Hook points (besides ``hook_q`` / ``hook_k`` / ``hook_v`` / ``hook_z``): ``hook_av``, the first
    smoothing A V ``(B, H, N, D)``; the twicing correction A (V - A V) is ``hook_z`` minus it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hook_av = HookPoint()

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        q, k, v = qkv["q"], qkv["k"], qkv["v"]
        av = self.hook_av(F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                         dropout_p=self.dropout_p))
        return av + F.scaled_dot_product_attention(q, k, v - av, attn_mask=attn_mask, is_causal=is_causal,
                                                   dropout_p=self.dropout_p)

    def extra_repr(self) -> str:
        return f"symmetric={self.symmetric}"


register_mechanism(
    "twicing", TwicingAttention, layers={"lm": last_eighth},
    description="Twicing attention (2A - A^2) V = A V + A (V - A V), two fused calls "
                "(vision: every block; LM: the last eighth, >= 14 of 16)",
)
