"""The paper's vision transformers, registered in timm (importing :mod:`kpca_attention` registers them).

Every model is a timm ``VisionTransformer`` built through ``build_model_with_cfg`` with timm's own
weight init (``weight_init=""``: truncated normal 0.02 on every Linear, zeros on biases); the official
code's init was silently a no-op and is not copied. Only the attention layer differs:

=====================================  =========================================================
``symvit_*``                           :class:`~kpca_attention.attention.SymmetricAttention` in every block
``rpc_symvit_*``                       :class:`~kpca_attention.attention.RPCAttention` (symmetric) in
                                       ``rpc_layers``, symmetric attention elsewhere
``scaled_vit_*``                       :class:`~kpca_attention.attention.ScaledAttention` (``scaled=``)
``rpc_vit_*``                          asymmetric RPC (queries, paper E.9) in ``rpc_layers``, timm's
                                       ``Attention`` elsewhere
``rpc_symasym_vit_*``                  symmetric RPC in ``rpc_layers`` (default: the first block), timm's
                                       ``Attention`` elsewhere ("Sym/Asym", paper E.9)
``vit_mini_*``                         plain timm attention at the small-image sizes (timm has no such
                                       configuration; the 224-px ``vit_*`` stay timm's own)
=====================================  =========================================================

Sizes: ``*_tiny/small/base_patch16_224`` are DeiT's (192/384/768 wide, 12 blocks, 3/6/12 heads).
``*_mini_patch4_28`` (Fashion-MNIST, 1 channel) and ``*_mini_patch4_32`` (CIFAR, 3 channels) are 64 wide,
4 blocks, 4 heads (head width 16), MLP ratio 2, patch 4: 49 or 64 patches plus the class token.

RPC options (keyword arguments of every ``rpc_*`` entry point): ``rpc_iters`` (4: PAP softmax
evaluations), ``rpc_lambda`` (4.0), ``rpc_layers`` (``"first"``, ``"all"``, an index or a list of
indices; default ``"first"``, the official README's setting), ``rpc_threshold`` (``"lambda_mu"`` as in
the official code, or ``"lambda_over_mu"`` as in the paper), ``rpc_mu_dim`` (None = full width, as
the official code), and the ablations ``rpc_sparse`` / ``rpc_dual`` (True; False forces S = 0 or drops the
dual update, see :func:`~kpca_attention.pap.pap`). The RPC layers are swapped in with
:func:`~kpca_attention.attention.replace_attention` after timm's init, carrying the K/V (and Q) weights
over, so ``rpc_symvit_X`` and ``symvit_X`` built under the same seed start from identical weights.

All entry points take timm's keyword arguments (``num_classes``, ``in_chans``, ``img_size``,
``drop_path_rate``, ``out_indices``, ...). None has pretrained weights.

timm conventions, as timm's own ViTs: every model has a complete pretrained cfg (the fields of timm's
ViT cfgs: ``input_size`` with ``fixed_input_size``, ``mean``/``std``, ``crop_pct``, ``interpolation``,
``num_classes``, ``pool_size``, ``first_conv``, ``classifier``); ``features_only=True`` returns the
last ``out_indices`` (3) blocks as NCHW maps through ``forward_intermediates`` (timm's "getter"
feature wrapper); FX tracing (``create_feature_extractor``) and ``torch.compile`` work (see
:mod:`kpca_attention.attention`). ``make timm-compat`` runs timm's own model tests on these models.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from timm.layers import Attention
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer

from ..attention import RPCAttention, ScaledAttention, SymmetricAttention, configure, replace_attention
from ..pap import RPC_OFFICIAL, check_options
from .normalize import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["VISION_MODELS", "ARCHS", "RPC_DEFAULTS", "RPC_OPTION_ARGS", "check_rpc_options", "create_vit",
           "vit_cfg"]

FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

_IMAGENET_CFG = dict(num_classes=1000, input_size=(3, 224, 224), mean=IMAGENET_MEAN, std=IMAGENET_STD,
                     crop_pct=0.875)

# 64 wide, 4 blocks, 4 heads (head width 16, as the paper's LM), MLP ratio 2: ~122k parameters. Chosen for
# CPU speed: about 2.3x the training throughput of a 96-wide 6-block model (one side-by-side measurement,
# 1 thread, busy machine), so a few CPU minutes give several Fashion-MNIST epochs.
_MINI = dict(embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0)

#: architecture of each size: timm VisionTransformer arguments + the default cfg (classes, input, stats)
ARCHS: dict[str, dict[str, Any]] = {
    "tiny_patch16_224": dict(
        arch=dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
        cfg=_IMAGENET_CFG,
    ),
    "small_patch16_224": dict(
        arch=dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
        cfg=_IMAGENET_CFG,
    ),
    "base_patch16_224": dict(
        arch=dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
        cfg=_IMAGENET_CFG,
    ),
    # Small images: patch 4 keeps 7x7 (28 px) or 8x8 (32 px) tokens (see _MINI for the width).
    "mini_patch4_28": dict(
        arch=dict(img_size=28, patch_size=4, **_MINI),
        cfg=dict(num_classes=10, input_size=(1, 28, 28), mean=FASHION_MNIST_MEAN, std=FASHION_MNIST_STD,
                 crop_pct=1.0),
    ),
    "mini_patch4_32": dict(
        arch=dict(img_size=32, patch_size=4, **_MINI),
        cfg=dict(num_classes=10, input_size=(3, 32, 32), mean=CIFAR10_MEAN, std=CIFAR10_STD, crop_pct=1.0),
    ),
}

#: rpc_* option -> the argument of :func:`~kpca_attention.pap.check_options` it is
RPC_OPTION_ARGS: dict[str, str] = dict(rpc_iters="n_iter", rpc_lambda="lam", rpc_threshold="threshold",
                                       rpc_mu_dim="mu_dim")

#: the ViTs' ``rpc_*`` defaults: the official settings (:data:`~kpca_attention.pap.RPC_OFFICIAL`) in
#: the first block
RPC_DEFAULTS: dict[str, Any] = dict(
    **{opt: RPC_OFFICIAL[arg] for opt, arg in RPC_OPTION_ARGS.items()}, rpc_layers="first",
    rpc_sparse=True, rpc_dual=True,  # ablations: False forces S = 0 / drops the dual update
)

#: family -> (sizes it exists in, one-line description)
FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    "symvit": (("tiny_patch16_224", "small_patch16_224", "base_patch16_224", "mini_patch4_28",
                "mini_patch4_32"),
               "SymViT: symmetric softmax attention (K and V only) in every block"),
    "rpc_symvit": (("tiny_patch16_224", "small_patch16_224", "base_patch16_224", "mini_patch4_28",
                    "mini_patch4_32"),
                   "RPC-SymViT: symmetric RPC-Attention (PAP) in rpc_layers, symmetric attention elsewhere"),
    "scaled_vit": (("tiny_patch16_224", "mini_patch4_28", "mini_patch4_32"),
                   "Scaled Attention A (I - S) V (scaled='scalar' | 'matrix') in every block"),
    "rpc_vit": (("tiny_patch16_224", "mini_patch4_28", "mini_patch4_32"),
                "asymmetric RPC (with queries) in rpc_layers, ordinary attention elsewhere"),
    "rpc_symasym_vit": (("tiny_patch16_224", "mini_patch4_28", "mini_patch4_32"),
                        "symmetric RPC in rpc_layers (default first), ordinary asymmetric attention "
                        "elsewhere"),
    "vit": (("mini_patch4_28", "mini_patch4_32"), "plain timm ViT at a small-image size"),
}


def _model_name(family: str, size: str) -> str:
    return f"{family}_{size}"


VISION_MODELS: tuple[str, ...] = tuple(
    _model_name(fam, size) for fam, (sizes, _) in FAMILIES.items() for size in sizes
)

def _size_of(name: str) -> str:
    for size in ARCHS:
        if name.endswith("_" + size):
            return size
    raise KeyError(name)


def _cfg(**kwargs: Any) -> dict[str, Any]:
    """A pretrained cfg with every field of timm's ViT cfgs (``timm.models.vision_transformer._cfg``).

    ``fixed_input_size``: the position embedding is learned for one grid, so data pipelines and timm's
    tests use ``input_size`` (other sizes work with ``dynamic_img_size=True`` or ``img_size=``).
    """
    return dict(url="", pool_size=None, interpolation="bicubic", fixed_input_size=True,
                first_conv="patch_embed.proj", classifier="head", **kwargs)


def vit_cfg(name: str) -> dict[str, Any]:
    """The complete pretrained cfg of a model named ``<family>_<size>`` (size a key of :data:`ARCHS`)."""
    return _cfg(**ARCHS[_size_of(name)]["cfg"])


def _build_default_cfgs() -> Any:
    return generate_default_cfgs({name: _cfg(**ARCHS[_size_of(name)]["cfg"]) for name in VISION_MODELS})


default_cfgs = _build_default_cfgs()


# ----------------------------------------------------------------------------- builders

def _create(
    variant: str,
    pretrained: bool,
    attn_layer: type,
    post: Callable[[VisionTransformer], VisionTransformer] | None = None,
    model_cls: type[VisionTransformer] = VisionTransformer,
    **kwargs: Any,
) -> VisionTransformer:
    """Build through timm's ``build_model_with_cfg``; ``post`` (e.g. the RPC swap) runs on the
    VisionTransformer before timm wraps it for ``features_only``; ``model_cls`` a VisionTransformer
    subclass (the family models with cross-layer state use one)."""
    if pretrained:
        raise ValueError(f"{variant}: no pretrained weights exist; train it (kpca-attention train) and load "
                         "the checkpoint instead")
    arch = dict(ARCHS[_size_of(variant)]["arch"])
    arch.update(kwargs)
    out_indices = arch.pop("out_indices", 3)
    size, patch = arch.get("img_size"), arch.get("patch_size")
    sizes = size if isinstance(size, (tuple, list)) else (size, size)
    if isinstance(patch, int) and all(isinstance(s, int) for s in sizes):
        if min(sizes) < patch:
            raise ValueError(f"{variant}: img_size {size} is smaller than the patch size {patch}: the model "
                             "would see no patch")
        cut = [s % patch for s in sizes]
        if any(cut) and not arch.get("dynamic_img_pad"):  # timm's patch embedding drops the remainder
            fits = " or ".join(map(str, sorted({s - s % patch for s in sizes} | {s - s % patch + patch
                                                                                  for s in sizes})))
            raise ValueError(f"{variant}: img_size {size} is not a multiple of the patch size {patch}: the "
                             f"last {max(cut)} pixel rows or columns would never be seen; use {fits} (or "
                             "dynamic_img_pad=True with dynamic_img_size=True: timm pads the images)")

    def make(**model_kwargs: Any) -> VisionTransformer:
        model = model_cls(**model_kwargs)
        return model if post is None else post(model)

    # features_only as timm's ViTs: forward_intermediates of the last out_indices blocks, as NCHW maps
    return build_model_with_cfg(
        make, variant, pretrained=False, attn_layer=attn_layer,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"), **arch,
    )


#: the builder of every registered ViT (public for :mod:`kpca_attention.models.family`)
create_vit = _create


def check_rpc_options(opts: dict[str, Any], where: str) -> None:
    """ValueError naming the ``rpc_*`` option and its valid values for a bad value in ``opts``."""
    for key, arg in RPC_OPTION_ARGS.items():
        if key in opts:
            check_options(**{arg: opts[key]}, where=f"{where}: {key}")


def _pop_rpc(variant: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    opts = {k: kwargs.pop(k, v) for k, v in RPC_DEFAULTS.items()}
    unknown = [k for k in kwargs if k.startswith("rpc_")]
    if unknown:
        raise TypeError(f"unknown RPC option(s) {unknown}; valid: {', '.join(RPC_DEFAULTS)}")
    check_rpc_options(opts, variant)
    return opts


def _with_rpc(opts: dict[str, Any], symmetric: bool) -> Callable[[VisionTransformer], VisionTransformer]:
    """The RPC swap of :func:`_create`'s ``post``: RPC layers in ``rpc_layers``, weights carried over."""
    return functools.partial(_swap_rpc, opts=opts, symmetric=symmetric)


