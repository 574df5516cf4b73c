"""KDE attention as timm models, one ``@register_model`` function per name.

The names, forms and sizes, and the builders called here: :mod:`kpca_attention.models.family`; the layer:
:mod:`kpca_attention.attention.kde`.
"""

from __future__ import annotations

from typing import Any

from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer

from ..family import family_default_cfgs, family_segmenter, family_vit
from ..segmenter import Segmenter

default_cfgs = family_default_cfgs("kde")


@register_model
def kde_vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """KDE attention (unit-norm keys), size mini_patch4_28."""
    return family_vit("kde", False, "mini_patch4_28", pretrained, **kwargs)


@register_model
def kde_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """KDE attention (unit-norm keys), size mini_patch4_32."""
    return family_vit("kde", False, "mini_patch4_32", pretrained, **kwargs)


@register_model
def kde_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """KDE attention (unit-norm keys), size tiny_patch16_224."""
    return family_vit("kde", False, "tiny_patch16_224", pretrained, **kwargs)


@register_model
def segmenter_kde_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on kde_vit_mini_patch4_32."""
    return family_segmenter("kde", False, "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_kde_vit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on kde_vit_tiny_patch16_224."""
    return family_segmenter("kde", False, "tiny_patch16_512", pretrained, **kwargs)
