"""Independent float64 transcriptions of the robust-attention family's equations (issue 25), for the
tests/test_family_*.py files. Written from the papers' / official code's formulas with explicit
matrices (no SDPA, no state dict): a stack of layers is run by hand, each layer's q, k, v read from
its weights."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def heads(layer, x: Tensor) -> dict[str, Tensor]:
    """q, k, v ``(B, H, N, D)`` of ``layer`` on ``x (B, N, C)`` from its fused projection's weights."""
    w = layer.in_proj.weight.double()
    bias = layer.in_proj.bias
    y = x.double() @ w.T + (0 if bias is None else bias.double())
    b, n, _ = x.shape
    h, d = layer.num_heads, layer.head_dim
    parts = y.reshape(b, n, len(layer.projections), h, d).permute(2, 0, 3, 1, 4)
    out = {name: parts[i] for i, name in enumerate(layer.projections)}
    out.setdefault("q", out["k"])
    return out


def visible_matrix(n: int, attn_mask: Tensor | None, causal: bool, shape: tuple[int, ...]) -> Tensor:
    """Boolean (B, H, N, N): query i may see key j."""
    vis = torch.ones(*shape[:2], n, n, dtype=torch.bool)
    if attn_mask is not None:
        vis = vis & attn_mask.bool()
    if causal:
        vis = vis & torch.ones(n, n, dtype=torch.bool).tril()
    return vis


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, vis: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(D)) v with hidden entries at -inf, written out."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~vis, float("-inf"))
    a = torch.exp(s - s.amax(-1, keepdim=True))
    a = a / a.sum(-1, keepdim=True)
    return a @ v


def layer_attention(layer, x: Tensor, attn_mask: Tensor | None,
                    causal: bool) -> tuple[dict[str, Tensor], Tensor]:
    """``layer``'s q, k, v on ``x`` (:func:`heads`) and their softmax attention over the keys each query
    may see, before the output projection."""
    p = heads(layer, x)
    vis = visible_matrix(x.shape[1], attn_mask, causal, p["v"].shape)
    return p, softmax_attention(p["q"], p["k"], p["v"], vis)


def merge(layer, out: Tensor) -> Tensor:
    """Heads ``(B, H, N, D)`` -> the layer's output projection, float64."""
    b, h, n, d = out.shape
    y = out.transpose(1, 2).reshape(b, n, h * d)
    return y @ layer.proj.weight.double().T + layer.proj.bias.double()
