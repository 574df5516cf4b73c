"""FAN's attentional channel processing (Zhou et al., ICML 2022, "Understanding The Robustness in Vision
Transformers"): the MLP after self-attention becomes a channel-attention block. Written from the paper's
description and from reading the official code (``NVlabs/FAN``, NVIDIA non-commercial licence: read only,
nothing copied); the paper's text itself was not available here, so the form below is the one the
official FAN-ViT models train with (``ChannelProcessing``).

For tokens X ``(B, N, C)`` split into h channel groups ("heads") of width c = C / h:

* values: a token MLP, ``V = LN(fc2(U + gamma * DWConv(U)))`` with ``U = fc1(X)`` (hidden width
  ``mlp_ratio * C``), ``DWConv`` = depth-wise 3x3 conv, GELU, BatchNorm, depth-wise 3x3 conv over the patch
  grid (prefix tokens such as the class token get no conv term), ``gamma`` a learned per-channel scale
  (init 1); no activation between fc1 and fc2 besides the one inside DWConv (as the official ``Mlp``);
* channel attention per group: ``Qs = softmax_tokens(X W_q)``, ``Ks = softmax_tokens(X)`` averaged over
  the group's channels (one number per token), ``a = tau * sigmoid(Qs^T Ks)`` - one weight per channel,
  ``tau`` a learned per-group temperature (init 1);
* output ``a * V`` (each channel of the token MLP's output scaled by its attention weight).

The block is timm's ``Block`` with this module as ``mlp_layer`` (pre-norm, residual, layer scale), so a FAN
ViT is ``VisionTransformer(mlp_layer=configure(FANChannelMLP, num_heads=h), init_values=1.0)`` (FAN's
``eta`` = 1). It mixes over all tokens (softmax over the sequence): a vision block, not causal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from timm.models import register_notrace_module
from torch import Tensor, nn

__all__ = ["FANChannelMLP", "DepthwiseConvMix"]


# a leaf for timm's FX feature extraction (the token count decides the patch grid)
@register_notrace_module
class DepthwiseConvMix(nn.Module):
    """Depth-wise 3x3 conv, activation, BatchNorm, depth-wise 3x3 conv over the square patch grid of
    ``(B, N, C)`` tokens whose first ``num_prefix_tokens`` are prefix tokens (zero output for those)."""

    def __init__(self, channels: int, act_layer: Callable[..., nn.Module] = nn.GELU,
                 num_prefix_tokens: int = 1, **dd: Any) -> None:
        super().__init__()
        self.num_prefix_tokens = num_prefix_tokens
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, **dd)
        self.act = act_layer()
        self.bn = nn.BatchNorm2d(channels, **dd)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, **dd)
        for conv in (self.conv1, self.conv2):  # the official init: normal(0, sqrt(2 / fan_out))
            nn.init.normal_(conv.weight, 0.0, math.sqrt(2.0 / 9))
            nn.init.zeros_(conv.bias)

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        p = self.num_prefix_tokens
        g = math.isqrt(max(n - p, 0))
        if g * g != n - p:
            raise ValueError(f"FANChannelMLP: {n} tokens are not {p} prefix tokens and a square patch grid")
        grid = x[:, p:].transpose(1, 2).reshape(b, c, g, g)
        y = self.conv2(self.bn(self.act(self.conv1(grid)))).reshape(b, c, g * g).transpose(1, 2)
        return torch.cat([torch.zeros_like(x[:, :p]), y], dim=1)


class FANChannelMLP(nn.Module):
    """FAN's channel processing as a timm ``mlp_layer`` (see the module docstring).

    Args (timm's Mlp arguments, and):
        num_heads: channel groups h (FAN: the block's number of heads).
        num_prefix_tokens: tokens before the patch grid (timm's class token: 1), outside the conv.
        qkv_bias: bias of the query projection W_q (FAN: True).
    """

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: Callable[..., nn.Module] = nn.GELU, norm_layer: Any = None, bias: bool = True,
                 drop: float = 0.0, num_heads: int = 8, qkv_bias: bool = True, attn_drop: float = 0.0,
                 num_prefix_tokens: int = 1, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        del norm_layer  # timm passes its scale-norm option; FAN normalises V with a LayerNorm instead
        if out_features not in (None, in_features):
            raise ValueError("FANChannelMLP keeps the width (out_features must equal in_features)")
        if in_features % num_heads:
            raise ValueError(f"FANChannelMLP: num_heads ({num_heads}) must divide the width ({in_features})")
        dd = {"device": device, "dtype": dtype}
        hidden = hidden_features or in_features
        self.num_heads = num_heads
        self.fc1 = nn.Linear(in_features, hidden, bias=bias, **dd)
        self.dwconv = DepthwiseConvMix(hidden, act_layer, num_prefix_tokens, **dd)
        self.gamma = nn.Parameter(torch.ones(hidden, **dd))
        self.fc2 = nn.Linear(hidden, in_features, bias=bias, **dd)
        self.drop = nn.Dropout(drop)
        self.norm_v = nn.LayerNorm(in_features, **dd)
        self.q = nn.Linear(in_features, in_features, bias=qkv_bias, **dd)
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1, **dd))
        self.attn_drop = nn.Dropout(attn_drop)

    def channel_weights(self, x: Tensor) -> Tensor:
        """``(B, h, c, 1)``: tau * sigmoid(softmax_tokens(X W_q)^T mean_channels softmax_tokens(X))."""
        b, n, c = x.shape
        h = self.num_heads
        q = self.q(x).reshape(b, n, h, c // h).permute(0, 2, 1, 3).softmax(dim=-2)
        k = x.reshape(b, n, h, c // h).permute(0, 2, 1, 3).softmax(dim=-2).mean(dim=-1, keepdim=True)
        return torch.sigmoid(q.transpose(-1, -2) @ k) * self.temperature

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        u = self.fc1(x)
        u = u + self.drop(self.gamma * self.dwconv(u))
        v = self.norm_v(self.drop(self.fc2(u)))
        a = self.attn_drop(self.channel_weights(x))  # (B, h, c/h, 1)
        return a.reshape(b, 1, c) * v  # head-major channels, as v's (h, c/h) split

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
