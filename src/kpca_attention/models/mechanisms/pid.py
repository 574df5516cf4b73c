"""PIDformer (PID-controlled attention) as timm models, one ``@register_model`` function per name.

The names, forms and sizes, and the builders called here: :mod:`kpca_attention.models.family`; the layer:
:mod:`kpca_attention.attention.pid`.
"""

from __future__ import annotations

from typing import Any

from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer

from ..family import family_default_cfgs, family_segmenter, family_vit
from ..segmenter import Segmenter

default_cfgs = family_default_cfgs("pid")


@register_model
def pid_vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """PIDformer (PID-controlled attention), size mini_patch4_28."""
    return family_vit("pid", False, "mini_patch4_28", pretrained, **kwargs)


@register_model
def pid_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """PIDformer (PID-controlled attention), size mini_patch4_32."""
    return family_vit("pid", False, "mini_patch4_32", pretrained, **kwargs)


@register_model
def pid_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """PIDformer (PID-controlled attention), size tiny_patch16_224."""
    return family_vit("pid", False, "tiny_patch16_224", pretrained, **kwargs)


@register_model
def segmenter_pid_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on pid_vit_mini_patch4_32."""
    return family_segmenter("pid", False, "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_pid_vit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on pid_vit_tiny_patch16_224."""
    return family_segmenter("pid", False, "tiny_patch16_512", pretrained, **kwargs)


@register_model
def pid_symvit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """PIDformer (PID-controlled attention) (symmetric, W_Q = W_K), size mini_patch4_28."""
    return family_vit("pid", True, "mini_patch4_28", pretrained, **kwargs)


@register_model
def pid_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """PIDformer (PID-controlled attention) (symmetric, W_Q = W_K), size mini_patch4_32."""
    return family_vit("pid", True, "mini_patch4_32", pretrained, **kwargs)


@register_model
def pid_symvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """PIDformer (PID-controlled attention) (symmetric, W_Q = W_K), size tiny_patch16_224."""
    return family_vit("pid", True, "tiny_patch16_224", pretrained, **kwargs)


@register_model
def segmenter_pid_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on pid_symvit_mini_patch4_32."""
    return family_segmenter("pid", True, "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_pid_symvit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter on pid_symvit_tiny_patch16_224."""
    return family_segmenter("pid", True, "tiny_patch16_512", pretrained, **kwargs)
