"""The robust-attention family's plumbing (issue 25): the mechanism registry, the names registered in timm
(pinned), the cross-layer state threaded explicitly through the ViT / LM / Segmenter, and that the
stateful models still work with features_only, gradient checkpointing, FX, torch.compile, DDP and the
KPCA capture."""

from __future__ import annotations

import inspect

import pytest
import timm
import torch
from timm.layers import Attention
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import (
    EllipticalAttention,
    NeuTRENOAttention,
    ScaledAttention,
    get_mechanism,
    mechanisms,
    register_mechanism,
)
from kpca_attention.kpca.capture import QKVCapture
from kpca_attention.models import create_model, family, list_models
from kpca_attention.models.family import StatefulVisionTransformer, build_family_vit

pytestmark = pytest.mark.usefixtures("single_thread")

MINE = ("neutreno", "pid", "elliptical")
#: the names registered for NeuTRENO, PIDformer and Elliptical (other mechanisms add theirs)
PINNED = {
    f"{m}_{form}_{size}" for m in MINE for form in ("vit", "symvit")
    for size in ("mini_patch4_28", "mini_patch4_32", "tiny_patch16_224")
} | {
    f"segmenter_{m}_{form}_{size}" for m in MINE for form in ("vit", "symvit")
    for size in ("mini_patch4_32", "tiny_patch16_512")
}


def images(b: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


def mini(name: str, seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model(name, depth=3, **kw)


def test_registry() -> None:
    assert set(MINE) | {"symmetric", "rpc", "scaled"} <= set(mechanisms())
    assert "scaled" not in [m for m in mechanisms() if get_mechanism(m).symmetric_ok]
    with pytest.raises(KeyError, match="registered"):
        get_mechanism("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_mechanism("neutreno", EllipticalAttention)
    with pytest.raises(ValueError, match="symmetric"):
        get_mechanism("scaled").layer_class("vision", symmetric=True)
    assert get_mechanism("rpc").applied_blocks("lm", 16) == [0, 1, 2, 3]
    assert get_mechanism("rpc").applied_blocks("segmentation", 12) == [0]  # a Segmenter's encoder is a ViT
    assert get_mechanism("neutreno").options("segmentation") == {"lam": 0.6}


def test_names_pinned_and_each_one_function() -> None:
    """Each mechanism of family.FAMILY_MECHANISMS has its module in models/mechanisms/ that registers
    exactly its names, each an explicit ``@register_model`` function of that name (as timm does)."""
    import importlib

    from timm.models import model_entrypoint

    names = set(family.FAMILY_VISION_MODELS) | set(family.FAMILY_SEGMENTATION_MODELS)
    assert PINNED <= names
    for mech in family.FAMILY_MECHANISMS:
        module = importlib.import_module(f"kpca_attention.models.mechanisms.{mech}")
        source = inspect.getsource(module)
        vision, seg = family.family_names(mech)
        for name in [*vision, *seg]:
            assert timm.is_model(name), name
            fn = model_entrypoint(name)
            assert fn.__name__ == name and getattr(module, name) is fn and fn.__module__ == module.__name__
            assert f"@register_model\ndef {name}(pretrained: bool = False" in source, name
        defined = {n for n, f in vars(module).items() if callable(f) and getattr(f, "__module__", "") ==
                   module.__name__}
        assert defined == {*vision, *seg}, mech  # no stray or missing function
        assert set(module.default_cfgs) == set(vision)  # the pretrained configs timm reads from the module
    assert {f"{m}_{f}" for m in MINE for f in ("lm", "symlm")} <= set(list_models("family"))


@pytest.mark.parametrize("name", sorted(n for n in PINNED if not n.startswith("segmenter")))
def test_pretrained_cfg_and_structure(name: str) -> None:
    cfg = timm.models.get_pretrained_cfg(name).to_dict()
    model = timm.create_model(name, device="meta")
    assert isinstance(model, StatefulVisionTransformer)
    assert model.in_chans == cfg["input_size"][0] and model.pretrained_cfg == model.default_cfg
    sym = "_symvit_" in name
    assert all(b.attn.symmetric is sym for b in model.blocks)


def test_stateless_mechanism_builder_swaps_chosen_blocks() -> None:
    torch.manual_seed(0)
    model = build_family_vit("scaled", "scaled_vit_mini_patch4_28", attn_layers=[1, 3])
    kinds = [type(b.attn) for b in model.blocks]
    assert kinds[0] is Attention and kinds[2] is Attention
    assert issubclass(kinds[1], ScaledAttention) and issubclass(kinds[3], ScaledAttention)
    assert model.attn_blocks == [1, 3]


def test_blocks_thread_one_state_as_by_hand() -> None:
    model = mini("neutreno_vit_mini_patch4_28").eval()
    x = images()
    h0 = model.norm_pre(model._pos_embed(model.patch_embed(x)))
    h, alone, state = h0, h0, {}
    for blk in model.blocks:
        h, state = blk(h, state)
        with pytest.warns(UserWarning, match="without the cross-layer state"):
            alone = blk(alone)  # without a state every block is the first: no fidelity term
    assert set(state) == {"v0"}
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), model.norm(h))
        assert not torch.allclose(model.norm(alone), model.norm(h))
    assert [b.attn.applied for b in mini("elliptical_vit_mini_patch4_28", attn_layers=[2]).blocks] == [
        False, False, True]


@pytest.mark.parametrize("name", ["pid_vit_mini_patch4_28", "elliptical_symvit_mini_patch4_28"])
def test_features_only_and_grad_checkpointing(name: str) -> None:
    model = mini(name, features_only=True, out_indices=(0, 2)).eval()
    feats = model(images())
    vit = model.model
    _, inter = vit.forward_intermediates(images(), indices=(0, 2))
    for a, b in zip(feats, inter, strict=True):
        torch.testing.assert_close(a, b)
    full = mini(name)
    ref = full(images())
    full.set_grad_checkpointing(True)
    x = images().requires_grad_()
    out = full(x)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in full.blocks.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", ["neutreno_vit_mini_patch4_28", "pid_symvit_mini_patch4_28",
                                  "elliptical_vit_mini_patch4_28"])
