"""RVT's position-aware attention scaling (issue 25): softmax((Q K^T / sqrt D) * sigmoid(W_p)) V against a
float64 transcription, the resize of W_p (bilinear over the patch grid, written as interpolation matrices;
crop for the LM), gradcheck, masks, no leak from the future, the first-blocks default, timm models."""

from __future__ import annotations

import math

import family_checks
import pytest
import timm
import torch
import torch.nn.functional as F
from family_checks import assert_no_leak_from_the_future, case_mask, causal_lm, layer_gradcheck, timm_forward

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import PositionAwareAttention, get_mechanism
from kpca_attention.attention.rvt import first_five_twelfths, resize_position_scale
from kpca_attention.models import create_model

pytestmark = pytest.mark.usefixtures("single_thread")


def make(n_tokens=5, symmetric=False, **kw):
    torch.manual_seed(0)
    layer = PositionAwareAttention(8, 2, qkv_bias=True, num_tokens=n_tokens, symmetric=symmetric, **kw)
    layer = layer.double()
    with torch.no_grad():
        layer.position_scale.normal_(0, 2)  # away from the constant init, so the scaling is seen
    return layer


def reference(layer, x, w, mask=None, causal=False):
    b, n, c = x.shape
    h, d = layer.num_heads, c // layer.num_heads
    parts = (x.double() @ layer.in_proj.weight.double().T + layer.in_proj.bias.double())
    parts = parts.reshape(b, n, -1, h, d).permute(2, 0, 3, 1, 4)
    k, v = parts[-2], parts[-1]
    q = k if layer.symmetric else parts[0]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d) * torch.sigmoid(w.double())
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, n, c)
    return out @ layer.proj.weight.double().T + layer.proj.bias.double()


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("case", ["plain", "causal", "padding"])
def test_matches_the_equation(symmetric: bool, case: str) -> None:
    layer = make(symmetric=symmetric)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = case_mask(case, 5, keep=3)
    got = layer(x, attn_mask=mask, is_causal=case == "causal")
    torch.testing.assert_close(got, reference(layer, x, layer.position_scale, mask, case == "causal"))


def interp_matrix(g0: int, g1: int) -> torch.Tensor:
    """(g1^2, g0^2): column m is the bilinear resize of the m-th basis image (the resize is linear)."""
    eye = torch.eye(g0 * g0, dtype=torch.float64).reshape(-1, 1, g0, g0)
    out = F.interpolate(eye, size=(g1, g1), mode="bilinear", align_corners=False)
    return out.reshape(g0 * g0, g1 * g1).T


def test_resize_interpolates_the_patch_grid_and_keeps_the_prefix() -> None:
    torch.manual_seed(0)
    g0, g1, p = 3, 4, 1
    w = torch.randn(2, p + g0 * g0, p + g0 * g0, dtype=torch.float64)
    m = interp_matrix(g0, g1)
    want = torch.empty(2, p + g1 * g1, p + g1 * g1, dtype=torch.float64)
    want[:, :p, :p] = w[:, :p, :p]
    want[:, :p, p:] = w[:, :p, p:] @ m.T
    want[:, p:, :p] = m @ w[:, p:, :p]
    want[:, p:, p:] = m @ w[:, p:, p:] @ m.T
    torch.testing.assert_close(resize_position_scale(w, p + g1 * g1, p), want)
    torch.testing.assert_close(resize_position_scale(w, p + g0 * g0, p), w)
    torch.testing.assert_close(resize_position_scale(w, 4, p, "crop"), w[:, :4, :4])
    with pytest.raises(ValueError, match="square"):
        resize_position_scale(w, 1 + 7, p)
    with pytest.raises(ValueError, match="crop"):
        resize_position_scale(w, 20, p, "crop")
    # the layer uses the resized W_p for another token count
    layer = make(n_tokens=p + g0 * g0)
    x = torch.randn(1, p + g1 * g1, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(x), reference(layer, x, resize_position_scale(layer.position_scale,
                                                                                       p + g1 * g1, p)))


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal: bool) -> None:
    layer = make(n_tokens=4)
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert layer_gradcheck(layer, x, causal)
    layer(x.detach()).sum().backward()
    assert layer.position_scale.grad.abs().sum() > 0


