"""PIDformer (issue 25): the discrete PID on the layer error e^l = V^0 - V^l against a float64
transcription, its P-only case equal to NeuTRENO, gradcheck, masks, the causal LM's no-leak property."""

from __future__ import annotations

import pytest
import torch
from family_checks import (
    OpNames,
    assert_no_leak_from_the_future,
    assert_stack_matches,
    case_mask,
    causal_lm,
    run_stack,
    stack_gradcheck,
)
from family_reference import layer_attention, merge

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import NeuTRENOAttention, PIDAttention, get_mechanism
from kpca_attention.pap import kernels

pytestmark = pytest.mark.usefixtures("single_thread")


def stack(n_layers=4, dim=12, heads_=3, symmetric=False, applied=None, **gains):
    torch.manual_seed(0)
    return [PIDAttention(dim, heads_, qkv_bias=True, symmetric=symmetric,
                         applied=applied is None or i in applied, **gains).double()
            for i in range(n_layers)]


def reference(layers, xs, attn_mask=None, causal=False):
    """u^l = A V + kp e^l + ki sum_{m<=l} e^m + kd (e^l - e^{l-1}), e^l = V^0 - V^l, e^0 = 0."""
    outs, errors, v0 = [], [], None
    for i, (layer, x) in enumerate(zip(layers, xs, strict=True)):
        p, o = layer_attention(layer, x, attn_mask, causal)
        if i == 0:
            v0 = p["v"]
            errors.append(torch.zeros_like(v0))
        else:
            e = v0 - p["v"]
            errors.append(e)
            if layer.applied:
                o = o + layer.kp * e + layer.ki * sum(errors[1:]) + layer.kd * (e - errors[-2])
        outs.append(merge(layer, o))
    return outs


def inputs(layers, n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, 12, dtype=torch.float64, generator=g) for _ in layers]


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("case", ["plain", "causal", "padding", "skip-layer"])
def test_matches_the_equation(symmetric: bool, case: str) -> None:
    layers = stack(symmetric=symmetric, applied=[0, 1, 3] if case == "skip-layer" else None,
                   kp=0.7, ki=0.3, kd=0.2)
    xs = inputs(layers)
    assert_stack_matches(layers, xs, reference, case_mask(case, 7, keep=5), case == "causal")


def test_p_only_is_neutreno() -> None:
    pid = stack(3, kp=0.6, ki=0.0, kd=0.0)
    torch.manual_seed(0)
    neu = [NeuTRENOAttention(12, 3, qkv_bias=True, lam=0.6).double() for _ in range(3)]
    for a, b in zip(pid, neu, strict=True):
        b.load_state_dict(a.state_dict())
    xs = inputs(pid)
    for got, want in zip(run_stack(pid, xs, is_causal=True), run_stack(neu, xs, is_causal=True), strict=True):
        torch.testing.assert_close(got, want)


def test_gradcheck() -> None:
    layers = stack(3, dim=6, heads_=2)
    xs = [torch.randn(1, 4, 6, dtype=torch.float64, requires_grad=True) for _ in layers]
    assert stack_gradcheck(layers, xs)


def test_defaults() -> None:
    mech = get_mechanism("pid")
    assert mech.options("vision") == {"kp": 0.6, "ki": 0.1, "kd": 0.1}
    assert mech.options("lm") == {"kp": 0.4, "ki": 0.1, "kd": 0.1}
    with pytest.raises(ValueError, match="ki"):
        PIDAttention(8, 2, ki=float("nan"))


@pytest.mark.parametrize("name", ["pid_lm", "pid_symlm"])
def test_causal_lm_has_no_leak_from_the_future(name: str) -> None:
    assert_no_leak_from_the_future(causal_lm(name, n_layer=4), n=12, t=4)


@pytest.mark.skipif(not kernels.available(), reason="the compiled kernels are not built here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["no_grad", "inference"])
def test_one_pass_feedback_equals_the_eager_ops(dtype: torch.dtype, mode: str) -> None:
    # without autograd and hooks the feedback is one compiled pass (csrc/pid_kernels.cpp) over strided
    # views (the values are a slice of the qkv projection); the same outputs as the eager ops, every layer
    # (the first with no integral and no previous error yet, a skipped layer, the later ones with both)
    layers = [layer.to(dtype) for layer in stack(n_layers=5, applied=[0, 1, 2, 4], kp=0.7, ki=0.3, kd=0.2)]
    xs = [x.to(dtype) for x in inputs(layers)]
    context = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with context():
        spy = OpNames()
        with spy:
            fast = run_stack(layers, xs)
        with kernels.eager_only():
            slow = run_stack(layers, xs)
    assert "pid_feedback_" in spy.names
    with torch.enable_grad():
        with_grad = run_stack(layers, xs)  # the autograd path: the eager ops
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    for f, s, g in zip(fast, slow, with_grad, strict=True):
        torch.testing.assert_close(f, s, **tol)
        torch.testing.assert_close(f, g.detach(), **tol)


@pytest.mark.skipif(not kernels.available(), reason="the compiled kernels are not built here")
def test_a_hook_on_the_error_keeps_the_eager_ops() -> None:
    # a hook may read or change e^l: the one-pass kernel would bypass it, so a hooked layer runs the eager ops
    layers = stack(n_layers=3, kp=0.7, ki=0.3, kd=0.2)
    xs = inputs(layers)
    seen = []
    handle = layers[2].hook_error.register_forward_hook(lambda _m, _i, out: seen.append(out) or out * 2)
    try:
        with torch.no_grad():
            spy = OpNames()
            with spy:
                hooked = run_stack(layers, xs)
    finally:
        handle.remove()
    assert len(seen) == 1 and "pid_feedback_" in spy.names  # layer 1 took the kernel, layer 2 the hook
    with torch.no_grad(), kernels.eager_only():
        handle = layers[2].hook_error.register_forward_hook(lambda _m, _i, out: out * 2)
        try:
            eager = run_stack(layers, xs)
        finally:
            handle.remove()
    for a, b in zip(hooked, eager, strict=True):
        torch.testing.assert_close(a, b)
