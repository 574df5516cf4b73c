"""The attention layers inside a small timm VisionTransformer, and replace_attention."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from timm.layers import Attention
from timm.models.vision_transformer import VisionTransformer

from kpca_attention.attention import (
    HookPoint,
    RPCAttention,
    ScaledAttention,
    SymmetricAttention,
    configure,
    replace_attention,
    resolve_blocks,
    run_with_cache,
)
from kpca_attention.kpca.pap_trace import TraceRecorder
from kpca_attention.pap import pap

pytestmark = pytest.mark.usefixtures("single_thread")

DIM, HEADS, DEPTH, N_TOKENS = 48, 3, 2, 17  # 32 px / patch 8 = 16 patches + CLS
HEAD_DIM = DIM // HEADS

LAYERS = {
    "symmetric": SymmetricAttention,
    "rpc": configure(RPCAttention, n_iter=2),
    "rpc_asym": configure(RPCAttention, n_iter=2, symmetric=False),
    "scaled_scalar": configure(ScaledAttention, mode="scalar"),
    "scaled_matrix": configure(ScaledAttention, mode="matrix", num_tokens=N_TOKENS),
}


def vit(attn_layer=Attention, seed: int = 0, **kwargs) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(
        img_size=32, patch_size=8, embed_dim=DIM, depth=DEPTH, num_heads=HEADS, num_classes=10,
        attn_layer=attn_layer, **kwargs,
    )


def images(b: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.rand(b, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def randomise_scaled(model: torch.nn.Module) -> torch.nn.Module:
    """Make the zero-initialised Scaled Attention parameters (alpha, S) non-trivial."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("alpha", "scale_s")):
                p.normal_(0, 0.1)
    return model


@pytest.fixture(scope="module", params=list(LAYERS))
def layer_name(request) -> str:
    return request.param


def test_forward_backward_finite(layer_name: str) -> None:
    model = vit(LAYERS[layer_name])
    assert all(isinstance(b.attn, LAYERS[layer_name]) for b in model.blocks)
    out = model(images())
    assert out.shape == (2, 10)
    out.square().sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    # the new parameters of Scaled Attention start at 0 but do learn
    for name, p in model.named_parameters():
        if name.endswith(("alpha", "scale_s")):
            assert p.grad.abs().sum() > 0, name


def test_state_dict_round_trip(layer_name: str) -> None:
    model = randomise_scaled(vit(LAYERS[layer_name], seed=0))
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    other = vit(LAYERS[layer_name], seed=1)
    x = images()
    assert not torch.equal(model.eval()(x), other.eval()(x))
    other.load_state_dict(torch.load(buf, weights_only=True), strict=True)
    assert torch.equal(model(x), other(x))


def test_parameter_count_symmetric_vs_asymmetric() -> None:
    def count(m):
        return sum(p.numel() for p in m.parameters())

    asym, sym = count(vit(Attention)), count(vit(SymmetricAttention))
    # no query projection: DIM x DIM weights + DIM biases fewer per block (timm: qkv_bias=True)
    assert asym - sym == DEPTH * (DIM * DIM + DIM)
    assert count(vit(LAYERS["rpc"])) == sym
    assert count(vit(LAYERS["rpc_asym"])) == asym
    assert count(vit(LAYERS["scaled_scalar"])) == asym + DEPTH
    assert count(vit(LAYERS["scaled_matrix"])) == asym + DEPTH * HEADS * N_TOKENS**2


def test_hooks_see_heads(layer_name: str) -> None:
    model = vit(LAYERS[layer_name]).eval()
    seen: dict[str, tuple] = {}
    attn = model.blocks[1].attn
    for name in ("hook_q", "hook_k", "hook_v"):
        getattr(attn, name).register_forward_hook(
            lambda mod, inp, out, name=name: seen.__setitem__(name, tuple(out.shape))
        )
    model(images(b=2))
    assert seen == {name: (2, HEADS, N_TOKENS, HEAD_DIM) for name in ("hook_q", "hook_k", "hook_v")}


