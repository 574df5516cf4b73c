"""Symmetric softmax attention: one Linear(dim, 2 dim) for K and V, no Q (W_Q = W_K)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from .base import HeadsAttention
from .registry import register_mechanism

__all__ = ["SymmetricAttention"]


class SymmetricAttention(HeadsAttention):
    """Symmetric softmax attention: ``softmax(K K^T / sqrt(D)) V`` (W_Q = W_K, bias included)."""

    projections = ("k", "v")

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        k = qkv["k"]
        return F.scaled_dot_product_attention(
            k, k, qkv["v"], attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.dropout_p
        )


register_mechanism("symmetric", SymmetricAttention, symmetric_ok=True, asymmetric_ok=False,
                   description="symmetric softmax attention softmax(K K^T / sqrt(D)) V (SymViT)")
