"""FAN-style ViTs (Zhou et al., ICML 2022) and RPC-FAN (the RPC paper's appendix E.7, Tables 9-10), registered
in timm: one explicit ``@register_model`` function per name.

* ``fan_vit_<size>``: timm's ``VisionTransformer`` whose blocks' MLP is FAN's channel processing
  (:class:`~kpca_attention.attention.fan.FANChannelMLP`, channel groups = heads) with layer scale 1.0 (FAN's
  ``eta``); tiny = FAN-ViT-Tiny's width, depth and heads (192, 12, 4), mini = the mini ViT (64, 4, 4).
* ``rpc_fan_vit_<size>``: the same with RPC-Attention in the first block's token attention (4 iterations,
  lambda 4, the official threshold; ``attn_kwargs=`` overrides the RPC options, ``attn_layers=`` the blocks,
  ``rpc_symmetric=False`` gives RPC with queries).

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

from ..attention import configure, get_mechanism, replace_attention
from ..attention.fan import FANChannelMLP
from .vit import create_vit, vit_cfg

__all__ = ["FAN_MODELS", "FAN_SIZES", "FAN_HEADS", "build_fan_vit"]

#: the sizes FAN models are registered in (keys of :data:`~.vit.ARCHS`)
FAN_SIZES: tuple[str, ...] = ("mini_patch4_28", "tiny_patch16_224")
#: heads (token attention and channel groups) per size: FAN-ViT-Tiny has 4 (fan_tiny_12_p16_224)
FAN_HEADS: dict[str, int] = {"mini_patch4_28": 4, "tiny_patch16_224": 4}
FAN_MODELS: tuple[str, ...] = tuple(f"{fam}_{size}" for fam in ("fan_vit", "rpc_fan_vit")
                                    for size in FAN_SIZES)

default_cfgs = generate_default_cfgs({n: vit_cfg(n) for n in FAN_MODELS})


def _rpc_swap(model: VisionTransformer, blocks: Any, symmetric: bool, attn_kwargs: dict[str, Any]) -> Any:
    layer = get_mechanism("rpc").layer_class("vision", symmetric, **attn_kwargs)
    model.rpc_blocks = replace_attention(model, layer, blocks)  # recorded for reports and checkpoints
    return model


def build_fan_vit(variant: str, size: str, pretrained: bool = False, rpc: bool = False,
                  attn_kwargs: dict[str, Any] | None = None, attn_layers: Any = "first",
                  rpc_symmetric: bool = True, **kwargs: Any) -> VisionTransformer:
    """A FAN-style ViT (``rpc``: RPC-Attention in ``attn_layers``, default the first block)."""
    heads = kwargs.pop("num_heads", FAN_HEADS[size])
    kwargs.setdefault("init_values", 1.0)
    prefix = int(kwargs.get("class_token", True)) + kwargs.get("reg_tokens", 0)
    mlp = configure(FANChannelMLP, num_heads=heads, num_prefix_tokens=prefix)
    post = functools.partial(_rpc_swap, blocks=attn_layers, symmetric=rpc_symmetric,
                             attn_kwargs=dict(attn_kwargs or {})) if rpc else None
    if not rpc and (attn_kwargs or attn_layers != "first"):
        raise TypeError(f"{variant}: attn_kwargs / attn_layers apply to the RPC-FAN models only")
    model = create_vit(variant, pretrained, Attention, post, mlp_layer=mlp, num_heads=heads, **kwargs)
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
