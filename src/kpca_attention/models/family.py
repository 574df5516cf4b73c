"""The robust-attention family as models: one registered mechanism name gives every model.

For a mechanism ``<m>`` of :mod:`kpca_attention.attention.registry` listed in :data:`FAMILY_MECHANISMS`,
its module in :mod:`kpca_attention.models.mechanisms` registers in timm (one explicit ``@register_model``
function per name, as timm does, each calling :func:`family_vit` / :func:`family_segmenter` here;
``tests/test_family_models.py`` checks the names):

* ``<m>_vit_<size>``: timm's ``VisionTransformer`` with the mechanism's layer (asymmetric, with queries);
* ``<m>_symvit_<size>``: the same with W_Q = W_K (SymViT), where the paper allows it;
* ``segmenter_<m>_vit_<size>`` / ``segmenter_<m>_symvit_<size>``: Segmenters on those encoders;

at the sizes :data:`FAMILY_SIZES` (``mini_patch4_28`` and ``tiny_patch16_224`` as the issue asks, and
``mini_patch4_32``, the encoder of the mini Segmenter). The causal LMs ``<m>_lm`` / ``<m>_symlm`` are
built by :func:`kpca_attention.models.lm.create_lm`.

Options of every entry point (besides timm's): ``attn_kwargs`` (a dict of the mechanism's options,
overriding its vision defaults, e.g. ``attn_kwargs={"lam": 0.4}``) and ``attn_layers`` (the blocks that
apply the mechanism: ``"all"``, ``"first"``, indices...; default the mechanism's). Blocks outside
``attn_layers`` compute plain softmax attention (symmetric in a SymViT): stateless mechanisms get timm's
``Attention`` / :class:`~kpca_attention.attention.SymmetricAttention` there (the mechanism is swapped into
the chosen blocks after timm's init, carrying the weights over, as the RPC models), stateful ones keep
their layer with ``applied=False`` so that it still records what later layers read.

Mechanisms with cross-layer state (``Mechanism.stateful``) are built on :class:`StatefulVisionTransformer`:
timm's ViT whose blocks are :class:`~kpca_attention.attention.StatefulBlocks` and whose
``forward_features`` / ``forward_intermediates`` thread one state per forward pass.
"""

from __future__ import annotations

import functools
from typing import Any

from timm.layers import Attention
from timm.models import generate_default_cfgs
from timm.models._features import feature_take_indices
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from ..attention import (
    StatefulBlock,
    StatefulBlocks,
    SymmetricAttention,
    get_mechanism,
    replace_attention,
    run_blocks,
)
from .segmenter import SEGMENTER_SIZES, Segmenter, create_registered_segmenter
from .vit import ARCHS, create_vit, vit_cfg

__all__ = [
    "check_attn_kwargs",
    "StatefulVisionTransformer",
    "FAMILY_SIZES",
    "FAMILY_MECHANISMS",
    "FAMILY_VISION_MODELS",
    "FAMILY_SEGMENTATION_MODELS",
    "build_family_vit",
    "family_vit",
    "family_segmenter",
    "family_names",
    "family_default_cfgs",
]

#: the ViT sizes every family mechanism is registered in (keys of :data:`~.vit.ARCHS`)
FAMILY_SIZES: tuple[str, ...] = ("mini_patch4_28", "mini_patch4_32", "tiny_patch16_224")

#: the mechanisms registered as models here -> whether the symmetric (SymViT) form is registered
FAMILY_MECHANISMS: dict[str, bool] = {
    "neutreno": True,
    "pid": True,
    "elliptical": True,
    "twicing": True,
    "kde": False,
    "rkde": False,
    "rvt": False,
}


