"""RVT's position-aware attention scaling (Mao et al., CVPR 2022, "Towards Robust Vision Transformer";
official code ``vtddggg/Robust-Vision-Transformer``, ``robust_models.py``, read, not copied).

Per head h, a learned N x N matrix W_p^h scales the attention logits before the softmax::

    out = softmax((Q K^T / sqrt(D)) * sigmoid(W_p)) V

The official code (``Attention(use_mask=True)``, the ``*_plus`` models) applies it in the first blocks only
(``masked_block``: 5 of 12 in RVT-S* / RVT-B*, the whole first stage, 10 of 12, in RVT-Ti*); here the
default is the first ``round(5 depth / 12)`` blocks (5 of 12, 2 of the mini ViT's 4), ``attn_layers=``
chooses others. The official parameter is ``torch.Tensor(H, N, N)``, uninitialised memory (the model's
init does not touch it; a fresh large CPU allocation reads as zeros); here it starts at ``init`` (default
0: sigmoid 0.5). The official model has no class token (global average pooling); here W_p covers every
token of the sequence, prefix tokens included.

Other token counts (another image size, a Segmenter's window, whose encoder weights are loaded by
``models.segmenter.load_encoder_weights``): W_p is resized over the patch grid like position embeddings,
but bilinearly (``resize="interpolate"``; timm resamples position embeddings bicubically): the
patch-to-patch block as a function of the query's and the key's grid positions (interpolated over the key
grid, then over the query grid), the prefix rows and columns over the grid, the prefix-to-prefix block
kept. ``resize="crop"`` takes the top-left n x n block instead (the
language model: position t is position t at any length).

The logits are formed (B, H, N, N) - a product with the scale cannot go through SDPA's additive mask.
Masks: hidden entries get -inf before the softmax, so a causal model sees nothing from the future.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from timm.models import register_notrace_module
from torch import Tensor, nn

from ..checks import Bool, Choice, Int, Real
from ..pap import visible
from .base import HeadsAttention, is_proxy
from .registry import register_mechanism

__all__ = ["PositionAwareAttention", "resize_position_scale", "first_five_twelfths"]

RESIZE = ("interpolate", "crop")


def first_five_twelfths(depth: int) -> list[int]:
    """The official RVT-S* / RVT-B* blocks (``masked_block=5`` of 12), scaled: the first round(5 depth / 12)
    (at least one)."""
    return list(range(max(1, round(5 * depth / 12))))


def _grid(n_patches: int, what: str) -> int:
    g = math.isqrt(n_patches)
    if g * g != n_patches:
        raise ValueError(f"PositionAwareAttention: {what} has {n_patches} patch tokens, not a square grid; "
                         "use resize='crop' or num_prefix_tokens to match the sequence")
    return g


def _resize_grid(x: Tensor, g0: int, g1: int) -> Tensor:
    """``(..., g0*g0)`` -> ``(..., g1*g1)``: bilinear over the grid of the last dimension."""
    lead = x.shape[:-1]
    y = F.interpolate(x.reshape(-1, 1, g0, g0), size=(g1, g1), mode="bilinear", align_corners=False)
    return y.reshape(*lead, g1 * g1)


def resize_position_scale(w: Tensor, n: int, num_prefix_tokens: int = 1, mode: str = "interpolate") -> Tensor:
    """W_p ``(H, N0, N0)`` for a sequence of ``n`` tokens (see the module docstring)."""
    n0 = w.shape[-1]
    if n == n0:
        return w
    if n == 0:  # no tokens: no scales (empty in, empty out)
        return w[..., :0, :0]
    if mode == "crop":
        if n > n0:
            raise ValueError(f"PositionAwareAttention: built for {n0} tokens, got {n} "
                             "(resize='crop' can only shorten)")
        return w[..., :n, :n]
    p = num_prefix_tokens
    g0, g1 = _grid(n0 - p, "the built sequence"), _grid(n - p, "the input")
    pp = w[:, p:, p:]  # (H, g0^2 queries, g0^2 keys)
    pp = _resize_grid(pp, g0, g1)  # over the key grid
    pp = _resize_grid(pp.transpose(-1, -2), g0, g1).transpose(-1, -2)  # over the query grid
    rows = _resize_grid(w[:, :p, p:], g0, g1)  # prefix queries -> patch keys
    cols = _resize_grid(w[:, p:, :p].transpose(-1, -2), g0, g1).transpose(-1, -2)
    top = torch.cat([w[:, :p, :p], rows], dim=-1)
    return torch.cat([top, torch.cat([cols, pp], dim=-1)], dim=-2)


# FX: the resize branches on the sequence length; one leaf call.
torch.fx.wrap("resize_position_scale")


# a leaf for timm's FX feature extraction (the token count decides whether W_p is resized, the mask its dtype)
@register_notrace_module
class PositionAwareAttention(HeadsAttention):
    """Position-aware attention scaling: ``softmax((Q K^T / sqrt D) * sigmoid(W_p)) V``.

    Args (besides timm's):
        num_tokens: N, the sequence length W_p is built for (class token included).
        num_prefix_tokens: tokens before the patch grid (timm's class token: 1), kept apart when resizing.
        resize: ``"interpolate"`` (bilinear over the patch grid, as position embeddings) or ``"crop"``.
        init: the initial value of every entry of W_p (0: every logit scaled by 0.5 at the start).
        symmetric: True: W_Q = W_K.
    """

    parameter_constraints = {**HeadsAttention.parameter_constraints, "num_tokens": Int(min=1),
                             "num_prefix_tokens": Int(min=0),
                             "resize": Choice(tuple(RESIZE)), "init": Real(),
                             "symmetric": Bool()}

    def __init__(self, dim: int, num_heads: int = 8, *args: Any, num_tokens: int = 197,
                 num_prefix_tokens: int = 1, resize: str = "interpolate", init: float = 0.0,
                 symmetric: bool = False, **kwargs: Any) -> None:
        self.validate_options(num_tokens=num_tokens, num_prefix_tokens=num_prefix_tokens, resize=resize,
                              init=init, symmetric=symmetric)
        self.projections = ("k", "v") if symmetric else ("q", "k", "v")
        super().__init__(dim, num_heads, *args, **kwargs)
        dd = {"device": self.proj.weight.device, "dtype": self.proj.weight.dtype}
        self.position_scale = nn.Parameter(torch.full((num_heads, num_tokens, num_tokens), float(init), **dd))
        self.num_tokens, self.num_prefix_tokens = num_tokens, num_prefix_tokens
        self.resize, self.init = resize, init
        self.symmetric = symmetric

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        q, k, v = qkv["q"], qkv["k"], qkv["v"]
        n = q.shape[-2]
        w = self.position_scale.to(q.dtype)
        if is_proxy(q) or n != self.num_tokens:
            w = resize_position_scale(w, n, self.num_prefix_tokens, self.resize)
        logits = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5) * torch.sigmoid(w)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                logits = logits.masked_fill(~attn_mask, float("-inf"))
            else:
                logits = logits + attn_mask
                logits = logits.masked_fill(~visible(attn_mask), float("-inf"))
        if is_causal:
            future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
            logits = logits.masked_fill(future, float("-inf"))
        attn = self.attn_drop(torch.softmax(logits, dim=-1))
        return attn @ v

    def extra_repr(self) -> str:
        return (f"num_tokens={self.num_tokens}, num_prefix_tokens={self.num_prefix_tokens}, "
                f"resize={self.resize!r}, init={self.init}, symmetric={self.symmetric}")


register_mechanism(
    "rvt", PositionAwareAttention, dict(num_prefix_tokens=1, resize="interpolate", init=0.0),
    # the LM builds W_p at its context length (models/lm.py passes num_tokens)
    task_defaults={"lm": dict(num_prefix_tokens=0, resize="crop")},
    layers={"vision": first_five_twelfths, "lm": first_five_twelfths},
    description="RVT position-aware attention scaling softmax((Q K^T / sqrt D) * sigmoid(W_p)) V, W_p per "
                "head N x N (first 5 of 12 blocks)",
)