def test_defaults_and_layers() -> None:
    mech = get_mechanism("rvt")
    assert first_five_twelfths(12) == [0, 1, 2, 3, 4] and first_five_twelfths(4) == [0, 1]
    assert mech.applied_blocks("vision", 12) == [0, 1, 2, 3, 4]
    assert mech.options("lm")["resize"] == "crop" and mech.options("vision")["resize"] == "interpolate"
    assert PositionAwareAttention(8, 2, num_tokens=3).position_scale.abs().sum() == 0  # init 0
    with pytest.raises(ValueError, match="resize"):
        PositionAwareAttention(8, 2, resize="bicubic")
    vit = timm.create_model("rvt_vit_tiny_patch16_224", device="meta")
    assert [isinstance(b.attn, PositionAwareAttention) for b in vit.blocks] == [True] * 5 + [False] * 7
    assert vit.blocks[0].attn.position_scale.shape == (3, 197, 197)
    seg = create_model("segmenter_rvt_vit_mini_patch4_32")
    assert seg.encoder.blocks[0].attn.position_scale.shape == (4, 65, 65)
    assert seg(torch.randn(1, 3, 32, 32)).shape == (1, 150, 32, 32)


def test_causal_lm_has_no_leak_from_the_future() -> None:
    lm = causal_lm("rvt_lm", n_layer=2)
    assert isinstance(lm.blocks[0].attn, PositionAwareAttention)
    with torch.no_grad():
        for blk in lm.blocks[:1]:
            blk.attn.position_scale.normal_(0, 2)
    assert_no_leak_from_the_future(lm, n=10, t=4, shift=True)


@pytest.mark.parametrize("context", [64, 300])
def test_the_lms_position_scale_spans_its_context(context: int) -> None:
    """W_p was built at 256 positions whatever the context: 94 % of it unused at context 64 (the parameter
    counts of zoo-language inflated), and a context over 256 failed in the forward."""
    lm = causal_lm("rvt_lm", n_layer=2, context=context)
    assert lm.blocks[0].attn.position_scale.shape == (4, context, context)
    with torch.no_grad():
        logits, _ = lm(torch.randint(0, 30, (1, context)))
    assert logits.shape == (1, context, 30)
    assert causal_lm("rvt_lm", n_layer=2, attn_kwargs={"num_tokens": 100}).blocks[0].attn.num_tokens == 100


def test_a_classifiers_position_scales_load_into_a_segmenter_of_another_window() -> None:
    """load_encoder_weights resampled only pos_embed: a trained RVT classifier's W_p (H, 50, 50) did not fit a
    Segmenter's (H, 65, 65) and loading failed with a shape error."""
    from kpca_attention.attention.rvt import resize_position_scale
    from kpca_attention.models.segmenter import load_encoder_weights

    torch.manual_seed(0)
    clf = timm.create_model("rvt_vit_mini_patch4_28")
    with torch.no_grad():
        clf.blocks[0].attn.position_scale.normal_()
    seg = create_model("segmenter_rvt_vit_mini_patch4_32", num_classes=3, in_chans=1)
    assert seg.encoder.blocks[0].attn.position_scale.shape == (4, 65, 65)
    load_encoder_weights(seg, clf.state_dict())
    want = resize_position_scale(clf.blocks[0].attn.position_scale.detach(), 65, 1, "interpolate")
    torch.testing.assert_close(seg.encoder.blocks[0].attn.position_scale.detach(), want)


def test_timm_model_forward() -> None:
    model, _ = timm_forward("rvt_vit_mini_patch4_28")
    assert model.blocks[0].attn.position_scale.shape == (4, 50, 50)


# ---- third mutation review (2026-11-30): each test fails on a mutant no earlier test caught
def test_rvt_adds_a_float_masks_finite_biases_to_the_scaled_logits():
    """softmax((Q K^T / sqrt D) * sigmoid(W_p) + B) V for a float mask B with finite entries."""
    from family_reference import heads, merge

    from kpca_attention.attention import PositionAwareAttention

    torch.manual_seed(0)
    layer = PositionAwareAttention(8, 2, qkv_bias=True, num_tokens=5).double()
    with torch.no_grad():
        layer.position_scale.normal_(0, 2)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    bias = family_checks.finite_bias_mask(5)
    p = heads(layer, x)
    s = (p["q"] @ p["k"].transpose(-1, -2)) / math.sqrt(4) * torch.sigmoid(layer.position_scale.double())
    want = merge(layer, torch.softmax(s + bias, -1) @ p["v"])
    torch.testing.assert_close(layer(x, attn_mask=bias), want)