def test_hook_z_is_what_the_output_projection_merges(layer_name: str) -> None:
    """hook_z holds the heads' outputs: merged and projected they give the layer's output, and a hook that
    changes them changes the layer's output as the projection says (an intervention, as in
    TransformerLens)."""
    from kpca_attention.attention import run_with_cache

    model = randomise_scaled(vit(LAYERS[layer_name])).eval()
    attn = model.blocks[1].attn
    outs = {}
    handle = attn.register_forward_hook(lambda m, i, o: outs.__setitem__("attn", o))
    with torch.no_grad():
        _, cache = run_with_cache(model, images(b=2), names_filter="blocks.1.attn.hook_z")
        z = cache["blocks.1.attn.hook_z"]
        assert z.shape == (2, HEADS, N_TOKENS, HEAD_DIM)
        torch.testing.assert_close(attn.proj(z.transpose(1, 2).reshape(2, N_TOKENS, DIM)), outs["attn"])
        attn.hook_z.register_forward_hook(lambda m, i, o: torch.zeros_like(o))
        model(images(b=2))
    handle.remove()
    torch.testing.assert_close(outs["attn"], attn.proj.bias.expand(2, N_TOKENS, DIM))


def test_causal_and_masked_forward(layer_name: str) -> None:
    """timm's attn_mask / is_causal reach the layers; under is_causal nothing flows backwards."""
    model = randomise_scaled(vit(LAYERS[layer_name])).eval()
    x = images()
    x2 = x.clone()
    x2[:, :, 24:, 24:] = torch.rand(2, 3, 8, 8)  # the last patch = the last token only
    with torch.no_grad():
        a = model.forward_features(x, is_causal=True)
        b = model.forward_features(x2, is_causal=True)
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a[:, :-1], b[:, :-1], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, -1], b[:, -1])

    # a boolean mask hiding the last 5 tokens as keys: changing them does not move the others
    mask = torch.ones(2, 1, N_TOKENS, N_TOKENS, dtype=torch.bool)
    mask[..., -5:] = False
    x3 = x.clone()
    x3[:, :, 24:, :] = torch.rand(2, 3, 8, 32)  # the last four patches
    with torch.no_grad():
        a = model.forward_features(x, attn_mask=mask)
        b = model.forward_features(x3, attn_mask=mask)
        unmasked = model.forward_features(x)
    torch.testing.assert_close(a[:, :-5], b[:, :-5], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, :-5], unmasked[:, :-5])


def test_pap_hook_points() -> None:
    """PAP's inner states as named hook points, read by run_with_cache (was record_trace / last_trace)."""
    model = vit(configure(RPCAttention, n_iter=3)).eval()
    assert model.blocks[0].attn.pap_hooks() is None  # no hook: nothing extra is computed
    with torch.no_grad():
        fast = model(images())
        out, cache = run_with_cache(model, images())
    torch.testing.assert_close(out, fast)  # the reference loop that forms the states: the same output
    density = [cache[f"blocks.0.attn.hook_S_density.{t}"] for t in range(3)]
    assert len(density) == 3 and f"blocks.0.attn.hook_S_density.{3}" not in cache
    assert density[0].double().mean(0).shape == (HEADS,)
    assert {"blocks.0.attn.hook_mu", "blocks.0.attn.hook_tau", "blocks.0.attn.hook_L.2",
            "blocks.0.attn.hook_W.0", "blocks.1.attn.hook_k"} <= set(cache)
    torch.testing.assert_close(cache["blocks.0.attn.hook_tau"], 4.0 * cache["blocks.0.attn.hook_mu"])
    assert model.blocks[0].attn.pap_hooks() is None  # run_with_cache removed its hooks
    _, only = run_with_cache(model, images(), names_filter=lambda name: name.endswith("hook_mu"))
    assert sorted(only) == ["blocks.0.attn.hook_mu", "blocks.1.attn.hook_mu"]
    plain = vit(LAYERS["symmetric"])
    _, cache = run_with_cache(plain, images())
    assert not any("hook_S_density" in name for name in cache) and "blocks.0.attn.hook_k" in cache
    assert all(isinstance(m, HookPoint) for name, m in plain.named_modules() if name.endswith("hook_q"))


def test_rpc_dropout_only_in_training() -> None:
    model = vit(configure(RPCAttention, n_iter=2), attn_drop_rate=0.3)
    x = images()
    model.train()
    assert not torch.equal(model(x), model(x))
    model.eval()
    assert torch.equal(model(x), model(x))


def test_scaled_matrix_wrong_length() -> None:
    layer = ScaledAttention(DIM, HEADS, mode="matrix", num_tokens=N_TOKENS)
    with pytest.raises(ValueError, match=r"built for 17 tokens, got 10"):
        layer(torch.randn(2, 10, DIM))
    with pytest.raises(ValueError, match=r"needs num_tokens"):
        ScaledAttention(DIM, HEADS, mode="matrix")
    with pytest.raises(ValueError, match=r"ScaledAttention: mode must be one of scalar, matrix; got"):
        ScaledAttention(DIM, HEADS, mode="vector")


