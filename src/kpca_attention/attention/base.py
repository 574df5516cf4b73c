"""The shared base of the attention mechanisms: :class:`HeadsAttention` (timm's constructor, projections
to heads, qk-norm, the q/k/v/z hook points, the output projection) and the options table (each
mechanism's ``parameter_constraints``, rows of :mod:`kpca_attention.checks`, as scikit-learn's
``_parameter_constraints``).

A new mechanism is one module: a subclass of :class:`HeadsAttention` that lists its options in
``parameter_constraints`` (checked by :meth:`HeadsAttention.validate_options` before anything is built)
and implements ``attend(qkv, attn_mask, is_causal)``. State carried across layers belongs to the model
that stacks the layers; the layer sees it through its forward's keyword arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..checks import Bool, Int
from ..pap import check_options
from ..pap.inputs import broadcasts_to, merge_masks
from .hooks import HookPoint

__all__ = ["HeadsAttention", "QueryOptionalAttention", "PapOption", "is_proxy", "fresh_or_inplace_add"]


def is_proxy(x: object) -> bool:
    """True for an FX symbolic-tracing proxy: its shape is no concrete number to check."""
    return isinstance(x, torch.fx.Proxy)


def fresh_or_inplace_add(out: Tensor, other: Tensor, alpha: float) -> Tensor:
    """``out + alpha * other`` in one pass: into ``out`` itself when nothing records it (no gradient, not
    traced; an attention output that SDPA's backward keeps must not change), else into a new tensor."""
    if is_proxy(out) or out.requires_grad:
        return torch.add(out, other, alpha=alpha)
    return out.add_(other, alpha=alpha)


@dataclass(frozen=True)
class PapOption:
    """A constraints-table row (:mod:`kpca_attention.checks`) for one of PAP's scalar options (``n_iter``,
    ``lam``, ``threshold``, ``mu_dim``): checked by :func:`kpca_attention.pap.check_options`, the check
    :func:`~kpca_attention.pap.pap` itself runs. ``name`` is ``"<class>: <option>"``."""

    def __call__(self, value: Any, name: str) -> Any:
        where, _, option = name.rpartition(": ")
        check_options(**{option: value}, where=where or "pap")
        return value


class HeadsAttention(nn.Module):
    """The shared base of every mechanism: projections to heads, qk-norm, hook points, output projection.

    A mechanism is a subclass that sets :attr:`projections`, adds its entries to
    :attr:`parameter_constraints` and implements :meth:`attend` on the per-head ``{"q"?, "k", "v"}``.
    """

    #: names of the input projections this layer has, in the order they are stacked
    projections: tuple[str, ...] = ("q", "k", "v")
    #: attribute values that put the parts this layer computes without gradient into the graph, outputs
    #: unchanged - what an adaptive attack sets (:func:`.adaptive.adaptive_gradients`)
    adaptive_options: ClassVar[dict[str, Any]] = {}
    #: the constructor options a mechanism checks, by name: rows of :mod:`kpca_attention.checks`
    #: (``Int``, ``Real``, ``Bool``, ``Choice``) or :class:`PapOption`; subclasses extend this table
    parameter_constraints: ClassVar[dict[str, Callable[[Any, str], Any]]] = {
        "dim": Int(min=1),
        "num_heads": Int(min=1),
    }

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: Callable[..., nn.Module] | None = None,
        device: Any = None,
        dtype: Any = None,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        gated: bool = False,
        depth: int = 0,
    ) -> None:
        super().__init__()
        # timm's Attention takes these too; only their defaults are supported here. An unknown
        # keyword is a TypeError (not swallowed), so a misspelt option of configure() is caught.
        del depth  # timm's block index, used by none of these layers
        self.validate_options(dim=dim, num_heads=num_heads)
        if gated or dim_out not in (None, dim) or attn_head_dim not in (None, dim // max(num_heads, 1)):
            raise ValueError(
                f"{type(self).__name__} supports timm's attn_head_dim, dim_out and gated only at their "
                f"defaults (got attn_head_dim={attn_head_dim}, dim_out={dim_out}, gated={gated})"
            )
        if dim % num_heads != 0:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("norm_layer must be given when qk_norm or scale_norm is True")
        dd = {"device": device, "dtype": dtype}
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.attn_dim = dim
        in_proj = nn.Linear(dim, len(self.projections) * dim, bias=qkv_bias, **dd)
        # timm's name for the fused projection is ``qkv``; the symmetric one holds only K and V.
        self.add_module("".join(self.projections), in_proj)
        has_q = "q" in self.projections
        self.q_norm = norm_layer(self.head_dim, **dd) if qk_norm and has_q else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim, **dd) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        #: the heads' outputs ``(B, H, N, D)``, before they are merged and projected (TransformerLens's
        #: ``hook_z``); the attention pattern is not materialised (SDPA), see :mod:`.hooks`
        self.hook_z = HookPoint()

    @classmethod
    def validate_options(cls, **values: Any) -> None:
        """Check ``values`` against :attr:`parameter_constraints` (names it lacks are not checked)."""
        for name, value in values.items():
            cls.parameter_constraints[name](value, f"{cls.__name__}: {name}")

    @property
    def in_proj(self) -> nn.Linear:
        return getattr(self, "".join(self.projections))

    def split_heads(self, x: Tensor) -> dict[str, Tensor]:
        """``(B, N, C)`` -> ``{"q"?, "k", "v"}`` each ``(B, H, N, D)``, normed and hooked."""
        b, n, _ = x.shape
        parts = self.in_proj(x).reshape(b, n, len(self.projections), self.num_heads, self.head_dim)
        parts = parts.permute(2, 0, 3, 1, 4)  # (S, B, H, N, D); indexed, as FX cannot iterate a proxy
        out = {name: parts[i] for i, name in enumerate(self.projections)}
        out["k"] = self.hook_k(self.k_norm(out["k"]))
        out["q"] = self.hook_q(self.q_norm(out["q"])) if "q" in out else self.hook_q(out["k"])
        out["v"] = self.hook_v(out["v"])
        return out

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        raise NotImplementedError

    def check_inputs(self, x: Tensor, attn_mask: Tensor | None,
                     is_causal: bool) -> tuple[Tensor | None, bool]:
        """A ValueError for an ``x`` that is not ``(B, N, C)`` or a mask :meth:`check_mask` refuses; the
        ``(attn_mask, is_causal)`` to attend with: a mask given with ``is_causal`` is combined with the
        causal mask (both apply; SDPA itself refuses the pair), except a (B, N) key-padding mask (the
        layer's own)."""
        if not is_proxy(x) and (x.dim() != 3 or x.shape[-1] != self.attn_dim):
            raise ValueError(
                f"{type(self).__name__}: x must be (B, N, {self.attn_dim}), got {tuple(x.shape)}"
            )
        b, n, _ = x.shape
        if attn_mask is not None and not is_proxy(attn_mask):
            self.check_mask(attn_mask, b, n)
            if is_causal and not self.is_key_padding(attn_mask, b, n):
                return merge_masks(attn_mask, is_causal, n, attn_mask.device)
        return attn_mask, is_causal

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """``x (B, N, C)`` -> ``(B, N, C)``; ``attn_mask`` an SDPA mask broadcastable to (B, H, N, N) (with
        ``is_causal``: both apply)."""
        attn_mask, is_causal = self.check_inputs(x, attn_mask, is_causal)
        b, n, _ = x.shape
        out = self.hook_z(self.attend(self.split_heads(x), attn_mask, is_causal))  # (B, H, N, D)
        out = self.norm(out.transpose(1, 2).reshape(b, n, self.attn_dim))
        return self.proj_drop(self.proj(out))

    @property
    def dropout_p(self) -> float:
        return self.attn_drop.p if self.training else 0.0

    #: whether the layer also takes a boolean key-padding mask (B, N) (True: keep the key)
    key_padding_masks: ClassVar[bool] = False

    def is_key_padding(self, mask: Tensor, b: int, n: int) -> bool:
        """Whether ``mask`` is read as a boolean key-padding mask (B, N) (layers that take one)."""
        return self.key_padding_masks and mask.dtype == torch.bool and tuple(mask.shape) == (b, n)

    def check_mask(self, mask: Tensor, b: int, n: int) -> None:
        """A ValueError naming ``attn_mask`` when it is not a bool or float mask broadcastable to
        (B, H, N, N) (or, where the layer takes one, a boolean (B, N) key-padding mask)."""
        name = type(self).__name__
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise ValueError(f"{name}: attn_mask must be bool (True: attend) or float (added to the logits), "
                             f"got {mask.dtype}")
        if self.is_key_padding(mask, b, n):
            return
        want = (b, self.num_heads, n, n)
        if not broadcasts_to(mask.shape, want):
            padding = ", or a boolean key-padding mask (B, N)" if self.key_padding_masks else ""
            raise ValueError(f"{name}: attn_mask of shape {tuple(mask.shape)} does not broadcast to "
                             f"(B, H, N, N) = {want}{padding}")


class QueryOptionalAttention(HeadsAttention):
    """A layer with queries (W_Q, W_K, W_V) or, with ``symmetric=True``, without (W_Q = W_K: a SymViT layer,
    A = softmax(K K^T / sqrt D)): the ``symmetric`` option of the mechanisms whose papers allow both."""

    parameter_constraints = {**HeadsAttention.parameter_constraints, "symmetric": Bool()}

    def __init__(self, dim: int, num_heads: int = 8, *args: Any, symmetric: bool = False,
                 **kwargs: Any) -> None:
        self.validate_options(symmetric=symmetric)
        self.projections = ("k", "v") if symmetric else ("q", "k", "v")
        super().__init__(dim, num_heads, *args, **kwargs)
        self.symmetric = symmetric
