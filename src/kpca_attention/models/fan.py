"""FAN-style ViTs (Zhou et al., ICML 2022) and RPC-FAN (the RPC paper's appendix E.7, Tables 9-10), registered
in timm: one explicit ``@register_model`` function per name.

* ``fan_vit_<size>``: timm's ``VisionTransformer`` whose blocks' MLP is FAN's channel processing
  (:class:`~kpca_attention.attention.fan.FANChannelMLP`, channel groups = heads) with layer scale 1.0 (FAN's
  ``eta``); tiny = FAN-ViT-Tiny's width, depth and heads (192, 12, 4), mini = the mini ViT (64, 4, 4).
* ``rpc_fan_vit_<size>``: the same with RPC-Attention in the first block's token attention (4 iterations,
  lambda 4, the official threshold; ``attn_kwargs=`` overrides the RPC options, ``attn_layers=`` the blocks,
  ``rpc_symmetric=False`` gives RPC with queries); the other blocks keep ordinary attention with queries.
* ``fan_symvit_<size>`` and ``rpc_fan_symvit_<size>``: the same two with symmetric attention (keys only) in
  every block - the pair the RPC paper compares in Tables 9-10 (appendix E.7: "We use the FAN-ViT-tiny
  (FAN-tiny) variant with a symmetric attention for training"; RPC-FAN replaces the first layer's attention).
  ``rpc_fan_vit`` against ``fan_vit`` changes two things (PAP and symmetric attention in block 1); these one.

FAN-style, not FAN: the patch embedding is timm's linear patchify (FAN: four strided 3x3 conv + BN), the
position embedding is timm's learned one with a class token read by the head (FAN: Fourier position
encoding and two CaiT class-attention blocks at the end). The block - token self-attention, then the
attentional channel MLP - is FAN's.
"""

from __future__ import annotations

import functools
from typing import Any

from timm.layers import Attention
from timm.models import generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer

from ..attention import SymmetricAttention, configure, get_mechanism, replace_attention
from ..attention.fan import FANChannelMLP
from .vit import create_vit, vit_cfg

__all__ = ["FAN_MODELS", "FAN_SIZES", "FAN_HEADS", "build_fan_vit"]

#: the sizes FAN models are registered in (keys of :data:`~.vit.ARCHS`)
FAN_SIZES: tuple[str, ...] = ("mini_patch4_28", "tiny_patch16_224")
#: heads (token attention and channel groups) per size: FAN-ViT-Tiny has 4 (fan_tiny_12_p16_224)
FAN_HEADS: dict[str, int] = {"mini_patch4_28": 4, "tiny_patch16_224": 4}
FAN_MODELS: tuple[str, ...] = tuple(f"{fam}_{size}" for fam in ("fan_vit", "rpc_fan_vit", "fan_symvit",
                                                                "rpc_fan_symvit")
                                    for size in FAN_SIZES)

default_cfgs = generate_default_cfgs({n: vit_cfg(n) for n in FAN_MODELS})


def _rpc_swap(model: VisionTransformer, blocks: Any, symmetric: bool, attn_kwargs: dict[str, Any]) -> Any:
    layer = get_mechanism("rpc").layer_class("vision", symmetric, **attn_kwargs)
    model.rpc_blocks = replace_attention(model, layer, blocks)  # recorded for reports and checkpoints
    return model


def build_fan_vit(variant: str, size: str, pretrained: bool = False, rpc: bool = False,
                  attn_kwargs: dict[str, Any] | None = None, attn_layers: Any = "first",
                  rpc_symmetric: bool = True, symmetric: bool = False, **kwargs: Any) -> VisionTransformer:
    """A FAN-style ViT (``rpc``: RPC-Attention in ``attn_layers``, default the first block; ``symmetric``:
    symmetric attention in every other block, as the RPC paper's FAN-tiny)."""
    heads = kwargs.pop("num_heads", FAN_HEADS[size])
    kwargs.setdefault("init_values", 1.0)
    prefix = int(kwargs.get("class_token", True)) + kwargs.get("reg_tokens", 0)
    mlp = configure(FANChannelMLP, num_heads=heads, num_prefix_tokens=prefix)
    post = functools.partial(_rpc_swap, blocks=attn_layers, symmetric=rpc_symmetric,
                             attn_kwargs=dict(attn_kwargs or {})) if rpc else None
    if not rpc and (attn_kwargs or attn_layers != "first"):
        raise TypeError(f"{variant}: attn_kwargs / attn_layers apply to the RPC-FAN models only")
    if symmetric and not rpc_symmetric:
        raise TypeError(f"{variant}: rpc_symmetric=False (RPC with queries) in a symmetric FAN; use the "
                        "rpc_fan_vit models")
    attention = SymmetricAttention if symmetric else Attention
    model = create_vit(variant, pretrained, attention, post, mlp_layer=mlp, num_heads=heads, **kwargs)
    model.attn_mechanism = "rpc_fan" if rpc else "fan"
    return model


@register_model
def fan_vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """FAN-style ViT (channel-attention MLP), size mini_patch4_28."""
    return build_fan_vit("fan_vit_mini_patch4_28", "mini_patch4_28", pretrained, **kwargs)


@register_model
def fan_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """FAN-style ViT (FAN-ViT-Tiny's width, depth and heads), size tiny_patch16_224."""
    return build_fan_vit("fan_vit_tiny_patch16_224", "tiny_patch16_224", pretrained, **kwargs)


@register_model
def rpc_fan_vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """RPC-FAN: RPC-Attention (4 iterations, lambda 4) in the first block, size mini_patch4_28."""
    return build_fan_vit("rpc_fan_vit_mini_patch4_28", "mini_patch4_28", pretrained, rpc=True, **kwargs)


@register_model
def rpc_fan_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """RPC-FAN: RPC-Attention (4 iterations, lambda 4) in the first block, size tiny_patch16_224."""
    return build_fan_vit("rpc_fan_vit_tiny_patch16_224", "tiny_patch16_224", pretrained, rpc=True, **kwargs)


@register_model
def fan_symvit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """FAN-style ViT with symmetric attention in every block (the RPC paper's FAN-tiny), size
    mini_patch4_28."""
    return build_fan_vit("fan_symvit_mini_patch4_28", "mini_patch4_28", pretrained, symmetric=True,
                         **kwargs)


@register_model
def fan_symvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """FAN-style ViT with symmetric attention in every block (the RPC paper's FAN-tiny), size
    tiny_patch16_224."""
    return build_fan_vit("fan_symvit_tiny_patch16_224", "tiny_patch16_224", pretrained, symmetric=True,
                         **kwargs)


@register_model
def rpc_fan_symvit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """RPC-FAN as the RPC paper trains it: symmetric FAN with RPC-Attention (4 iterations, lambda 4) in the
    first block, size mini_patch4_28."""
    return build_fan_vit("rpc_fan_symvit_mini_patch4_28", "mini_patch4_28", pretrained, rpc=True,
                         symmetric=True, **kwargs)


@register_model
def rpc_fan_symvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """RPC-FAN as the RPC paper trains it: symmetric FAN with RPC-Attention (4 iterations, lambda 4) in the
    first block, size tiny_patch16_224."""
    return build_fan_vit("rpc_fan_symvit_tiny_patch16_224", "tiny_patch16_224", pretrained, rpc=True,
                         symmetric=True, **kwargs)