def test_layer_argument_errors() -> None:
    with pytest.raises(TypeError):
        configure(RPCAttention, n_iters=3)(DIM, HEADS)  # a misspelt option is not swallowed
    with pytest.raises(ValueError, match="gated"):
        SymmetricAttention(DIM, HEADS, gated=True)
    with pytest.raises(ValueError, match="divisible"):
        SymmetricAttention(DIM, 5)
    with pytest.raises(ValueError, match="unknown threshold"):
        RPCAttention(DIM, HEADS, threshold="paper")
    with pytest.raises(ValueError, match="n_iter"):
        RPCAttention(DIM, HEADS, n_iter=0)
    with pytest.raises(ValueError, match=r"x must be \(B, N, 48\)"):
        SymmetricAttention(DIM, HEADS)(torch.randn(2, 5, 47))
    with pytest.raises(ValueError, match="out of range"):
        resolve_blocks([0, 5], DEPTH)
    assert resolve_blocks("first", 4) == [0] and resolve_blocks("0,-1", 4) == [0, 3]


# ----------------------------------------------------------------------------- replace_attention


def _qkv_heads(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v of a timm Attention from its qkv rows, (B, H, N, D)."""
    b, n, _ = x.shape
    qkv = F.linear(x, attn.qkv.weight, attn.qkv.bias).reshape(b, n, 3, HEADS, HEAD_DIM)
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def test_replace_with_symmetric_carries_weights() -> None:
    model = vit(Attention).eval()
    old = model.blocks[0].attn
    x = torch.randn(2, N_TOKENS, DIM)
    _, k, v = _qkv_heads(old, x)
    with torch.no_grad():
        attn = torch.softmax(k @ k.transpose(-2, -1) / math.sqrt(HEAD_DIM), dim=-1)
        expected = old.proj((attn @ v).transpose(1, 2).reshape(2, N_TOKENS, DIM))
    assert replace_attention(model, SymmetricAttention, blocks="first") == [0]
    new = model.blocks[0].attn
    assert isinstance(new, SymmetricAttention) and isinstance(model.blocks[1].attn, Attention)
    assert not new.training
    with torch.no_grad():
        torch.testing.assert_close(new(x), expected, rtol=1e-5, atol=1e-6)


def test_replace_rpc_one_step_huge_threshold_is_symmetric() -> None:
    model_sym, model_rpc = vit(Attention).eval(), vit(Attention).eval()
    replace_attention(model_sym, SymmetricAttention)
    assert replace_attention(model_rpc, RPCAttention, n_iter=1, lam=1e8) == [0, 1]
    assert model_rpc.blocks[1].attn.n_iter == 1
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(model_rpc(x), model_sym(x), rtol=0, atol=1e-6)
        # and the layer computes pap on the carried K, V
        layer = model_rpc.blocks[0].attn
        h = torch.randn(2, N_TOKENS, DIM)
        heads = layer.split_heads(h)
        out = pap(heads["k"], heads["v"], 1, 1e8).transpose(1, 2).reshape(2, N_TOKENS, DIM)
        torch.testing.assert_close(layer(h), layer.proj(out))


@pytest.mark.parametrize("mode", ["scalar", "matrix"])
def test_replace_with_scaled_at_init_is_the_original(mode: str) -> None:
    model = vit(Attention).eval()
    x = images()
    with torch.no_grad():
        before = model(x)
        h = torch.randn(2, N_TOKENS, DIM, generator=torch.Generator().manual_seed(3))
        layer_out = model.blocks[1].attn(h)
    kwargs = {"num_tokens": N_TOKENS} if mode == "matrix" else {}
    replace_attention(model, ScaledAttention, blocks=[1], mode=mode, **kwargs)
    with torch.no_grad():
        assert torch.equal(model(x), before)
        assert torch.equal(model.blocks[1].attn(h), layer_out)


def test_replace_symmetric_to_asymmetric_takes_q_from_k() -> None:
    model = vit(SymmetricAttention).eval()
    sym = model.blocks[0].attn
    replace_attention(model, configure(RPCAttention, symmetric=False), blocks=0)
    new = model.blocks[0].attn
    w_q, w_k, w_v = new.qkv.weight.chunk(3, 0)
    w_k_old, w_v_old = sym.kv.weight.chunk(2, 0)
    assert torch.equal(w_q, w_k_old) and torch.equal(w_k, w_k_old) and torch.equal(w_v, w_v_old)
    assert torch.equal(new.proj.weight, sym.proj.weight)


def test_replace_rejects_non_vit() -> None:
    with pytest.raises(TypeError, match="no .blocks"):
        replace_attention(torch.nn.Linear(2, 2), SymmetricAttention)


@pytest.mark.parametrize(("sparse", "dual"), [(False, True), (True, False)])
def test_rpc_ablation_switches_reach_pap(sparse: bool, dual: bool) -> None:
    """sparse / dual of RPCAttention are PAP's: the attention output is pap(k, v, ...) with them."""
    layer = RPCAttention(DIM, HEADS, n_iter=3, lam=0.05, sparse=sparse, dual=dual).eval()
    seen = {}
    layer.hook_k.register_forward_hook(lambda m, i, o: seen.__setitem__("k", o))
    layer.hook_v.register_forward_hook(lambda m, i, o: seen.__setitem__("v", o))
    x = torch.randn(2, N_TOKENS, DIM, generator=torch.Generator().manual_seed(3))
    out, cache = run_with_cache(layer, x)
    heads = pap(seen["k"], seen["v"], 3, 0.05, sparse=sparse, dual=dual)
    expected = layer.proj(heads.transpose(1, 2).reshape(2, N_TOKENS, DIM))
    torch.testing.assert_close(out, expected)
    full = RPCAttention(DIM, HEADS, n_iter=3, lam=0.05)
    full.load_state_dict(layer.state_dict())
    assert (full(x) - out).abs().max() > 1e-4  # the switch changed the operator
    trace = TraceRecorder(layer).attach()
    layer(x)
    trace.detach()
    if not sparse:
        assert max(trace.last["s_density"]) == 0.0
        assert max(float(cache[f"hook_S_density.{t}"].max()) for t in range(3)) == 0.0
    if not dual:
        assert max(trace.last["dual_norm"]) == 0.0
        assert not any(cache[f"hook_W.{t}"].any() for t in range(3))
    assert ("sparse=False" in repr(layer)) != sparse and ("dual=False" in repr(layer)) != dual


@pytest.mark.parametrize("num_heads", [0, -3, 2.5, True])
def test_bad_head_count_is_a_value_error(num_heads) -> None:
    with pytest.raises(ValueError, match=r"num_heads must be an integer >= 1; got"):
        RPCAttention(64, num_heads)  # 0 was a ZeroDivisionError


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mu_dim": 0}, r"RPCAttention: mu_dim must be None \(the full width H \* D\) or an integer >= 1, "
                        r"got 0"),
        ({"mu_dim": -16}, r"mu_dim must be None .* got -16"),
        ({"n_iter": True}, r"RPCAttention: n_iter must be an integer >= 1 .* got True"),
        ({"lam": float("inf")}, r"RPCAttention: lam must be a finite number > 0"),
        ({"sparse": 0}, r"RPCAttention: sparse must be True or False; got 0"),
        ({"validate": "always"}, r"RPCAttention: validate must be True or False or None"),
    ],
)
def test_rpc_options_are_checked_at_construction(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        RPCAttention(DIM, HEADS, **kwargs)


def test_rpc_validate_reaches_pap() -> None:
    x = torch.randn(2, N_TOKENS, DIM)
    x[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="k contains non-finite values"):
        RPCAttention(DIM, HEADS, n_iter=2)(x)  # default: values checked on the CPU
    out = RPCAttention(DIM, HEADS, n_iter=2, validate=False)(x)  # unchecked: no error, NaN flows on
    assert torch.isnan(out).any()


class _SeparateQKV(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.num_heads = HEADS
        self.q, self.k, self.v = (torch.nn.Linear(DIM, DIM) for _ in range(3))
        self.proj = torch.nn.Linear(DIM, DIM)


class _NoDropoutAttention(torch.nn.Module):
    """timm's layout without attn_drop / proj_drop attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads = HEADS
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)


def _with_attn(make) -> VisionTransformer:
    model = vit()
    for blk in model.blocks:
        blk.attn = make()
    return model


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: torch.nn.MultiheadAttention(DIM, HEADS, batch_first=True),
         r"block 0: cannot replace MultiheadAttention: no fused `qkv` nn.Linear \(it has in_proj_weight\); "
         r"no `proj` nn.Linear \(it has `out_proj`\)\. replace_attention needs timm's Attention layout"),
        (_SeparateQKV, r"cannot replace _SeparateQKV: no fused `qkv` nn.Linear \(it has q, k, v\)\."),
        (torch.nn.Identity, r"cannot replace Identity: no fused `qkv`.*no `proj`.*no integer `num_heads`"),
    ],
)
def test_replace_says_what_it_needs(make, match) -> None:
    model = _with_attn(make)
    before = [type(b.attn) for b in model.blocks]
    with pytest.raises(ValueError, match=match):
        replace_attention(model, SymmetricAttention)
    assert [type(b.attn) for b in model.blocks] == before  # nothing replaced


def test_replace_without_dropout_attributes_means_no_dropout() -> None:
    model = _with_attn(_NoDropoutAttention)
    old = model.blocks[1].attn
    assert replace_attention(model, SymmetricAttention, "last") == [1]
    new = model.blocks[1].attn
    assert isinstance(new, SymmetricAttention) and new.attn_drop.p == 0.0 and new.proj_drop.p == 0.0
    assert torch.equal(new.kv.weight, old.qkv.weight[DIM:]) and torch.equal(new.proj.weight, old.proj.weight)


def test_replace_blocks_without_attn() -> None:
    model = vit()
    model.blocks[0] = torch.nn.Identity()
    with pytest.raises(ValueError, match=r"block 0 \(Identity\) has no `attn` module to replace"):
        replace_attention(model, SymmetricAttention)


@pytest.mark.parametrize("mode", ["scalar", "matrix"])
@pytest.mark.parametrize("mask", ["none", "causal", "padded"])
def test_scaled_attention_is_its_formula(mode, mask) -> None:
    """Remark 3 / appendix E.1: A (I - S) V, A = softmax(Q K^T / sqrt d), S = alpha softmax(K K^T / sqrt d)
    (scalar) or a learned (H, N, N) S with A's mask (matrix), against a float64 transcription with S != 0."""
    from kpca_attention.attention import ScaledAttention

    torch.manual_seed(0)
    b, h, n, d = 2, 2, 7, 4
    layer = ScaledAttention(h * d, h, mode=mode, num_tokens=n).double()
    with torch.no_grad():
        if mode == "scalar":
            layer.alpha.fill_(0.7)
        else:
            layer.scale_s.copy_(torch.randn(h, n, n, dtype=torch.float64))
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(3))
    keep = torch.ones(b, 1, n, n, dtype=torch.bool)
    if mask == "causal":
        keep = keep & torch.ones(n, n, dtype=torch.bool).tril()
    elif mask == "padded":
        keep[1, ..., -3:] = False  # the second sequence's last three keys are padding
    out = layer.attend({"q": q, "k": k, "v": v}, keep if mask == "padded" else None, mask == "causal")

    def softmax(x):
        return torch.softmax(x.masked_fill(~keep, float("-inf")), -1)

    a = softmax(q @ k.transpose(-1, -2) / d ** 0.5)
    if mode == "scalar":
        s = 0.7 * softmax(k @ k.transpose(-1, -2) / d ** 0.5)
    else:
        s = torch.where(keep, layer.scale_s.detach(), 0.0)
    torch.testing.assert_close(out, a @ (v - s @ v))


# ---- third mutation review (2026-11-30): each test fails on a mutant no earlier test caught
def test_asymmetric_rpc_attends_with_its_queries():
    """symmetric=False (the paper's E.9, the rpc_vit models): softmax(Q (K - S - Y/mu)^T) V, i.e. pap with
    q = the layer's queries - not the symmetric pap that ignores them."""
    from family_reference import heads, merge

    from kpca_attention.attention import RPCAttention
    from kpca_attention.pap import pap

    torch.manual_seed(0)
    layer = RPCAttention(8, 2, qkv_bias=True, symmetric=False).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    p = heads(layer, x)
    kw = dict(mu_dim=layer.mu_dim, threshold=layer.threshold)
    want = merge(layer, pap(p["k"], p["v"], layer.n_iter, layer.lam, q=p["q"], **kw))
    without_q = merge(layer, pap(p["k"], p["v"], layer.n_iter, layer.lam, **kw))
    assert (want - without_q).abs().max() > 1e-3
    torch.testing.assert_close(layer(x), want)
