"""NeuTRENO (issue 25): A V + lambda (V^0 - V^l) against a float64 transcription of the official
DeiT code's equation, gradcheck, masks, the causal LM's no-leak property, registry defaults."""

from __future__ import annotations

import pytest
import torch
from family_checks import (
    assert_no_leak_from_the_future,
    assert_stack_matches,
    case_mask,
    causal_lm,
    stack_gradcheck,
)
from family_reference import heads, layer_attention, merge, softmax_attention

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import NeuTRENOAttention, get_mechanism
from kpca_attention.models import create_model

pytestmark = pytest.mark.usefixtures("single_thread")


def stack(n_layers: int = 3, dim: int = 12, heads_: int = 3, symmetric: bool = False, lam: float = 0.6):
    torch.manual_seed(0)
    return [NeuTRENOAttention(dim, heads_, qkv_bias=True, symmetric=symmetric, lam=lam).double()
            for _ in range(n_layers)]


def reference(layers, xs, attn_mask=None, causal=False):
    """Official: layer 0 returns (attn(x), v); layer l > 0 adds alpha * (v0 - v) before the projection."""
    outs, v0 = [], None
    for i, (layer, x) in enumerate(zip(layers, xs, strict=True)):
        p, o = layer_attention(layer, x, attn_mask, causal)
        if i == 0:
            v0 = p["v"]
        else:
            o = o + layer.lam * (v0 - p["v"])
        outs.append(merge(layer, o))
    return outs


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("case", ["plain", "causal", "padding"])
def test_matches_the_equation(symmetric: bool, case: str) -> None:
    layers = stack(symmetric=symmetric)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 7, 12, dtype=torch.float64, generator=g) for _ in layers]
    assert_stack_matches(layers, xs, reference, case_mask(case, 7, keep=5), case == "causal")


def test_first_layer_alone_is_plain_attention_and_v0_not_detached() -> None:
    layers = stack(2)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    want = merge(layers[0], softmax_attention(*(heads(layers[0], x)[n] for n in "qkv"),
                                              torch.ones(2, 3, 5, 5, dtype=torch.bool)))
    with pytest.warns(UserWarning, match="without the cross-layer state"):  # alone: a first layer
        torch.testing.assert_close(layers[0](x), want)
    # gradient reaches layer 0's value projection through layer 1's fidelity term alone
    state = {}
    _, state = layers[0](x, state=state)
    out, _ = layers[1](x, state=state)
    out.sum().backward()
    assert layers[0].in_proj.weight.grad is not None and layers[0].in_proj.weight.grad.abs().sum() > 0


def test_gradcheck() -> None:
    layers = stack(2, dim=6, heads_=2)
    x0 = torch.randn(1, 4, 6, dtype=torch.float64, requires_grad=True)
    x1 = torch.randn(1, 4, 6, dtype=torch.float64, requires_grad=True)
    assert stack_gradcheck(layers, [x0, x1])


def test_defaults_and_options() -> None:
    mech = get_mechanism("neutreno")
    assert mech.options("vision") == {"lam": 0.6} and mech.options("lm") == {"lam": 0.4}
    assert mech.stateful and mech.symmetric_ok and mech.asymmetric_ok
    with pytest.raises(ValueError, match="lam"):
        NeuTRENOAttention(8, 2, lam="big")
    with pytest.raises(TypeError, match="unknown option"):
        mech.options("vision", alpha=0.3)
    lm = create_model("neutreno_lm", vocab_size=20, preset="small", n_layer=2)
    assert all(b.attn.lam == 0.4 for b in lm.blocks)
    vit = create_model("neutreno_vit_mini_patch4_28", depth=2, attn_kwargs={"lam": 0.3})
    assert all(b.attn.lam == 0.3 for b in vit.blocks)


@pytest.mark.parametrize("name", ["neutreno_lm", "neutreno_symlm"])
def test_causal_lm_has_no_leak_from_the_future(name: str) -> None:
    assert_no_leak_from_the_future(causal_lm(name, n_layer=3), n=12, t=5)
