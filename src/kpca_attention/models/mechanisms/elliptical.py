"""Elliptical attention as timm models, one ``@register_model`` function per name.

The names, forms and sizes, and the builders called here: :mod:`kpca_attention.models.family`; the layer:
:mod:`kpca_attention.attention.elliptical`.
"""

from __future__ import annotations

from typing import Any

from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer

from ..family import family_default_cfgs, family_segmenter, family_vit
from ..segmenter import Segmenter

default_cfgs = family_default_cfgs("elliptical")


@register_model
def elliptical_vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Elliptical attention, size mini_patch4_28."""
    return family_vit("elliptical", False, "mini_patch4_28", pretrained, **kwargs)


@register_model
def elliptical_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Elliptical attention, size mini_patch4_32."""
    return family_vit("elliptical", False, "mini_patch4_32", pretrained, **kwargs)


@register_model
def elliptical_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Elliptical attention, size tiny_patch16_224."""
    return family_vit("elliptical", False, "tiny_patch16_224", pretrained, **kwargs)


@register_model
def segmenter_elliptical_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on elliptical_vit_mini_patch4_32."""
    return family_segmenter("elliptical", False, "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_elliptical_vit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on elliptical_vit_tiny_patch16_224."""
    return family_segmenter("elliptical", False, "tiny_patch16_512", pretrained, **kwargs)


@register_model
def elliptical_symvit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Elliptical attention (symmetric, W_Q = W_K), size mini_patch4_28."""
    return family_vit("elliptical", True, "mini_patch4_28", pretrained, **kwargs)


@register_model
def elliptical_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Elliptical attention (symmetric, W_Q = W_K), size mini_patch4_32."""
    return family_vit("elliptical", True, "mini_patch4_32", pretrained, **kwargs)


@register_model
def elliptical_symvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Elliptical attention (symmetric, W_Q = W_K), size tiny_patch16_224."""
    return family_vit("elliptical", True, "tiny_patch16_224", pretrained, **kwargs)


@register_model
def segmenter_elliptical_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on elliptical_symvit_mini_patch4_32."""
    return family_segmenter("elliptical", True, "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_elliptical_symvit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on elliptical_symvit_tiny_patch16_224."""
    return family_segmenter("elliptical", True, "tiny_patch16_512", pretrained, **kwargs)
