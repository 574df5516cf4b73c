"""timm's conventions for this package's models: the fast part of what ``make timm-compat`` checks with
timm's own model tests (which need the timm sdist): complete pretrained cfgs, ``features_only``, FX
tracing with torchvision's ``create_feature_extractor`` (forward and backward), and ``torch.compile``
with no graph break (so no host sync: a ``.item()`` or ``bool(tensor)`` would be one)."""

from __future__ import annotations

import pytest
import timm
import torch
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import RPCAttention
from kpca_attention.models import create_model, list_models
from kpca_attention.pap import pap

pytestmark = pytest.mark.usefixtures("single_thread")

# What a pretrained cfg says about weights that do not exist here (where from, under which licence).
WEIGHT_PROVENANCE = {"url", "hf_hub_id", "tag", "custom_load", "license", "architecture"}
# Small versions of each attention family (depth 2 keeps FX and dynamo fast).
SMALL = {
    "symvit_mini_patch4_28": {},
    "rpc_symvit_mini_patch4_28": dict(rpc_layers="all", rpc_iters=2),
    "rpc_vit_mini_patch4_28": dict(rpc_layers="all", rpc_iters=2),
    "rpc_symasym_vit_mini_patch4_28": dict(rpc_iters=2),
    "scaled_vit_mini_patch4_28": dict(scaled="matrix"),
}


def small(name: str, seed: int = 0, **kwargs) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model(name, depth=2, **SMALL[name], **kwargs)


def images(b: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list_models("vision"))
def test_pretrained_cfg_is_complete(name: str) -> None:
    """Every field of timm's own ViT cfg (bar weight provenance) is set, and consistent with the model."""
    timm_vit = timm.models.get_pretrained_cfg("vit_tiny_patch16_224").to_dict()
    cfg = timm.models.get_pretrained_cfg(name).to_dict()
    missing = set(timm_vit) - WEIGHT_PROVENANCE - set(cfg)
    assert not missing, f"{name}: pretrained cfg lacks {sorted(missing)}"
    assert cfg["fixed_input_size"] is True and cfg["pool_size"] is None
    model = timm.create_model(name, device="meta")  # structure only, no weights allocated
    chans, height, width = cfg["input_size"]
    assert model.in_chans == chans == len(cfg["mean"]) == len(cfg["std"])
    assert model.patch_embed.img_size == (height, width) and model.num_classes == cfg["num_classes"]
    params = dict(model.named_parameters())
    assert cfg["first_conv"] + ".weight" in params and cfg["classifier"] + ".weight" in params
    assert model.default_cfg == model.pretrained_cfg


@pytest.mark.parametrize("name", ["rpc_symvit_mini_patch4_28", "rpc_vit_mini_patch4_28"])
def test_features_only_uses_forward_intermediates(name: str) -> None:
    model = small(name, features_only=True, out_indices=(0, 1)).eval()
    feats = model(images())
    assert [tuple(f.shape) for f in feats] == [(2, 64, 7, 7)] * 2 == [
        (2, c, 7, 7) for c in model.feature_info.channels()
    ]
    vit = model.model  # the VisionTransformer inside timm's FeatureGetterNet, with its RPC layers
    assert type(vit.blocks[0].attn).__name__ == "RPCAttention"
    _, inter = vit.forward_intermediates(images(), indices=(0, 1), output_fmt="NCHW")
    for a, b in zip(feats, inter, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", list(SMALL))
def test_fx_feature_extractor_forward_and_backward(name: str) -> None:
    """torchvision's create_feature_extractor with its default tracer, as on timm's ViTs."""
    model = small(name).eval()
    train_nodes, eval_nodes = get_graph_node_names(model)
    if "rpc" in name:  # pap is one leaf node (torch.fx.wrap), its checks run when the graph runs
        assert "blocks.0.attn.pap" in eval_nodes
    fx = create_feature_extractor(model, return_nodes={"blocks.0": "block0", eval_nodes[-1]: "out"})
    x = images()
    got = fx(x)
    torch.testing.assert_close(got["out"], model(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["block0"], model.blocks[0](model._pos_embed(model.patch_embed(x))))

    model.train()
    fx = create_feature_extractor(
        model, train_return_nodes=[train_nodes[-1]], eval_return_nodes=[eval_nodes[-1]]
    )
    fx.train()
    next(iter(fx(x).values())).mean().backward()
    no_grad = [n for n, p in fx.named_parameters() if p.grad is None]
    assert not no_grad, f"no gradient for {no_grad}"


def test_fx_graph_keeps_the_eager_input_checks() -> None:
    model = small("rpc_symvit_mini_patch4_28").eval()
    fx = create_feature_extractor(model, return_nodes=[get_graph_node_names(model)[1][-1]])
    x = images()
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="k contains non-finite values"):
        fx(x)


def _breaks(fn, *args) -> list[str]:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args)
    return [f"{b.reason.splitlines()[0]} at {b.user_stack[-1] if b.user_stack else '?'}"
            for b in explained.break_reasons]


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_compile_rpc_vit_without_graph_breaks(train: bool) -> None:
    model = small("rpc_symvit_mini_patch4_28").train(train)
    with torch.set_grad_enabled(train):
        assert _breaks(model, images()) == []


