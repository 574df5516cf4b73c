"""Elliptical attention (issue 25): softmax((Q diag(m)) K^T / sqrt D) V with m from the change of the
values between layers, against a float64 transcription of the official ``W_over_layers`` (mean, median,
the delta=None quotient), no gradient through m by default, gradcheck of the differentiable version,
masks (m per query over the keys it may see) and the causal LM's no-leak property."""

from __future__ import annotations

import functools

import pytest
import torch
from family_checks import (
    assert_no_leak_from_the_future,
    assert_stack_matches,
    case_mask,
    causal_lm,
    run_stack,
    stack_gradcheck,
)
from family_reference import heads, merge, softmax_attention, visible_matrix

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import EllipticalAttention, get_mechanism

pytestmark = pytest.mark.usefixtures("single_thread")


def stack(n_layers=3, dim=12, heads_=3, **opts):
    torch.manual_seed(0)
    return [EllipticalAttention(dim, heads_, qkv_bias=True, **opts).double() for _ in range(n_layers)]


def official_metric(q, q_last, v, v_last, delta=5.0, attenuation=1e-3, median=False):
    """``W_over_layers``: column-wise mean (or median) of |difference quotients|, max-scaled per (b, h)."""
    quot = (v - v_last) / delta if delta is not None else (v - v_last) / ((q - q_last).abs() + attenuation)
    if median:
        w = quot.abs().median(dim=-2).values
    else:
        w = quot.abs().sum(dim=-2) / v.shape[-2]  # torch.norm(p=1, dim=-2) / seqlen
    return (w / w.max(dim=-1, keepdim=True).values)[..., None, :]  # (B, H, 1, D)


def masked_metric(v, v_last, vis, delta=5.0, q=None, q_last=None, attenuation=1e-3):
    """Per query i: the mean over the keys j it may see of |v_j - v_last_j| / delta (delta None: of the
    quotient |v_j - v_last_j| / (|q_j - q_last_j| + attenuation)), max-scaled."""
    if delta is None:
        d = (v - v_last).abs() / ((q - q_last).abs() + attenuation)
    else:
        d = (v - v_last).abs() / delta  # (B, H, N, D)
    b, h, n, dd = d.shape
    m = torch.zeros(b, h, n, dd, dtype=d.dtype)
    for i in range(n):
        sel = vis[..., i, :]  # (B, H, N)
        m[:, :, i] = (d * sel[..., None]).sum(-2) / sel.sum(-1, keepdim=True).clamp_min(1)
    return m / m.amax(-1, keepdim=True)


def reference(layers, xs, attn_mask=None, causal=False, **opts):
    outs, prev = [], None
    for layer, x in zip(layers, xs, strict=True):
        p = heads(layer, x)
        vis = visible_matrix(x.shape[1], attn_mask, causal, p["v"].shape)
        q = p["q"]
        if prev is not None:
            if attn_mask is None and not causal:
                q = q * official_metric(p["q"], prev["q"], p["v"], prev["v"], **opts)
            else:
                q = q * masked_metric(p["v"], prev["v"], vis, opts.get("delta", 5.0), p["q"], prev["q"],
                                      opts.get("attenuation", 1e-3))
        outs.append(merge(layer, softmax_attention(q, p["k"], p["v"], vis)))
        prev = p
    return outs


def inputs(layers, n=7, seed=1, grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, 12, dtype=torch.float64, generator=g).requires_grad_(grad) for _ in layers]


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("opts", [{}, {"median": True}, {"delta": None}, {"delta": 2.0}],
                         ids=["official", "median", "quotient", "delta2"])