def test_fx_forward_and_backward(name: str) -> None:
    model = mini(name).eval()
    train_nodes, eval_nodes = get_graph_node_names(model)
    fx = create_feature_extractor(model, return_nodes={eval_nodes[-1]: "out"})
    torch.testing.assert_close(fx(images())["out"], model(images()), rtol=1e-5, atol=1e-6)
    model.train()
    fx = create_feature_extractor(model, train_return_nodes=[train_nodes[-1]],
                                  eval_return_nodes=[eval_nodes[-1]])
    fx.train()
    next(iter(fx(images()).values())).mean().backward()
    no_grad = [n for n, p in fx.named_parameters() if p.grad is None]
    assert not no_grad, f"no gradient for {no_grad}"


def test_compile_matches_eager_without_graph_breaks() -> None:
    torch.manual_seed(0)
    model = create_model("elliptical_vit_mini_patch4_28", depth=2).eval()
    x = images()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    torch.manual_seed(0)
    lm = create_model("pid_lm", vocab_size=30, preset="small", n_layer=2)
    idx = torch.randint(0, 30, (2, 9))
    torch._dynamo.reset()
    clm = torch.compile(lm, backend="aot_eager", fullgraph=True)
    lm.eval()
    with torch.no_grad():
        torch.testing.assert_close(clm(idx)[0], lm(idx)[0])


def test_kpca_capture_on_a_stateful_model() -> None:
    model = mini("neutreno_vit_mini_patch4_28").eval()
    with QKVCapture(model) as cap, torch.no_grad():
        out = model(images())
    assert len(cap.records) == 3
    torch.testing.assert_close(out, model(images()))  # the capture changes nothing
    for i, rec in enumerate(cap.records):
        assert rec["v"].shape == (2, 4, 50, 16), i
    # V^0 of the state is the first layer's captured v
    x = model.norm_pre(model._pos_embed(model.patch_embed(images())))
    _, state = model.blocks[0](x, {})
    torch.testing.assert_close(state["v0"], cap.records[0]["v"])


def test_ddp_single_process(tmp_path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = mini("neutreno_vit_mini_patch4_28")
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp(images()).sum().backward()
        assert all(p.grad is not None for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_segmenter_and_lm_variants() -> None:
    torch.manual_seed(0)
    seg = create_model("segmenter_elliptical_vit_mini_patch4_32", num_classes=3, img_size=48, in_chans=1)
    assert isinstance(seg.encoder, StatefulVisionTransformer)
    assert seg(torch.randn(2, 1, 48, 48)).shape == (2, 3, 48, 48)
    lm = create_model("neutreno_symlm", vocab_size=20, preset="small", n_layer=2)
    assert all(isinstance(b.attn, NeuTRENOAttention) and b.attn.symmetric for b in lm.blocks)
    from kpca_attention.models import create_lm

    with pytest.raises(ValueError, match="unknown language model.*neutreno_symlm"):
        create_lm("neutreno_lmx", vocab_size=20)


@pytest.mark.parametrize("mech", ["neutreno", "pid", "elliptical"])
def test_module_apply_reaches_every_module_of_a_stateful_model(mech: str) -> None:
    """The layers' on/off flag was an attribute named ``apply``, which hid ``nn.Module.apply``:
    ``model.apply(init_fn)``, PyTorch's re-initialisation idiom, raised "'bool' object is not callable"."""
    models = [mini(f"{mech}_vit_mini_patch4_28"),
              create_model(f"{mech}_lm", vocab_size=20, preset="small", n_layer=2),
              create_model(f"segmenter_{mech}_vit_mini_patch4_32", num_classes=3, img_size=32, in_chans=1)]
    for model in models:
        seen: list[torch.nn.Module] = []
        assert model.apply(seen.append) is model
        assert len(seen) == len(list(model.modules()))
        assert all(isinstance(m.attn.applied, bool) for m in model.modules() if hasattr(m, "attn")
                   and hasattr(m.attn, "applied"))


def test_a_stateful_layer_in_timms_plain_vit_says_it_computes_plain_attention() -> None:
    """In timm's own blocks a NeuTRENO / PID / Elliptical layer gets no cross-layer state and computes plain
    attention in every block - an experiment that silently compared attention with itself. It says so once;
    the registered models, which pass the state, say nothing."""
    import warnings

    plain = timm.create_model("vit_tiny_patch16_224", img_size=28, patch_size=4, in_chans=1, num_classes=10,
                              depth=2, attn_layer=NeuTRENOAttention)
    with pytest.warns(UserWarning, match="ran without the cross-layer state.*StatefulBlocks"):
        plain(images())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mini("neutreno_vit_mini_patch4_28")(images())