def test_compile_rpc_lm_without_graph_breaks() -> None:
    torch.manual_seed(0)
    lm = create_model("rpc_symlm", vocab_size=50, preset="small", n_layer=2, rpc_layers="all", rpc_iters=2)
    idx = torch.randint(0, 50, (2, 12))
    assert _breaks(lm, idx) == []


def test_export_rpc_vit() -> None:
    model = small("rpc_symvit_mini_patch4_28").eval()
    x = images()
    exported = torch.export.export(model, (x,))
    torch.testing.assert_close(exported.module()(x), model(x))


@pytest.mark.parametrize(("sparse", "dual"), [(True, True), (False, True), (True, False), (False, False)])
def test_compiled_pap_equals_eager_forward_and_backward(sparse: bool, dual: bool) -> None:
    """What torch.compile traces (plain ops, every variant, masks) computes eager pap's values and
    gradients; fullgraph=True fails on any graph break, including a host sync in the mask handling."""
    g = torch.Generator().manual_seed(0)
    k, v, q = (torch.randn(2, 3, 9, 4, dtype=torch.float64, generator=g) for _ in range(3))
    pad = torch.ones(2, 9, dtype=torch.bool)
    pad[1, 6:] = False
    cases = [dict(q=q, attn_mask=pad, is_causal=True)]
    if sparse and dual:  # every mask path once for the full algorithm, the ablations with all at once
        cases += [dict(), dict(is_causal=True), dict(attn_mask=pad)]
    for extra in cases:
        def run(k, v, extra=extra):
            return pap(k, v, 3, 0.3, sparse=sparse, dual=dual, **extra)

        torch._dynamo.reset()  # each case compiles pap anew (the recompile limit is per code object)
        compiled = torch.compile(run, backend="aot_eager", fullgraph=True)
        ks, vs = k.clone().requires_grad_(), v.clone().requires_grad_()
        kc, vc = k.clone().requires_grad_(), v.clone().requires_grad_()
        expected, got = run(ks, vs), compiled(kc, vc)
        torch.testing.assert_close(got, expected)
        w = torch.randn_like(expected)
        (expected * w).sum().backward()
        (got * w).sum().backward()
        torch.testing.assert_close(kc.grad, ks.grad)
        torch.testing.assert_close(vc.grad, vs.grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a host sync exists only with an accelerator")
def test_rpc_layer_makes_no_host_sync_on_cuda() -> None:
    """Forward and backward of an RPC layer (no mask, causal, key padding) never wait for the device."""
    layer = RPCAttention(64, 4, n_iter=3).cuda()
    x = torch.randn(2, 17, 64, device="cuda", requires_grad=True)
    pad = torch.ones(2, 17, dtype=torch.bool, device="cuda")
    pad[1, 12:] = False
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for kwargs in (dict(), dict(is_causal=True), dict(attn_mask=pad)):
            layer(x, **kwargs).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
