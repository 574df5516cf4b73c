"""Twicing attention as timm models, one ``@register_model`` function per name.

The names, forms and sizes, and the builders called here: :mod:`kpca_attention.models.family`; the layer:
:mod:`kpca_attention.attention.twicing`.
"""

from __future__ import annotations

from typing import Any

from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer

from ..family import family_default_cfgs, family_segmenter, family_vit
from ..segmenter import Segmenter

default_cfgs = family_default_cfgs("twicing")


@register_model
def twicing_vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Twicing attention, size mini_patch4_28."""
    return family_vit("twicing", False, "mini_patch4_28", pretrained, **kwargs)


@register_model
def twicing_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Twicing attention, size mini_patch4_32."""
    return family_vit("twicing", False, "mini_patch4_32", pretrained, **kwargs)


@register_model
def twicing_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Twicing attention, size tiny_patch16_224."""
    return family_vit("twicing", False, "tiny_patch16_224", pretrained, **kwargs)


@register_model
def segmenter_twicing_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on twicing_vit_mini_patch4_32."""
    return family_segmenter("twicing", False, "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_twicing_vit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on twicing_vit_tiny_patch16_224."""
    return family_segmenter("twicing", False, "tiny_patch16_512", pretrained, **kwargs)


@register_model
def twicing_symvit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Twicing attention (symmetric, W_Q = W_K), size mini_patch4_28."""
    return family_vit("twicing", True, "mini_patch4_28", pretrained, **kwargs)


@register_model
def twicing_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Twicing attention (symmetric, W_Q = W_K), size mini_patch4_32."""
    return family_vit("twicing", True, "mini_patch4_32", pretrained, **kwargs)


@register_model
def twicing_symvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Twicing attention (symmetric, W_Q = W_K), size tiny_patch16_224."""
    return family_vit("twicing", True, "tiny_patch16_224", pretrained, **kwargs)


@register_model
def segmenter_twicing_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on twicing_symvit_mini_patch4_32."""
    return family_segmenter("twicing", True, "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_twicing_symvit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on twicing_symvit_tiny_patch16_224."""
    return family_segmenter("twicing", True, "tiny_patch16_512", pretrained, **kwargs)