class StatefulVisionTransformer(VisionTransformer):
    """timm's ``VisionTransformer`` whose blocks thread the cross-layer state (:mod:`~..attention.stateful`).

    The blocks are :class:`~kpca_attention.attention.StatefulBlock` (timm's ``Block``, same parameters) in a
    :class:`~kpca_attention.attention.StatefulBlocks`; ``forward_features`` and ``forward_intermediates``
    (hence ``features_only``) run them with one state per forward pass, also under gradient checkpointing.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("block_fn", StatefulBlock)
        super().__init__(**kwargs)
        self.blocks = StatefulBlocks(*self.blocks)

    def forward_features(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        x = self.norm_pre(self.patch_drop(self._pos_embed(self.patch_embed(x))))
        x, _ = run_blocks(self.blocks, x, attn_mask=attn_mask, is_causal=is_causal,
                          grad_checkpointing=self.grad_checkpointing)
        return self.norm(x)

    def forward_intermediates(  # noqa: C901  (timm's signature and output forms)
        self,
        x: Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        output_dict: bool = False,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Any:
        """timm's ``forward_intermediates`` (same arguments and output forms), the blocks run with state."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError("Output format must be one of NCHW or NLC.")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        b, _, height, width = x.shape
        x = self.norm_pre(self.patch_drop(self._pos_embed(self.patch_embed(x))))
        blocks = self.blocks[: max_index + 1] if stop_early else self.blocks
        x, intermediates = run_blocks(blocks, x, attn_mask=attn_mask, is_causal=is_causal, take=take_indices,
                                      grad_checkpointing=self.grad_checkpointing)
        if norm:
            intermediates = [self.norm(y) for y in intermediates]
        prefix_tokens = None
        if self.num_prefix_tokens:
            prefix_tokens = [y[:, : self.num_prefix_tokens] for y in intermediates]
            intermediates = [y[:, self.num_prefix_tokens :] for y in intermediates]
        if output_fmt == "NCHW":
            h, w = self.patch_embed.dynamic_feat_size((height, width))
            intermediates = [y.reshape(b, h, w, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]
        if output_dict:
            out: dict[str, Any] = {"image_intermediates": intermediates}
            if prefix_tokens is not None and return_prefix_tokens:
                out["image_intermediates_prefix"] = prefix_tokens
            if not intermediates_only:
                out["image_features"] = self.norm(x)
            return out
        if return_prefix_tokens and prefix_tokens is not None:
            intermediates = list(zip(intermediates, prefix_tokens, strict=True))
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates


# ----------------------------------------------------------------------------- builders

def _family(name: str, symmetric: bool) -> str:
    return f"{name}_{'symvit' if symmetric else 'vit'}"


def _plain_layer(symmetric: bool) -> type:
    return SymmetricAttention if symmetric else Attention


def _swap_in(model: VisionTransformer, layer: type, blocks: list[int], name: str,
             sized: tuple[str, ...] = ()) -> VisionTransformer:
    # sized: the layer's options that a per-token parameter (RVT's W_p, Scaled Attention's S) takes
    # from the built model's sequence: num_tokens and, where the layer has it, num_prefix_tokens
    counts = dict(num_tokens=model.patch_embed.num_patches + model.num_prefix_tokens,
                  num_prefix_tokens=model.num_prefix_tokens)
    replace_attention(model, layer, blocks, **{k: counts[k] for k in sized})
    model.attn_mechanism, model.attn_blocks = name, blocks  # recorded for reports and checkpoints
    return model


def _mark_applied(model: VisionTransformer, blocks: list[int], name: str) -> VisionTransformer:
    for i, blk in enumerate(model.blocks):
        blk.attn.applied = i in blocks
    model.attn_mechanism, model.attn_blocks = name, blocks
    return model


def check_attn_kwargs(attn_kwargs: Any, model: str) -> None:
    """``attn_kwargs`` must be a dict of the layer's options; ``applied`` is not one of them here (the model
    sets it from ``attn_layers``)."""
    if attn_kwargs is not None and not isinstance(attn_kwargs, dict):
        raise ValueError(f"{model}: attn_kwargs must be a dict of the attention layer's options, got "
                         f"{attn_kwargs!r}")
    if attn_kwargs and "applied" in attn_kwargs:
        raise ValueError(f"{model}: attn_kwargs may not set 'applied': the blocks the mechanism runs in are "
                         "attn_layers (e.g. attn_layers='first')")


def build_family_vit(
    name: str,
    variant: str,
    pretrained: bool = False,
    symmetric: bool = False,
    attn_kwargs: dict[str, Any] | None = None,
    attn_layers: Any = None,
    **kwargs: Any,
) -> VisionTransformer:
    """The ViT ``variant`` (``<name>_[sym]vit_<size>``) with mechanism ``name`` in ``attn_layers``."""
    mech = get_mechanism(name)
    check_attn_kwargs(attn_kwargs, variant)
    layer = mech.layer_class("vision", symmetric, **(attn_kwargs or {}))
    size = variant.rsplit("_vit_", 1)[-1] if "_vit_" in variant else variant.rsplit("_symvit_", 1)[-1]
    depth = kwargs.get("depth", ARCHS[size]["arch"]["depth"])
    applied = mech.applied_blocks("vision", depth, attn_layers)
    if mech.stateful:
        post = functools.partial(_mark_applied, blocks=applied, name=name)
        return create_vit(variant, pretrained, layer, post, model_cls=StatefulVisionTransformer, **kwargs)
    takes = mech.option_names() - set(attn_kwargs or {})
    sized = tuple(o for o in ("num_tokens", "num_prefix_tokens") if o in takes)
    post = functools.partial(_swap_in, layer=layer, blocks=applied, name=name, sized=sized)
    return create_vit(variant, pretrained, _plain_layer(symmetric), post, **kwargs)


def family_vit(name: str, symmetric: bool, size: str, pretrained: bool = False,
               **kwargs: Any) -> VisionTransformer:
    """The registered ViT ``<name>_[sym]vit_<size>`` (what its ``@register_model`` function returns)."""
    return build_family_vit(name, f"{_family(name, symmetric)}_{size}", pretrained, symmetric, **kwargs)


def family_segmenter(name: str, symmetric: bool, size: str, pretrained: bool = False,
                     **kwargs: Any) -> Segmenter:
    """The registered Segmenter ``segmenter_<name>_[sym]vit_<size>`` on the family ViT of its encoder."""
    return create_registered_segmenter(_family(name, symmetric), size, pretrained, **kwargs)


def _segmenter_sizes() -> list[str]:
    return [s for s, (enc, _) in SEGMENTER_SIZES.items() if enc in FAMILY_SIZES]


def family_names(name: str) -> tuple[list[str], list[str]]:
    """``(ViT names, Segmenter names)`` registered for the mechanism ``name`` of :data:`FAMILY_MECHANISMS`:
    its forms (asymmetric; symmetric where the table says) at :data:`FAMILY_SIZES` and the Segmenter sizes
    whose encoder is one of them."""
    vision, seg = [], []
    for symmetric in (False, True) if FAMILY_MECHANISMS[name] else (False,):
        vision += [f"{_family(name, symmetric)}_{size}" for size in FAMILY_SIZES]
        seg += [f"segmenter_{_family(name, symmetric)}_{size}" for size in _segmenter_sizes()]
    return vision, seg


def family_default_cfgs(name: str) -> Any:
    """The ``default_cfgs`` of the mechanism ``name``'s module of registrations (timm reads a model's
    pretrained config from the ``default_cfgs`` of the module its ``@register_model`` function is in)."""
    return generate_default_cfgs({n: vit_cfg(n) for n in family_names(name)[0]})


FAMILY_VISION_MODELS: tuple[str, ...] = tuple(n for m in FAMILY_MECHANISMS for n in family_names(m)[0])
FAMILY_SEGMENTATION_MODELS: tuple[str, ...] = tuple(n for m in FAMILY_MECHANISMS for n in family_names(m)[1])
