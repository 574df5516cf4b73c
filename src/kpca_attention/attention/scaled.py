"""Scaled Attention (paper Remark 3, appendix E.1): ``A (I - S) V`` with a learned S."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import Choice
from ..pap import visible
from .base import HeadsAttention, is_proxy
from .registry import register_mechanism

__all__ = ["ScaledAttention"]


def _masked_scale(s: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
    """Scaled Attention's learned S ``(H, N, N)`` with the mask of A, so that S V brings in nothing A
    may not see (padding, future): zero where ``attn_mask`` hides a key, or above the diagonal."""
    if is_causal:
        s = s.tril()
    if attn_mask is not None:
        s = torch.where(visible(attn_mask), s, 0.0)
    return s


# FX: timm's VisionTransformer.forward takes attn_mask and is_causal, so a traced graph sees them as
# inputs; the branches on them run when the graph runs.
torch.fx.wrap("_masked_scale")


class ScaledAttention(HeadsAttention):
    """Scaled Attention (paper Remark 3, appendix E.1): ``A (I - S) V`` with A = softmax(Q K^T / sqrt(D)).

    Args (besides timm's):
        mode: ``"scalar"``: S = alpha * A_sym with A_sym = softmax(K K^T / sqrt(D)) and one learned
            alpha per layer (init 0); ``"matrix"``: a learned S of shape (H, N, N) (init 0), which
            fixes the number of tokens.
        num_tokens: N, required by ``mode="matrix"``.

    Both modes start as ordinary attention (S = 0). Computed without forming A:
    ``A (I - S) V = SDPA(Q, K, V - S V)``, where ``S V`` is ``S @ V`` or ``alpha * SDPA(K, K, V)``.
    Masks (``attn_mask``, ``is_causal``) apply to A_sym and, in matrix mode, to the learned S as well
    (entries that A may not attend to are zeroed), so S V brings in no hidden or future token.
    """

    MODES = ("scalar", "matrix")
    parameter_constraints = {
        **HeadsAttention.parameter_constraints,
        "mode": Choice(tuple(MODES)),
    }

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args: Any,
        mode: Literal["scalar", "matrix"] = "scalar",
        num_tokens: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        self.validate_options(mode=mode)
        self.mode = mode
        self.num_tokens = num_tokens
        dd = {"device": self.proj.weight.device, "dtype": self.proj.weight.dtype}  # timm's device=, dtype=
        if mode == "matrix":
            if num_tokens is None or num_tokens < 1:
                raise ValueError(
                    "ScaledAttention(mode='matrix') needs num_tokens >= 1 (the fixed sequence length)"
                )
            self.scale_s = nn.Parameter(torch.zeros(num_heads, num_tokens, num_tokens, **dd))
        else:
            self.alpha = nn.Parameter(torch.zeros(1, **dd))

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        q, k, v = qkv["q"], qkv["k"], qkv["v"]
        if self.mode == "matrix":
            n = v.shape[-2]
            if not is_proxy(n) and n != self.num_tokens:
                raise ValueError(
                    f"ScaledAttention(mode='matrix') was built for {self.num_tokens} tokens, got {n}"
                )
            sv = _masked_scale(self.scale_s.to(v.dtype), attn_mask, is_causal) @ v
        else:
            a_sym_v = F.scaled_dot_product_attention(k, k, v, attn_mask=attn_mask, is_causal=is_causal)
            sv = self.alpha * a_sym_v
        return F.scaled_dot_product_attention(
            q, k, v - sv, attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.dropout_p
        )

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, num_tokens={self.num_tokens}"


register_mechanism("scaled", ScaledAttention, dict(mode="scalar"), symmetric_ok=False,
                   description="Scaled Attention A (I - S) V, S = alpha A_sym (mode='scalar')")
