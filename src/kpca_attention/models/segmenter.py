"""Segmenter (Strudel et al., ICCV 2021) on this package's vision transformers, registered in timm.

A Segmenter is a ViT encoder whose patch tokens (the class token dropped) go to a decoder that gives
one logit map per class at patch resolution, upsampled bilinearly to the image size:

* :class:`LinearDecoder` - a linear layer per patch token (the paper's "linear" baseline);
* :class:`MaskTransformerDecoder` - the paper's mask transformer: the patch tokens (projected to the
  decoder width) and ``num_classes`` learned class embeddings go through ``decoder_layers`` (2)
  pre-norm transformer blocks (timm's ``Block``); the masks are the scalar products of the
  L2-normalised patch embeddings and class embeddings, followed by a LayerNorm over the classes.

It follows the official code (``rstrudel/segmenter``, ``segm/model/{segmenter,decoder}.py``): decoder width =
encoder width, ``width // 64`` heads, MLP ratio 4, dropout 0.1, no decoder drop path; truncated-normal 0.02
init. Images are padded on the bottom/right to a multiple of the patch size and the logits cropped back.
Images larger than the training window (``img_size``) are segmented by sliding windows of that size
(stride ``window_stride``, default the window: the official ADE20K setting) whose logits are averaged
where windows overlap, as the official ``inference``; smaller images pass directly (the encoder
interpolates its position embeddings, timm's ``dynamic_img_size``).

Names: ``segmenter_<encoder family>_<size>``, e.g. ``segmenter_rpc_symvit_tiny_patch16_512`` (DeiT-tiny
encoder at 512 px, the paper's ADE20K model) or ``segmenter_symvit_mini_patch4_32`` (the 64-wide mini encoder
at 32 px, for the embedded Fashion-MNIST scenes; ``img_size=48, in_chans=1`` adapt it). The encoder
families and their options are those of :mod:`kpca_attention.models.vit` (``rpc_iters``, ``rpc_lambda``,
``rpc_layers``, ... for ``rpc_*``; ``scaled=`` for ``scaled_vit``). Segmenter options: ``decoder``
(``"mask_transformer"`` | ``"linear"``), ``decoder_layers``, ``decoder_heads``, ``decoder_dropout``,
``decoder_drop_path``, ``window_stride``. The model takes normalised images; wrap it in
:class:`~kpca_attention.models.normalize.NormalizedModel` for [0, 1] inputs (``kpca_attention.train`` does).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import timm
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed, trunc_normal_
from timm.models import register_model
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from ..attention import PositionAwareAttention
from ..attention.rvt import resize_position_scale
from .vit import FAMILIES

__all__ = [
    "Segmenter",
    "LinearDecoder",
    "MaskTransformerDecoder",
    "SEGMENTATION_MODELS",
    "SEGMENTER_SIZES",
    "DECODERS",
    "create_segmenter",
    "load_encoder_weights",
    "create_registered_segmenter",
]

DECODERS: tuple[str, ...] = ("mask_transformer", "linear")

#: Segmenter size -> (encoder size in :data:`kpca_attention.models.vit.ARCHS`, training window in px)
SEGMENTER_SIZES: dict[str, tuple[str, int]] = {
    "tiny_patch16_512": ("tiny_patch16_224", 512),
    "small_patch16_512": ("small_patch16_224", 512),
    "base_patch16_512": ("base_patch16_224", 512),
    "mini_patch4_32": ("mini_patch4_32", 32),
}

def _init_linear_and_norm(module: nn.Module) -> None:
    """The official decoder init: truncated normal 0.02 on Linear weights, zero biases, LayerNorm 1/0."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class LinearDecoder(nn.Module):
    """Patch tokens ``(B, h*w, D)`` -> class logits ``(B, num_classes, h, w)`` by one linear layer."""

    def __init__(self, num_classes: int, embed_dim: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.head = nn.Linear(embed_dim, num_classes)
        self.apply(_init_linear_and_norm)

    def forward(self, tokens: Tensor, grid: tuple[int, int]) -> Tensor:
        h, w = grid
        logits = self.head(tokens)  # (B, h*w, K)
        return logits.transpose(1, 2).reshape(tokens.shape[0], self.num_classes, h, w)


class MaskTransformerDecoder(nn.Module):
    """Segmenter's mask transformer: patch tokens ``(B, h*w, D_enc)`` -> masks ``(B, num_classes, h, w)``.

    Args:
        num_classes: K, the number of learned class embeddings (and output masks).
        encoder_dim: width of the encoder's tokens.
        dim: decoder width (official: the encoder width).
        depth: transformer blocks (official: 2).
        num_heads: attention heads (official: ``dim // 64``).
        mlp_ratio: MLP hidden width / dim (official: 4).
        dropout: dropout on attention weights, projections and MLP (official: 0.1).
        drop_path: stochastic-depth rate of the last block, linear from 0 (official: 0).
    """

    def __init__(self, num_classes: int, encoder_dim: int, dim: int, depth: int = 2, num_heads: int = 1,
                 mlp_ratio: float = 4.0, dropout: float = 0.1, drop_path: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"decoder width {dim} is not a multiple of decoder_heads={num_heads}")
        self.num_classes = num_classes
        self.proj_dec = nn.Linear(encoder_dim, dim)
        rates = torch.linspace(0, drop_path, depth, device="cpu").tolist() if depth else []
        # timm's pre-norm Block is the official Block (qkv with bias, GELU MLP, dropout on attention
        # weights and both projections, drop path).
        self.blocks = nn.ModuleList([
            Block(dim, num_heads, mlp_ratio=mlp_ratio, qkv_bias=True, proj_drop=dropout, attn_drop=dropout,
                  drop_path=r)
            for r in rates
        ])
        self.cls_emb = nn.Parameter(torch.zeros(1, num_classes, dim))
        scale = dim ** -0.5
        self.proj_patch = nn.Parameter(scale * torch.randn(dim, dim))
        self.proj_classes = nn.Parameter(scale * torch.randn(dim, dim))
        self.decoder_norm = nn.LayerNorm(dim)
        self.mask_norm = nn.LayerNorm(num_classes)
        self.apply(_init_linear_and_norm)
        trunc_normal_(self.cls_emb, std=0.02)

    def no_weight_decay(self) -> set[str]:
        return {"cls_emb"}

    def forward(self, tokens: Tensor, grid: tuple[int, int]) -> Tensor:
        h, w = grid
        x = self.proj_dec(tokens)
        x = torch.cat((x, self.cls_emb.expand(x.shape[0], -1, -1)), dim=1)  # (B, h*w + K, dim)
        for blk in self.blocks:
            x = blk(x)
        x = self.decoder_norm(x)
        patches, classes = x[:, : -self.num_classes], x[:, -self.num_classes :]
        patches = F.normalize(patches @ self.proj_patch, dim=-1)
        classes = F.normalize(classes @ self.proj_classes, dim=-1)
        masks = self.mask_norm(patches @ classes.transpose(1, 2))  # (B, h*w, K)
        return masks.transpose(1, 2).reshape(x.shape[0], self.num_classes, h, w)


class Segmenter(nn.Module):
    """ViT encoder + decoder; ``forward(x)`` maps normalised images ``(B, C, H, W)`` to logits
    ``(B, num_classes, H, W)``.

    Args:
        encoder: a timm ``VisionTransformer`` built with ``num_classes=0`` (no head) and, for inputs of
            other sizes than ``img_size``, ``dynamic_img_size=True``.
        decoder: :class:`LinearDecoder` or :class:`MaskTransformerDecoder`.
        window_size: the training crop; larger inputs are segmented by sliding windows of this size.
        window_stride: stride of the sliding windows (default ``window_size``: no overlap, as the official
            ADE20K setting).
    """

    def __init__(self, encoder: VisionTransformer, decoder: nn.Module, num_classes: int, window_size: int,
                 window_stride: int | None = None) -> None:
        super().__init__()
        stride = window_size if window_stride is None else int(window_stride)
        if not 0 < stride <= window_size:
            raise ValueError(f"window_stride must be in 1..{window_size} (the window), got {window_stride}")
        self.encoder, self.decoder = encoder, decoder
        self.num_classes = num_classes
        patch = encoder.patch_embed.patch_size
        self.patch_size = (int(patch[0]), int(patch[1]))
        self.window_size, self.window_stride = int(window_size), stride

    def no_weight_decay(self) -> set[str]:
        enc = {f"encoder.{n}" for n in self.encoder.no_weight_decay()}
        dec = getattr(self.decoder, "no_weight_decay", lambda: set())()
        return enc | {f"decoder.{n}" for n in dec}

    def forward_window(self, x: Tensor) -> Tensor:
        """Logits of one window (any size; the encoder sees it padded to a multiple of the patch)."""
        h, w = x.shape[-2:]
        ph, pw = self.patch_size
        pad_h, pad_w = (-h) % ph, (-w) % pw
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))  # zero = the mean colour after normalisation
        tokens = self.encoder.forward_features(x)[:, self.encoder.num_prefix_tokens :]
        grid = (x.shape[-2] // ph, x.shape[-1] // pw)
        logits = self.decoder(tokens, grid)
        logits = F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return logits[..., :h, :w]

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4:
            raise ValueError(f"expected images (B, C, H, W), got shape {tuple(x.shape)}")
        h, w = x.shape[-2:]
        ws = self.window_size
        if h <= ws and w <= ws:
            return self.forward_window(x)
        return self._sliding_window(x)

    def _sliding_window(self, x: Tensor) -> Tensor:
        """Average of the logits of ``window_size`` windows at ``window_stride`` (the last window of a row /
        column flush with the border, as the official code); sides shorter than the window are padded."""
        ws, stride = self.window_size, self.window_stride
        h, w = x.shape[-2:]
        if h < ws or w < ws:
            x = F.pad(x, (0, max(ws - w, 0), 0, max(ws - h, 0)))
        hp, wp = x.shape[-2:]
        tops = sorted({*range(0, hp - ws, stride), hp - ws})
        lefts = sorted({*range(0, wp - ws, stride), wp - ws})
        logits = x.new_zeros(x.shape[0], self.num_classes, hp, wp)
        count = x.new_zeros(1, 1, hp, wp)
        for top in tops:
            for left in lefts:
                logits[..., top : top + ws, left : left + ws] += self.forward_window(
                    x[..., top : top + ws, left : left + ws])
                count[..., top : top + ws, left : left + ws] += 1
        return (logits / count)[..., :h, :w]


def create_segmenter(
    encoder_name: str,
    num_classes: int,
    img_size: int,
    *,
    decoder: str = "mask_transformer",
    decoder_layers: int = 2,
    decoder_heads: int | None = None,
    decoder_dropout: float = 0.1,
    decoder_drop_path: float = 0.0,
    window_stride: int | None = None,
    **encoder_kwargs: Any,
) -> Segmenter:
    """A :class:`Segmenter` on the timm encoder ``encoder_name`` (e.g. ``rpc_symvit_tiny_patch16_224``).

    ``encoder_kwargs`` go to ``timm.create_model`` (``in_chans``, ``drop_path_rate``, RPC options, ...);
    ``img_size`` is the training window; ``dynamic_img_size`` defaults to True.
    """
    if decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}; valid: {', '.join(DECODERS)}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if decoder_layers < 0:
        raise ValueError(f"decoder_layers must be >= 0, got {decoder_layers}")
    encoder_kwargs.setdefault("dynamic_img_size", True)
    # The decoder is initialised from a seed drawn before the encoder is built: the RPC encoders draw extra
    # random numbers when they swap their attention layers in, and Segmenter-SymViT and Segmenter-RPC-SymViT
    # built under one seed must still start from identical weights (encoder and decoder).
    decoder_seed = int(torch.randint(0, 2**62, (), device="cpu").item())  # cpu: also under a meta build
    encoder = timm.create_model(encoder_name, num_classes=0, img_size=img_size, **encoder_kwargs)
    dim = encoder.embed_dim
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(decoder_seed)
        if decoder == "linear":
            dec: nn.Module = LinearDecoder(num_classes, dim)
        else:
            heads = decoder_heads if decoder_heads is not None else max(1, dim // 64)
            dec = MaskTransformerDecoder(num_classes, dim, dim, depth=decoder_layers, num_heads=heads,
                                         dropout=decoder_dropout, drop_path=decoder_drop_path)
    return Segmenter(encoder, dec, num_classes, window_size=img_size, window_stride=window_stride)


def load_encoder_weights(model: Segmenter, weights: Mapping[str, Tensor] | str | os.PathLike) -> list[str]:
    """Initialise a Segmenter's encoder from a trained classifier (the Segmenter recipe starts from an
    ImageNet-trained ViT), e.g. the ``model.safetensors`` of a ``kpca_attention.train`` run.

    ``weights`` is a state dict (or a ``.safetensors`` file) of a timm ViT of the same family and width,
    optionally wrapped in ``NormalizedModel`` (keys ``model.*``; its ``mean``/``std`` are skipped). The
    classification head is dropped and the position embeddings are resampled (bicubic, timm's
    ``resample_abs_pos_embed``) to the encoder's patch grid, RVT's position scales W_p (bilinear, as the
    layer resizes them) to its sequence. The decoder is left as initialised.

    Returns:
        the encoder keys loaded (all of them).
    Raises:
        ValueError: naming the encoder keys missing from ``weights`` or of another shape.
    """
    if not isinstance(weights, Mapping):
        from safetensors.torch import load_file

        weights = load_file(str(weights))
    prefix = "model." if any(k.startswith("model.") for k in weights) else ""
    src = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    target = model.encoder.state_dict()
    missing = sorted(k for k in target if k not in src)
    if missing:
        raise ValueError(f"encoder weights lack {len(missing)} key(s), e.g. {missing[:3]}: not a ViT of this "
                         f"encoder's family and depth")
    new = {}
    for k, v in target.items():
        w = src[k]
        if k == "pos_embed" and w.shape != v.shape:
            n_prefix = model.encoder.num_prefix_tokens
            new_grid = model.encoder.patch_embed.grid_size
            w = resample_abs_pos_embed(w, new_size=list(new_grid), num_prefix_tokens=n_prefix)
        layer = model.encoder.get_submodule(k.rpartition(".")[0]) if "." in k else None
        if isinstance(layer, PositionAwareAttention) and k.endswith(".position_scale") and w.shape != v.shape:
            # RVT's W_p, per pair of tokens: resized to the window's sequence as the layer resizes it
            w = resize_position_scale(w, v.shape[-1], layer.num_prefix_tokens, layer.resize)
        if w.shape != v.shape:
            raise ValueError(f"encoder weight {k}: shape {tuple(w.shape)} in the checkpoint, "
                             f"{tuple(v.shape)} in the Segmenter (another width, patch size or channels?)")
        new[k] = w
    model.encoder.load_state_dict(new)
    return sorted(new)


# ----------------------------------------------------------------------------- registration


def _create(family: str, size: str, pretrained: bool, **kwargs: Any) -> Segmenter:
    """The Segmenter ``segmenter_<family>_<size>``: its encoder ``<family>_<encoder size>`` at the size's
    window (``img_size``), 150 classes (ADE20K) unless ``num_classes`` is given."""
    name = f"segmenter_{family}_{size}"
    enc_size, window = SEGMENTER_SIZES[size]
    if pretrained:
        raise ValueError(f"{name}: no pretrained weights exist; train it (kpca-attention train --preset "
                         "fmnist-seg-cpu / ade20k-segmenter) and load the checkpoint instead")
    for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):  # timm.create_model's
        kwargs.pop(key, None)
    if kwargs.get("features_only"):  # timm would hand it to the encoder, which then has no embed_dim
        raise ValueError(f"{name} is a dense-prediction model, not a feature backbone: features_only is for "
                         f"its encoder (timm.create_model('{family}_{enc_size}', features_only=True))")
    num_classes = kwargs.pop("num_classes", 150)
    img_size = kwargs.pop("img_size", window)
    return create_segmenter(f"{family}_{enc_size}", num_classes, img_size, **kwargs)