def test_matches_the_official_code(symmetric: bool, opts: dict) -> None:
    layers = stack(symmetric=symmetric, **opts)
    xs = inputs(layers)
    for got, want in zip(run_stack(layers, xs), reference(layers, xs, **opts), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("opts", [{}, {"delta": None}], ids=["official", "quotient"])
@pytest.mark.parametrize("case", ["causal", "padding"])
def test_masks_average_over_the_visible_keys(case: str, opts: dict) -> None:
    layers = stack(symmetric=False, **opts)
    xs = inputs(layers)
    ref = functools.partial(reference, **opts)
    assert_stack_matches(layers, xs, ref, case_mask(case, 7, keep=4), case == "causal")
    with pytest.raises(ValueError, match="median"):
        run_stack(stack(median=True), xs, is_causal=True)


def test_no_gradient_through_the_metric_by_default() -> None:
    """The default's input gradient is the reference's with m computed from detached tensors."""
    for differentiable in (False, True):
        layers = stack(2, differentiable=differentiable)
        xs = inputs(layers, grad=True)
        run_stack(layers, xs)[1].sum().backward()
        got = [torch.zeros_like(x) if x.grad is None else x.grad.clone() for x in xs]
        xs2 = inputs(layers, grad=True)
        p0, p1 = heads(layers[0], xs2[0]), heads(layers[1], xs2[1])
        m = official_metric(p1["q"], p0["q"], p1["v"], p0["v"])
        if not differentiable:
            m = m.detach()
        vis = visible_matrix(7, None, False, p1["v"].shape)
        merge(layers[1], softmax_attention(p1["q"] * m, p1["k"], p1["v"], vis)).sum().backward()
        want = [torch.zeros_like(x) if x.grad is None else x.grad for x in xs2]
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
        # the first layer's input reaches layer 1's output only through m
        assert bool(got[0].abs().sum() > 0) is differentiable


def test_gradcheck_differentiable_and_default() -> None:
    for differentiable in (True, False):
        layers = stack(2, dim=6, heads_=2, differentiable=differentiable)
        xs = [torch.randn(1, 4, 6, dtype=torch.float64, requires_grad=True) for _ in layers]
        if differentiable:
            assert stack_gradcheck(layers, xs)
        else:  # m constant: the analytic gradient is not the numerical one through m
            assert not stack_gradcheck(layers, xs, raise_exception=False)


def test_first_layer_plain_and_defaults() -> None:
    mech = get_mechanism("elliptical")
    assert mech.options("vision") == dict(delta=5.0, attenuation=1e-3, median=False, differentiable=False)
    layers = stack(1)
    x = inputs(layers)[0]
    p = heads(layers[0], x)
    vis = visible_matrix(7, None, False, p["v"].shape)
    want = merge(layers[0], softmax_attention(p["q"], p["k"], p["v"], vis))
    with pytest.warns(UserWarning, match="without the cross-layer state"):  # alone: a first layer
        torch.testing.assert_close(layers[0](x), want)
    with pytest.raises(ValueError, match="delta"):
        EllipticalAttention(8, 2, delta=0.0)


@pytest.mark.parametrize("name", ["elliptical_lm", "elliptical_symlm"])
def test_causal_lm_has_no_leak_from_the_future(name: str) -> None:
    assert_no_leak_from_the_future(causal_lm(name, n_layer=3), n=12, t=5)


# ---- third mutation review (2026-11-30): each test fails on a mutant no earlier test caught
def test_elliptical_built_without_options_passes_no_gradient_through_the_metric():
    """The documented default (official code): m is computed without gradient, so the first layer's
    input reaches the second layer's output only through m, and gets no gradient."""
    from kpca_attention.attention import EllipticalAttention

    torch.manual_seed(0)
    layers = [EllipticalAttention(12, 3, qkv_bias=True).double() for _ in range(2)]
    x0, x1 = (torch.randn(2, 6, 12, dtype=torch.float64, requires_grad=True) for _ in range(2))
    _, state = layers[0](x0, state={})
    out, _ = layers[1](x1, state=state)
    out.sum().backward()
    assert x0.grad is None or float(x0.grad.abs().sum()) == 0.0
    assert float(x1.grad.abs().sum()) > 0


def test_a_positive_delta_cancels_in_the_max_scaling():
    """m / delta is divided by its max over the dimensions, so every positive delta gives the same metric
    (the official code's property too; the docstring says so): only delta=None changes the model."""
    torch.manual_seed(0)
    x0, x1 = (torch.randn(2, 6, 12, dtype=torch.float64) for _ in range(2))
    outs = {}
    for delta in (5.0, 2.0, 0.01, None):
        torch.manual_seed(1)
        layers = [EllipticalAttention(12, 3, delta=delta).double() for _ in range(2)]
        _, state = layers[0](x0, state={})
        outs[delta], _ = layers[1](x1, state=state)
    for delta in (2.0, 0.01):
        torch.testing.assert_close(outs[delta], outs[5.0], rtol=0, atol=1e-12)
    assert (outs[None] - outs[5.0]).abs().max() > 1e-6
