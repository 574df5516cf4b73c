"""Twicing attention (issue 25): (2A - A^2) V against a float64 transcription with the N x N matrix formed,
gradcheck, masks, no leak from the future in the causal LM, the layer choice, timm models."""

from __future__ import annotations

import math

import pytest
import torch
from family_checks import assert_no_leak_from_the_future, case_mask, causal_lm, layer_gradcheck, timm_forward

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import TwicingAttention, get_mechanism
from kpca_attention.models import create_model

pytestmark = pytest.mark.usefixtures("single_thread")


def reference(layer: TwicingAttention, x: torch.Tensor, mask=None, causal=False) -> torch.Tensor:
    """The official SharpAttention: A = softmax(q k^T * scale); x = A v + A (v - A v); proj."""
    b, n, c = x.shape
    h, d = layer.num_heads, c // layer.num_heads
    w, bias = layer.in_proj.weight.double(), layer.in_proj.bias.double()
    parts = (x.double() @ w.T + bias).reshape(b, n, -1, h, d).permute(2, 0, 3, 1, 4)
    k, v = parts[-2], parts[-1]
    q = k if layer.symmetric else parts[0]
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    a = torch.softmax(s, dim=-1)
    out = (2 * a - a @ a) @ v
    out = out.transpose(1, 2).reshape(b, n, c)
    return out @ layer.proj.weight.double().T + layer.proj.bias.double()


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("case", ["plain", "causal", "padding"])
def test_matches_two_a_minus_a_squared(symmetric: bool, case: str) -> None:
    torch.manual_seed(0)
    layer = TwicingAttention(12, 3, qkv_bias=True, symmetric=symmetric).double()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    mask = case_mask(case, 7, keep=4)
    got = layer(x, attn_mask=mask, is_causal=case == "causal")
    torch.testing.assert_close(got, reference(layer, x, mask, case == "causal"))


def test_differs_from_plain_attention() -> None:
    """Not a disguised softmax attention: A^2 != A for a generic input."""
    torch.manual_seed(0)
    layer = TwicingAttention(8, 2).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    plain = torch.nn.functional.scaled_dot_product_attention
    p = layer.split_heads(x)
    assert not torch.allclose(layer.attend(p, None, False), plain(p["q"], p["k"], p["v"]))


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal: bool) -> None:
    torch.manual_seed(0)
    layer = TwicingAttention(6, 2, qkv_bias=True).double()
    x = torch.randn(1, 4, 6, dtype=torch.float64, requires_grad=True)
    assert layer_gradcheck(layer, x, causal)


def test_layers_and_options() -> None:
    mech = get_mechanism("twicing")
    assert mech.applied_blocks("vision", 12) == list(range(12))  # every layer
    assert mech.applied_blocks("lm", 16) == [14, 15]  # the official LM: layer_num >= 14
    assert mech.applied_blocks("lm", 4) == [3]
    assert mech.symmetric_ok and mech.asymmetric_ok and not mech.stateful
    with pytest.raises(ValueError, match="symmetric"):
        TwicingAttention(8, 2, symmetric="yes")
    lm = create_model("twicing_lm", vocab_size=20, preset="small", attn_layers="all")
    assert all(isinstance(b.attn, TwicingAttention) for b in lm.blocks)
    vit = create_model("twicing_vit_mini_patch4_28", attn_layers=[0])
    assert [type(b.attn).__name__.startswith("Twicing") for b in vit.blocks] == [True, False, False, False]


@pytest.mark.parametrize("name", ["twicing_lm", "twicing_symlm"])
def test_causal_lm_has_no_leak_from_the_future(name: str) -> None:
    assert_no_leak_from_the_future(causal_lm(name, n_layer=3, attn_layers="all"), n=12, t=5, shift=True)


@pytest.mark.parametrize("name", ["twicing_vit_mini_patch4_28", "twicing_symvit_mini_patch4_28"])
def test_timm_model_forward(name: str) -> None:
    model, _ = timm_forward(name)
    assert all(isinstance(b.attn, TwicingAttention) for b in model.blocks)


# ---- third mutation review (2026-11-30): each test fails on a mutant no earlier test caught
def test_twicing_first_smoothing_draws_its_own_dropout():
    """Module docstring: each fused call draws its own dropout mask; the first smoothing A V
    (``hook_av``) is dropped in training, so two draws differ and neither is the undropped A V."""
    from kpca_attention.attention import TwicingAttention, run_with_cache

    torch.manual_seed(0)
    layer = TwicingAttention(8, 2, attn_drop=0.5).train()
    x = torch.randn(1, 6, 8)
    avs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        with torch.no_grad():
            avs.append(run_with_cache(layer, x)[1]["hook_av"])
    with torch.no_grad():
        plain = run_with_cache(layer.eval(), x)[1]["hook_av"]
    assert not torch.allclose(avs[0], avs[1])
    assert not torch.allclose(avs[0], plain)