#: the builder of every registered Segmenter (public for :mod:`kpca_attention.models.family`)
create_registered_segmenter = _create


def _pairs() -> list[tuple[str, str]]:
    out = []
    for family, (enc_sizes, _) in FAMILIES.items():
        for size, (enc_size, _) in SEGMENTER_SIZES.items():
            if enc_size in enc_sizes:
                out.append((family, size))
    return out


SEGMENTATION_MODELS: tuple[str, ...] = tuple(f"segmenter_{f}_{s}" for f, s in _pairs())

# One function per registered name, as timm does (tests/test_models.py checks the set against
# SEGMENTATION_MODELS).


@register_model
def segmenter_symvit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a symvit_tiny_patch16_224 encoder, window 512 px."""
    return _create("symvit", "tiny_patch16_512", pretrained, **kwargs)


@register_model
def segmenter_symvit_small_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a symvit_small_patch16_224 encoder, window 512 px."""
    return _create("symvit", "small_patch16_512", pretrained, **kwargs)


@register_model
def segmenter_symvit_base_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a symvit_base_patch16_224 encoder, window 512 px."""
    return _create("symvit", "base_patch16_512", pretrained, **kwargs)


@register_model
def segmenter_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a symvit_mini_patch4_32 encoder, window 32 px."""
    return _create("symvit", "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_rpc_symvit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a rpc_symvit_tiny_patch16_224 encoder, window 512 px."""
    return _create("rpc_symvit", "tiny_patch16_512", pretrained, **kwargs)


@register_model
def segmenter_rpc_symvit_small_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a rpc_symvit_small_patch16_224 encoder, window 512 px."""
    return _create("rpc_symvit", "small_patch16_512", pretrained, **kwargs)


@register_model
def segmenter_rpc_symvit_base_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a rpc_symvit_base_patch16_224 encoder, window 512 px."""
    return _create("rpc_symvit", "base_patch16_512", pretrained, **kwargs)


@register_model
def segmenter_rpc_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a rpc_symvit_mini_patch4_32 encoder, window 32 px."""
    return _create("rpc_symvit", "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_scaled_vit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a scaled_vit_tiny_patch16_224 encoder, window 512 px."""
    return _create("scaled_vit", "tiny_patch16_512", pretrained, **kwargs)


@register_model
def segmenter_scaled_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a scaled_vit_mini_patch4_32 encoder, window 32 px."""
    return _create("scaled_vit", "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_rpc_vit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a rpc_vit_tiny_patch16_224 encoder, window 512 px."""
    return _create("rpc_vit", "tiny_patch16_512", pretrained, **kwargs)


@register_model
def segmenter_rpc_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a rpc_vit_mini_patch4_32 encoder, window 32 px."""
    return _create("rpc_vit", "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_rpc_symasym_vit_tiny_patch16_512(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a rpc_symasym_vit_tiny_patch16_224 encoder, window 512 px."""
    return _create("rpc_symasym_vit", "tiny_patch16_512", pretrained, **kwargs)


@register_model
def segmenter_rpc_symasym_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a rpc_symasym_vit_mini_patch4_32 encoder, window 32 px."""
    return _create("rpc_symasym_vit", "mini_patch4_32", pretrained, **kwargs)


@register_model
def segmenter_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> Segmenter:
    """Segmenter with a vit_mini_patch4_32 encoder, window 32 px."""
    return _create("vit", "mini_patch4_32", pretrained, **kwargs)
