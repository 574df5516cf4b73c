"""The paper's vision models: names, attention per block, weights, parameter counts, forward/backward."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.layers import Attention

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import RPCAttention, ScaledAttention, SymmetricAttention
from kpca_attention.models import NormalizedModel, create_model, list_models
from kpca_attention.models.vit import FAMILIES

MINI = [n for n in list_models("vision") if "_mini_" in n]


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def attn_types(model) -> list[type]:
    return [type(b.attn) for b in model.blocks]


def test_registered_in_timm_and_listed():
    from timm.models import model_entrypoint

    vision = list_models("vision")
    assert len(vision) == sum(len(sizes) for sizes, _ in FAMILIES.values())
    for name in vision:
        assert timm.is_model(name), name
    for name in ("symvit_tiny_patch16_224", "rpc_symvit_base_patch16_224", "scaled_vit_tiny_patch16_224",
                 "rpc_vit_tiny_patch16_224", "rpc_symasym_vit_tiny_patch16_224", "vit_mini_patch4_28",
                 "rpc_symvit_mini_patch4_32"):
        assert name in vision
    assert set(list_models("lm")) == {"lm", "symlm", "rpc_symlm"}
    assert set(list_models()) == (set(vision) | {"lm", "symlm", "rpc_symlm"} | set(list_models("family"))
                                  | set(list_models("fan")) | set(list_models("segmentation")))
    ours = {n for n in timm.list_models() if model_entrypoint(n).__module__.startswith("kpca_attention")}
    assert ours <= set(list_models()), sorted(ours - set(list_models()))[:5]  # every model we register
    assert {"fan_vit_mini_patch4_28", "rpc_fan_symvit_tiny_patch16_224"} <= set(list_models("fan"))
    # plain vit_* of timm are untouched
    assert timm.create_model("vit_tiny_patch16_224", img_size=32).blocks[0].attn.__class__ is Attention


def test_unknown_names_and_options():
    with pytest.raises(ValueError, match="valid names.*symvit_tiny_patch16_224"):
        create_model("symvit_tinyy")
    with pytest.raises(ValueError, match="no pretrained weights"):
        create_model("symvit_mini_patch4_28", pretrained=True)
    with pytest.raises(TypeError, match="rpc_iter"):
        create_model("rpc_symvit_mini_patch4_28", rpc_iter=3)
    with pytest.raises(ValueError, match="scaled"):
        create_model("scaled_vit_mini_patch4_28", scaled="vector")
    with pytest.raises(ValueError, match="out of range"):
        create_model("rpc_symvit_mini_patch4_28", rpc_layers=[7])
    with pytest.raises(TypeError, match="vocab_size"):
        create_model("symlm")
    with pytest.raises(ValueError, match="lambda"):
        create_model("rpc_symvit_mini_patch4_28", rpc_threshold="mu")


META = dict(device="meta")  # structure and counts only: no memory, no init cost


def test_symvit_tiny_parameter_count():
    sym = create_model("symvit_tiny_patch16_224", **META)
    vit = create_model("vit_tiny_patch16_224", **META)
    # symmetric attention drops W_Q and its bias in each of the 12 blocks
    assert n_params(vit) - n_params(sym) == 12 * (192 * 192 + 192)
    assert 5.2e6 <= n_params(sym) < 5.3e6  # the paper's "5.2M"
    # RPC adds no parameters
    assert n_params(create_model("rpc_symvit_tiny_patch16_224", **META)) == n_params(sym)
    assert all(t is SymmetricAttention for t in attn_types(sym))


@pytest.mark.parametrize("size,dim,heads", [("small", 384, 6), ("base", 768, 12)])
def test_larger_sizes(size, dim, heads):
    # depth=2, 32 px: the architecture is checked without paying for the full model
    m = create_model(f"rpc_symvit_{size}_patch16_224", depth=2, img_size=32, rpc_layers="all")
    assert m.embed_dim == dim and m.blocks[0].attn.num_heads == heads
    assert attn_types(m) == [RPCAttention, RPCAttention]
    assert m(torch.rand(1, 3, 32, 32)).shape == (1, 1000)


def test_official_default_rpc_only_in_first_block():
    m = create_model("rpc_symvit_tiny_patch16_224", **META)
    types = attn_types(m)
    assert types[0] is RPCAttention and all(t is SymmetricAttention for t in types[1:])
    a = m.blocks[0].attn
    assert (a.n_iter, a.lam, a.threshold, a.mu_dim, a.symmetric) == (4, 4.0, "lambda_mu", None, True)
    assert m.rpc_blocks == [0]


@pytest.mark.parametrize("spec,expected", [("all", list(range(4))), ([0, 3], [0, 3]), ("1,3", [1, 3]),
                                           (2, [2]), ("first", [0])])
def test_rpc_layers_choice(spec, expected):
    m = create_model("rpc_symvit_mini_patch4_28", rpc_layers=spec, rpc_iters=6, rpc_lambda=3.0)
    for i, blk in enumerate(m.blocks):
        if i in expected:
            assert isinstance(blk.attn, RPCAttention) and blk.attn.n_iter == 6 and blk.attn.lam == 3.0
        else:
            assert type(blk.attn) is SymmetricAttention
    assert m.rpc_blocks == expected


def test_asymmetric_variants():
    small = dict(img_size=32, **META)
    m = create_model("rpc_vit_tiny_patch16_224", **small)
    assert isinstance(m.blocks[0].attn, RPCAttention) and not m.blocks[0].attn.symmetric
    assert hasattr(m.blocks[0].attn, "qkv")  # queries present
    assert all(t is Attention for t in attn_types(m)[1:])
    m = create_model("rpc_symasym_vit_tiny_patch16_224", **small)
    assert isinstance(m.blocks[0].attn, RPCAttention) and m.blocks[0].attn.symmetric
    assert all(t is Attention for t in attn_types(m)[1:])
    plain = create_model("vit_tiny_patch16_224", **small)
    # Sym/Asym drops W_Q in block 1 only
    assert n_params(plain) - n_params(m) == 192 * 192 + 192
    assert n_params(create_model("rpc_vit_tiny_patch16_224", **small)) == n_params(plain)


def test_scaled_attention_modes():
    m = create_model("scaled_vit_mini_patch4_28", scaled="matrix")
    a = m.blocks[0].attn
    assert isinstance(a, ScaledAttention) and a.mode == "matrix"
    assert a.scale_s.shape == (4, 7 * 7 + 1, 7 * 7 + 1)  # patches + class token
    m32 = create_model("scaled_vit_tiny_patch16_224", scaled="matrix", img_size=64, depth=2)
    assert m32.blocks[0].attn.scale_s.shape == (3, 17, 17)
    assert m32(torch.rand(1, 3, 64, 64)).shape == (1, 1000)
    s = create_model("scaled_vit_mini_patch4_28")
    assert s.blocks[0].attn.mode == "scalar" and float(s.blocks[0].attn.alpha.detach()) == 0.0
    with pytest.raises(ValueError, match="dynamic_img_size"):
        create_model("scaled_vit_mini_patch4_28", scaled="matrix", dynamic_img_size=True)


def test_same_seed_same_initial_weights_and_timm_init():
    torch.manual_seed(0)
    sym = create_model("symvit_mini_patch4_28")
    torch.manual_seed(0)
    rpc = create_model("rpc_symvit_mini_patch4_28", rpc_layers="all")
    a, b = sym.state_dict(), rpc.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # timm's ViT init (trunc normal 0.02, zero bias), not PyTorch's default nor the official no-op
    w = rpc.blocks[0].attn.kv.weight.detach()
    assert 0.017 < float(w.std()) < 0.023  # PyTorch's default here would be ~0.059
    assert torch.count_nonzero(rpc.blocks[0].attn.kv.bias) == 0
    assert torch.count_nonzero(rpc.head.bias) == 0


def test_mini_defaults_and_timm_kwargs():
    m = create_model("symvit_mini_patch4_28")
    assert m.patch_embed.proj.in_channels == 1 and m.num_classes == 10
    assert m.patch_embed.grid_size == (7, 7)
    m = create_model("symvit_mini_patch4_32")
    assert m.patch_embed.proj.in_channels == 3 and m.patch_embed.grid_size == (8, 8)
    m = create_model("rpc_symvit_mini_patch4_28", num_classes=7, in_chans=3, drop_path_rate=0.1)
    assert m.num_classes == 7 and m.patch_embed.proj.in_channels == 3
    assert m.blocks[-1].drop_path1.drop_prob == pytest.approx(0.1)


@pytest.mark.parametrize("name", MINI)
def test_mini_forward_backward(name):
    torch.manual_seed(0)
    model = create_model(name)
    c, h, _ = model.pretrained_cfg["input_size"]
    net = NormalizedModel(model, model.pretrained_cfg["mean"], model.pretrained_cfg["std"])
    x = torch.rand(2, c, h, h)
    out = net(x)
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    out.logsumexp(-1).mean().backward()
    g = model.blocks[0].attn.proj.weight.grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    for p in model.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rpc_mu_dim": 0}, r"rpc_mu_dim: mu_dim must be None \(the full width H \* D\) or an integer >= 1, "
                            r"got 0"),
        ({"rpc_mu_dim": -16}, r"rpc_mu_dim: mu_dim must be None .* got -16"),
        ({"rpc_iters": True}, r"rpc_iters: n_iter must be an integer >= 1 .* got True"),
        ({"rpc_lambda": 0.0}, r"rpc_lambda: lam must be a finite number > 0"),
        ({"rpc_threshold": "paper"}, r"rpc_threshold: unknown threshold 'paper'"),
    ],
)
def test_rpc_options_are_checked(kwargs, match) -> None:
    """rpc_mu_dim=0 gave tau = 0 (every RPC layer returned the mean of V), -16 a negative tau."""
    with pytest.raises(ValueError, match="rpc_symvit_mini_patch4_28: " + match):
        create_model("rpc_symvit_mini_patch4_28", **kwargs)
    with pytest.raises(ValueError, match="LMConfig: " + match):
        create_model("rpc_symlm", vocab_size=50, preset="small", **kwargs)


# ----------------------------------------------------------------------------- registrations

#: the names this package registered in timm before the registrations became one function each
#: (computed on the commit before, with timm.list_models() filtered by the entry point's module)
REGISTERED = {
    "rpc_symasym_vit_mini_patch4_28",
    "rpc_symasym_vit_mini_patch4_32",
    "rpc_symasym_vit_tiny_patch16_224",
    "rpc_symvit_base_patch16_224",
    "rpc_symvit_mini_patch4_28",
    "rpc_symvit_mini_patch4_32",
    "rpc_symvit_small_patch16_224",
    "rpc_symvit_tiny_patch16_224",
    "rpc_vit_mini_patch4_28",
    "rpc_vit_mini_patch4_32",
    "rpc_vit_tiny_patch16_224",
    "scaled_vit_mini_patch4_28",
    "scaled_vit_mini_patch4_32",
    "scaled_vit_tiny_patch16_224",
    "segmenter_rpc_symasym_vit_mini_patch4_32",
    "segmenter_rpc_symasym_vit_tiny_patch16_512",
    "segmenter_rpc_symvit_base_patch16_512",
    "segmenter_rpc_symvit_mini_patch4_32",
    "segmenter_rpc_symvit_small_patch16_512",
    "segmenter_rpc_symvit_tiny_patch16_512",
    "segmenter_rpc_vit_mini_patch4_32",
    "segmenter_rpc_vit_tiny_patch16_512",
    "segmenter_scaled_vit_mini_patch4_32",
    "segmenter_scaled_vit_tiny_patch16_512",
    "segmenter_symvit_base_patch16_512",
    "segmenter_symvit_mini_patch4_32",
    "segmenter_symvit_small_patch16_512",
    "segmenter_symvit_tiny_patch16_512",
    "segmenter_vit_mini_patch4_32",
    "symvit_base_patch16_224",
    "symvit_mini_patch4_28",
    "symvit_mini_patch4_32",
    "symvit_small_patch16_224",
    "symvit_tiny_patch16_224",
    "vit_mini_patch4_28",
    "vit_mini_patch4_32",
}


def test_registered_names_unchanged_and_each_one_function() -> None:
    import inspect

    from timm.models import model_entrypoint

    from kpca_attention.models import segmenter, vit

    ours = {n for n in timm.list_models() if model_entrypoint(n).__module__.startswith("kpca_attention")}
    # the family's names are pinned in tests/test_family_models.py
    from kpca_attention.models import family, fan

    assert set(fan.FAN_MODELS) == {"fan_vit_mini_patch4_28", "fan_vit_tiny_patch16_224",
                                   "rpc_fan_vit_mini_patch4_28", "rpc_fan_vit_tiny_patch16_224",
                                   "fan_symvit_mini_patch4_28", "fan_symvit_tiny_patch16_224",
                                   "rpc_fan_symvit_mini_patch4_28", "rpc_fan_symvit_tiny_patch16_224"}
    fan_source = inspect.getsource(fan)
    assert all(f"def {n}(" in fan_source for n in fan.FAN_MODELS)
    assert (ours - set(family.FAMILY_VISION_MODELS) - set(family.FAMILY_SEGMENTATION_MODELS)
            - set(fan.FAN_MODELS)) == REGISTERED
    assert set(vit.VISION_MODELS) | set(segmenter.SEGMENTATION_MODELS) == REGISTERED
    sources = {module: inspect.getsource(module) for module in (vit, segmenter)}
    for name in REGISTERED:
        fn = model_entrypoint(name)
        module = vit if fn.__module__ == vit.__name__ else segmenter
        assert fn.__name__ == name and getattr(module, name) is fn
        assert f"@register_model\ndef {name}(pretrained: bool = False" in sources[module], name  # findable