def _swap_rpc(model: VisionTransformer, opts: dict[str, Any], symmetric: bool) -> VisionTransformer:
    blocks = opts["rpc_layers"]
    chosen = replace_attention(
        model, RPCAttention, blocks if isinstance(blocks, (str, int)) else list(blocks),
        n_iter=opts["rpc_iters"], lam=opts["rpc_lambda"], threshold=opts["rpc_threshold"],
        mu_dim=opts["rpc_mu_dim"], symmetric=symmetric, sparse=opts["rpc_sparse"], dual=opts["rpc_dual"],
    )
    model.rpc_blocks = chosen  # recorded for reports and checkpoints
    return model


def _build_symvit(variant: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    return _create(variant, pretrained, SymmetricAttention, **kwargs)


def _build_rpc_symvit(variant: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    opts = _pop_rpc(variant, kwargs)
    return _create(variant, pretrained, SymmetricAttention, _with_rpc(opts, symmetric=True), **kwargs)


def _build_rpc_vit(variant: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    opts = _pop_rpc(variant, kwargs)
    return _create(variant, pretrained, Attention, _with_rpc(opts, symmetric=False), **kwargs)


def _build_rpc_symasym_vit(variant: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    opts = _pop_rpc(variant, kwargs)
    return _create(variant, pretrained, Attention, _with_rpc(opts, symmetric=True), **kwargs)


def _build_scaled_vit(
    variant: str, pretrained: bool = False, scaled: str = "scalar", **kwargs: Any
) -> VisionTransformer:
    if scaled not in ScaledAttention.MODES:
        raise ValueError(f"{variant}: unknown scaled={scaled!r}; valid: {', '.join(ScaledAttention.MODES)}")
    layer_opts: dict[str, Any] = {"mode": scaled}
    if scaled == "matrix":
        # S is (H, N, N): the token count is fixed by the image and patch size (+ prefix tokens).
        if kwargs.get("dynamic_img_size"):
            raise ValueError(f"{variant}: scaled='matrix' fixes the token count; dynamic_img_size is not "
                             "supported")
        arch = dict(ARCHS[_size_of(variant)]["arch"], **kwargs)
        cfg_size = ARCHS[_size_of(variant)]["cfg"]["input_size"][-1]
        img = arch.get("img_size", cfg_size)
        patch = arch["patch_size"]
        h, w = (img, img) if isinstance(img, int) else tuple(img)
        p_h, p_w = (patch, patch) if isinstance(patch, int) else tuple(patch)
        prefix = int(arch.get("class_token", True)) + int(arch.get("reg_tokens", 0))
        if h % p_h or w % p_w:
            raise ValueError(f"{variant}: img_size {img} is not a multiple of patch_size {patch}")
        layer_opts["num_tokens"] = (h // p_h) * (w // p_w) + prefix
    return _create(variant, pretrained, configure(ScaledAttention, **layer_opts), **kwargs)


def _build_vit(variant: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    return _create(variant, pretrained, Attention, **kwargs)




# ----------------------------------------------------------------------------- registrations
# One function per registered name, as timm does (a name is found by searching for ``def <name>``);
# tests/test_models.py checks that the registered set is unchanged and equals VISION_MODELS.


@register_model
def symvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """SymViT: symmetric softmax attention (K and V only) in every block.

    Size tiny_patch16_224 (:data:`ARCHS`).
    """
    return _build_symvit("symvit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def symvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """SymViT: symmetric softmax attention (K and V only) in every block.

    Size small_patch16_224 (:data:`ARCHS`).
    """
    return _build_symvit("symvit_small_patch16_224", pretrained, **kwargs)


@register_model
def symvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """SymViT: symmetric softmax attention (K and V only) in every block.

    Size base_patch16_224 (:data:`ARCHS`).
    """
    return _build_symvit("symvit_base_patch16_224", pretrained, **kwargs)


@register_model
def symvit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """SymViT: symmetric softmax attention (K and V only) in every block.

    Size mini_patch4_28 (:data:`ARCHS`).
    """
    return _build_symvit("symvit_mini_patch4_28", pretrained, **kwargs)


@register_model
def symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """SymViT: symmetric softmax attention (K and V only) in every block.

    Size mini_patch4_32 (:data:`ARCHS`).
    """
    return _build_symvit("symvit_mini_patch4_32", pretrained, **kwargs)


@register_model
def rpc_symvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """RPC-SymViT: symmetric RPC-Attention (PAP) in rpc_layers, symmetric attention elsewhere.

    Size tiny_patch16_224 (:data:`ARCHS`).
    """
    return _build_rpc_symvit("rpc_symvit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def rpc_symvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """RPC-SymViT: symmetric RPC-Attention (PAP) in rpc_layers, symmetric attention elsewhere.

    Size small_patch16_224 (:data:`ARCHS`).
    """
    return _build_rpc_symvit("rpc_symvit_small_patch16_224", pretrained, **kwargs)


@register_model
def rpc_symvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """RPC-SymViT: symmetric RPC-Attention (PAP) in rpc_layers, symmetric attention elsewhere.

    Size base_patch16_224 (:data:`ARCHS`).
    """
    return _build_rpc_symvit("rpc_symvit_base_patch16_224", pretrained, **kwargs)


@register_model
def rpc_symvit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """RPC-SymViT: symmetric RPC-Attention (PAP) in rpc_layers, symmetric attention elsewhere.

    Size mini_patch4_28 (:data:`ARCHS`).
    """
    return _build_rpc_symvit("rpc_symvit_mini_patch4_28", pretrained, **kwargs)


@register_model
def rpc_symvit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """RPC-SymViT: symmetric RPC-Attention (PAP) in rpc_layers, symmetric attention elsewhere.

    Size mini_patch4_32 (:data:`ARCHS`).
    """
    return _build_rpc_symvit("rpc_symvit_mini_patch4_32", pretrained, **kwargs)


@register_model
def scaled_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Scaled Attention A (I - S) V (scaled='scalar' | 'matrix') in every block.

    Size tiny_patch16_224 (:data:`ARCHS`).
    """
    return _build_scaled_vit("scaled_vit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def scaled_vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Scaled Attention A (I - S) V (scaled='scalar' | 'matrix') in every block.

    Size mini_patch4_28 (:data:`ARCHS`).
    """
    return _build_scaled_vit("scaled_vit_mini_patch4_28", pretrained, **kwargs)


@register_model
def scaled_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Scaled Attention A (I - S) V (scaled='scalar' | 'matrix') in every block.

    Size mini_patch4_32 (:data:`ARCHS`).
    """
    return _build_scaled_vit("scaled_vit_mini_patch4_32", pretrained, **kwargs)


@register_model
def rpc_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """asymmetric RPC (with queries) in rpc_layers, ordinary attention elsewhere.

    Size tiny_patch16_224 (:data:`ARCHS`).
    """
    return _build_rpc_vit("rpc_vit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def rpc_vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """asymmetric RPC (with queries) in rpc_layers, ordinary attention elsewhere.

    Size mini_patch4_28 (:data:`ARCHS`).
    """
    return _build_rpc_vit("rpc_vit_mini_patch4_28", pretrained, **kwargs)


@register_model
def rpc_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """asymmetric RPC (with queries) in rpc_layers, ordinary attention elsewhere.

    Size mini_patch4_32 (:data:`ARCHS`).
    """
    return _build_rpc_vit("rpc_vit_mini_patch4_32", pretrained, **kwargs)


@register_model
def rpc_symasym_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """symmetric RPC in rpc_layers (default first), ordinary asymmetric attention elsewhere.

    Size tiny_patch16_224 (:data:`ARCHS`).
    """
    return _build_rpc_symasym_vit("rpc_symasym_vit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def rpc_symasym_vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """symmetric RPC in rpc_layers (default first), ordinary asymmetric attention elsewhere.

    Size mini_patch4_28 (:data:`ARCHS`).
    """
    return _build_rpc_symasym_vit("rpc_symasym_vit_mini_patch4_28", pretrained, **kwargs)


@register_model
def rpc_symasym_vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """symmetric RPC in rpc_layers (default first), ordinary asymmetric attention elsewhere.

    Size mini_patch4_32 (:data:`ARCHS`).
    """
    return _build_rpc_symasym_vit("rpc_symasym_vit_mini_patch4_32", pretrained, **kwargs)


@register_model
def vit_mini_patch4_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """plain timm ViT at a small-image size.

    Size mini_patch4_28 (:data:`ARCHS`).
    """
    return _build_vit("vit_mini_patch4_28", pretrained, **kwargs)


@register_model
def vit_mini_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """plain timm ViT at a small-image size.

    Size mini_patch4_32 (:data:`ARCHS`).
    """
    return _build_vit("vit_mini_patch4_32", pretrained, **kwargs)
