"""NeuTRENO as timm models, one ``@register_model`` function per name.

The names, forms and sizes, and the builders called here: :mod:`kpca_attention.models.family`; the layer:
:mod:`kpca_attention.attention.neutreno`.
"""

from __future__ import annotations

from typing import Any

from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer

from ..family import family_default_cfgs, family_segmenter, family_vit
from ..segmenter import Segmenter

default_cfgs = family_default_cfgs("neutreno")


@register_model
def neutreno_vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """NeuTRENO, size mini_patch4_28."""
    return family_vit("neutreno", False, "mini_patch4_28", pretrained, **kwargs)


@register_model
def neutreno_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """NeuTRENO, size mini_patch4_32."""
    return family_vit("neutreno", False, "mini_patch4_32", pretrained, **kwargs)


@register_model
def neutreno_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """NeuTRENO, size tiny_patch16_224."""
    return family_vit("neutreno", False, "tiny_patch16_224", pretrained, **kwargs)


@register_model
def segmenter_neutreno_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on neutreno_vit_mini_patch4_32."""
    return family_segmenter("neutreno", False, "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_neutreno_vit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on neutreno_vit_tiny_patch16_224."""
    return family_segmenter("neutreno", False, "tiny_patch16_512", pretrained, **kwargs)


@register_model
def neutreno_symvit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """NeuTRENO (symmetric, W_Q = W_K), size mini_patch4_28."""
    return family_vit("neutreno", True, "mini_patch4_28", pretrained, **kwargs)


@register_model
def neutreno_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """NeuTRENO (symmetric, W_Q = W_K), size mini_patch4_32."""
    return family_vit("neutreno", True, "mini_patch4_32", pretrained, **kwargs)


@register_model
def neutreno_symvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """NeuTRENO (symmetric, W_Q = W_K), size tiny_patch16_224."""
    return family_vit("neutreno", True, "tiny_patch16_224", pretrained, **kwargs)


@register_model
def segmenter_neutreno_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on neutreno_symvit_mini_patch4_32."""
    return family_segmenter("neutreno", True, "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_neutreno_symvit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on neutreno_symvit_tiny_patch16_224."""
    return family_segmenter("neutreno", True, "tiny_patch16_512", pretrained, **kwargs)
