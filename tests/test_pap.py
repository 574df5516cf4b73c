"""Principal Attention Pursuit (kpca_attention.pap) against a direct transcription of Algorithm 1."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from pap_reference import pap_reference, shrink_ref

from kpca_attention.pap import THRESHOLDS, pap, pap_mu, shrink

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("single_thread")


def rand(*shape: int, seed: int = 0, dtype: torch.dtype = F64, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


def kv(b: int = 2, h: int = 3, n: int = 7, d: int = 4, seed: int = 0, dtype: torch.dtype = F64):
    return rand(b, h, n, d, seed=seed, dtype=dtype), rand(b, h, n, d, seed=seed + 100, dtype=dtype)


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("lam", [0.01, 0.1, 4.0])
@pytest.mark.parametrize("n_iter", [1, 2, 4, 6])
def test_matches_algorithm_1(n_iter: int, lam: float, threshold: str) -> None:
    k, v = kv(seed=n_iter)
    history: list = []
    ref = pap_reference(k, v, n_iter, lam, threshold=threshold, history=history)
    out = pap(k, v, n_iter, lam, threshold=threshold)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_transcription_is_exercised() -> None:
    """The comparisons above cover the regimes of the shrinkage: S empty, sparse, growing, dense."""
    k, v = kv(seed=4)

    def density(lam: float, threshold: str = "lambda_mu") -> list[float]:
        history: list = []
        pap_reference(k, v, 4, lam, threshold=threshold, history=history)
        return [float((h["S"] != 0).double().mean()) for h in history]

    official = density(4.0)
    assert official[0] < 0.05 and official[-1] > 0.1, official  # sparse at first, the dual grows
    assert min(density(0.01)) > 0.95
    paper = density(1.0, "lambda_over_mu")
    assert 0.1 < paper[0] < paper[-1] < 0.9, paper


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_explicit_mu_and_mu_dim(threshold: str) -> None:
    k, v = kv(seed=3)
    for mu in [0.7, rand(2, 3, 1, 1, seed=5).abs() + 0.2]:
        ref = pap_reference(k, v, 3, 0.5, mu=mu, threshold=threshold)
        torch.testing.assert_close(pap(k, v, 3, 0.5, mu=mu, threshold=threshold), ref, rtol=0, atol=1e-12)
    d = k.shape[-1]
    ref = pap_reference(k, v, 3, 0.5, mu_dim=d, threshold=threshold)
    torch.testing.assert_close(pap(k, v, 3, 0.5, mu_dim=d, threshold=threshold), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mu_dim", [0, -16, 2.5, False])
def test_pap_mu_rejects_a_mu_dim_that_is_no_positive_count(mu_dim) -> None:
    k, _ = kv()
    with pytest.raises(ValueError, match=r"pap_mu: mu_dim must be None"):
        pap_mu(k, mu_dim=mu_dim)


def test_numpy_integer_options_are_counts() -> None:
    k, v = kv()
    torch.testing.assert_close(pap(k, v, np.int64(3), mu_dim=np.int32(4)), pap(k, v, 3, mu_dim=4))


def test_value_checks_follow_validate() -> None:
    k, v = kv()
    v[0, 0, 0, 0] = float("nan")
    for validate in (None, True):  # on the CPU the default checks values
        with pytest.raises(ValueError, match="v contains non-finite values"):
            pap(k, v, validate=validate)
    assert torch.isnan(pap(k, v, validate=False)).any()  # unchecked: NaN propagates, nothing raised
    with pytest.raises(ValueError, match=r"n_iter must be"):  # options are checked whatever validate says
        pap(k, v, 0, validate=False)


def test_meta_tensors_need_no_values() -> None:
    """On a device whose values cannot be read (meta), as on an accelerator, the default reads none:
    shapes propagate (timm's config tests build every model on the meta device)."""
    k, v = (torch.empty(2, 3, 7, 4, device="meta") for _ in range(2))
    mask = torch.zeros(7, 7, device="meta")
    assert pap(k, v).shape == (2, 3, 7, 4)
    out = pap(k, v, mu=torch.ones(2, 3, 1, 1, device="meta"), attn_mask=mask, is_causal=True)
    assert out.device.type == "meta" and out.shape == (2, 3, 7, 4)


def test_pap_mu_is_the_official_rule() -> None:
    k, _ = kv(b=2, h=3, n=5, d=4)
    expected = 5 * 3 * 4 / (4 * k.abs().sum(dim=(-2, -1), keepdim=True))
    torch.testing.assert_close(pap_mu(k), expected)
    torch.testing.assert_close(pap_mu(k, mu_dim=4), expected / 3)
    causal = pap_mu(k, is_causal=True)  # (B, H, N, 1), prefix rule; equal at the last position
    assert causal.shape == (2, 3, 5, 1)
    torch.testing.assert_close(causal[:, :, -1:], expected)
    torch.testing.assert_close(causal[:, :, :1], 1 * 12 / (4 * k[:, :, :1].abs().sum(-1, keepdim=True)))


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_one_iteration_closed_form(threshold: str) -> None:
    k, v = kv(seed=7)
    lam = 0.3
    mu = pap_mu(k)
    tau = lam * mu if threshold == "lambda_mu" else lam / mu
    x = torch.clamp(k, -tau, tau)  # K - S_1 with S_1 = shrink(K, tau)
    expected = torch.softmax(x @ x.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1) @ v
    torch.testing.assert_close(pap(k, v, 1, lam, threshold=threshold), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("n_iter", [1, 3])
def test_asymmetric_variant(n_iter: int, threshold: str) -> None:
    k, v = kv(seed=11)
    q = rand(*k.shape, seed=12)
    ref = pap_reference(k, v, n_iter, 0.2, q=q, threshold=threshold)
    torch.testing.assert_close(pap(k, v, n_iter, 0.2, q=q, threshold=threshold), ref, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- gradients


def _gradcheck(fn, *inputs: torch.Tensor) -> None:
    inputs = tuple(t.detach().clone().requires_grad_() for t in inputs)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("n_iter", [1, 3])
def test_gradcheck(n_iter: int, threshold: str) -> None:
    k, v = kv(b=1, h=2, n=5, d=3, seed=21)
    _gradcheck(lambda k, v: pap(k, v, n_iter, 0.3, threshold=threshold), k, v)
    # the diagnostics path computes the same function
    _gradcheck(lambda k, v: pap(k, v, n_iter, 0.3, threshold=threshold, return_info=True)[0], k, v)


def test_gradcheck_asymmetric_causal_masked_explicit_mu() -> None:
    k, v = kv(b=2, h=1, n=5, d=3, seed=22)
    q = rand(*k.shape, seed=23)
    _gradcheck(lambda k, v, q: pap(k, v, 3, 0.3, q=q), k, v, q)
    _gradcheck(lambda k, v: pap(k, v, 3, 0.3, is_causal=True), k, v)
    pad = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    _gradcheck(lambda k, v: pap(k, v, 3, 0.3, attn_mask=pad), k, v)
    _gradcheck(lambda k, v: pap(k, v, 3, 0.3, attn_mask=pad, is_causal=True), k, v)
    mu = torch.tensor([[[[0.8]]], [[[1.3]]]], dtype=F64)
    _gradcheck(lambda k, v, mu: pap(k, v, 3, 0.3, mu=mu), k, v, mu)


def test_gradients_match_transcription() -> None:
    """Backward of the fused update against autograd through the naive transcription."""
    k, v = kv(b=2, h=2, n=6, d=4, seed=24)
    g = rand(*k.shape, seed=25)
    grads = []
    for fn in (pap, pap_reference):
        kk, vv = k.clone().requires_grad_(), v.clone().requires_grad_()
        (fn(kk, vv, 4, 0.1) * g).sum().backward()
        grads.append((kk.grad, vv.grad))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_grad_in_place_path_matches_autograd_path(dtype: torch.dtype) -> None:
    # without a graph, on the CPU: the fused path (cutoff softmax, update inside its blocks); with one:
    # SDPA or the cutoff softmax per step, the update as an autograd Function. Equal to rounding.
    k, v = kv(b=2, h=3, n=17, d=8, dtype=dtype, seed=26)
    q = rand(*k.shape, seed=27, dtype=dtype)
    pad = torch.ones(2, 17, dtype=torch.bool)
    pad[1, 12:] = False
    atol = 1e-5 if dtype == torch.float32 else 1e-13
    for kwargs in [{}, {"q": q}, {"is_causal": True}, {"attn_mask": pad}, {"threshold": "lambda_over_mu"}]:
        with torch.no_grad():
            fast = pap(k, v, 4, 0.1, **kwargs)
        kg = k.clone().requires_grad_()
        slow = pap(kg, v, 4, 0.1, **kwargs)
        assert slow.requires_grad
        torch.testing.assert_close(fast, slow.detach(), rtol=0, atol=atol)
    k_before = k.clone()
    with torch.no_grad():
        pap(k, v, 4, 0.1)
    assert torch.equal(k, k_before), "the in-place path must not write into its inputs"


def _graph_grads(monkeypatch: pytest.MonkeyPatch, saved: bool, k, v, g, **kwargs):
    """Output and gradients of pap, through PAPSaved (``saved``) or the Function-per-step graph."""
    pap_module = importlib.import_module("kpca_attention.pap.algorithm")  # where pap() dispatches
    calls: list[str] = []
    cls = pap_module.PAPSaved
    monkeypatch.setattr(pap_module, "saves_probabilities",
                        lambda *a: saved and calls.append("saved") is None)
    kk, vv = k.clone().requires_grad_(), v.clone().requires_grad_()
    mu = kwargs.pop("mu", None)
    mm = None if mu is None else mu.clone().requires_grad_()
    out = pap(kk, vv, 4, 0.1, mu=mm, **kwargs)
    out.backward(g)
    assert calls == (["saved"] if saved else []) and cls is pap_module.PAPSaved
    return out.detach(), kk.grad, vv.grad, None if mm is None else mm.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "case", ["plain", "causal", "padding", "additive", "no_key_row", "explicit_mu", "lambda_over_mu"]
)
def test_saved_probabilities_path_equals_step_graph(monkeypatch: pytest.MonkeyPatch, case: str,
                                                   dtype: torch.dtype) -> None:
    # With a graph on the CPU, symmetric PAP runs as one Function that keeps each step's probabilities
    # (PAPSaved); everything else as a Function per step. Same outputs and gradients (k, v, mu).
    k, v = kv(b=2, h=3, n=17, d=8, dtype=dtype, seed=31)
    g = rand(*k.shape, seed=32, dtype=dtype)
    kwargs: dict = {
        "plain": {}, "causal": {"is_causal": True}, "lambda_over_mu": {"threshold": "lambda_over_mu"},
        "explicit_mu": {"mu": torch.tensor([[[[0.8]]], [[[1.3]]]], dtype=dtype)},
    }.get(case, {})
    if case == "padding":
        pad = torch.ones(2, 17, dtype=torch.bool)
        pad[1, 12:] = False
        kwargs = {"attn_mask": pad, "is_causal": True}
    if case == "additive":
        kwargs = {"attn_mask": rand(1, 3, 17, 17, seed=33, dtype=dtype).tril() - 0.5}
    if case == "no_key_row":  # query 3 may see no key: its output is 0 at every step (as SDPA)
        mask = torch.ones(17, 17, dtype=torch.bool).tril()
        mask[3] = False
        kwargs = {"attn_mask": mask}
    fast = _graph_grads(monkeypatch, True, k, v, g, **dict(kwargs))
    slow = _graph_grads(monkeypatch, False, k, v, g, **dict(kwargs))
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    for a, b in zip(fast, slow, strict=True):
        if a is not None or b is not None:
            scale = max(1.0, float(b.abs().max()))
            torch.testing.assert_close(a, b, rtol=tol["rtol"], atol=tol["atol"] * scale)


def test_saved_probabilities_path_taken_only_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    pap_module = importlib.import_module("kpca_attention.pap.fused")
    calls: list[str] = []
    apply = pap_module.PAPSaved.apply
    monkeypatch.setattr(pap_module.PAPSaved, "apply", lambda *a: calls.append("saved") or apply(*a))
    k, v = kv(b=2, h=3, n=9, d=4, dtype=torch.float32, seed=34)
    q = rand(*k.shape, seed=35, dtype=torch.float32)
    kg = k.clone().requires_grad_()
    pap(kg, v, 4, 0.1).sum().backward()
    assert calls == ["saved"]
    calls.clear()
    pap(kg, v, 4, 0.1, q=q)  # separate queries
    pap(kg, v, 4, 0.1, dropout_p=0.2)  # dropout
    pap(kg, v, 4, 0.1, return_info=True)  # diagnostics
    pap(kg.bfloat16(), v.bfloat16(), 4, 0.1)  # half precision
    with torch.no_grad():
        pap(kg, v, 4, 0.1)  # no graph: pap_fused
    monkeypatch.setattr(pap_module, "_SAVED_P_FLOATS", 4 * 2 * 3 * 9 * 9 - 1)  # over the memory budget
    pap(kg, v, 4, 0.1)
    assert calls == []
    monkeypatch.setattr(pap_module, "_SAVED_P_FLOATS", 4 * 2 * 3 * 9 * 9)
    pap(kg, v, 4, 0.1)
    assert calls == ["saved"]


def test_saved_probabilities_reuse_a_buffer_only_once_its_graph_is_done() -> None:
    # PAPSaved keeps its probabilities in a pooled buffer (fresh ones are ~29,000 page faults a call at
    # ViT sizes): a later call reuses it once the graph that saved it ran its backward or was freed,
    # never while a graph still holds it (two graphs alive at once, retain_graph, backward twice).
    fused = importlib.import_module("kpca_attention.pap.fused")
    fused.saved_buffers.clear()
    k, v = kv(b=2, h=3, n=9, d=4, dtype=torch.float64, seed=36)
    g = rand(*k.shape, seed=37, dtype=torch.float64)

    def grads(kk: torch.Tensor, out: torch.Tensor, retain: bool = False) -> torch.Tensor:
        return torch.autograd.grad(out, kk, g, retain_graph=retain)[0]

    k1, k2 = k.clone().requires_grad_(), (k * 1.5).requires_grad_()
    want1 = grads(k1, pap(k1, v, 4, 0.1))
    want2 = grads(k2, pap(k2, v, 4, 0.1))
    assert len(fused.saved_buffers.bufs) == 1, "the second call reuses the first call's buffer"
    out1, out2 = pap(k1, v, 4, 0.1), pap(k2, v, 4, 0.1)  # both graphs alive: two buffers
    assert len(fused.saved_buffers.bufs) == 2
    torch.testing.assert_close(grads(k1, out1, retain=True), want1, rtol=0, atol=0)
    grads(k2, pap(k2, v, 4, 0.1))  # a call between two backward passes of out1's graph
    torch.testing.assert_close(grads(k1, out1), want1, rtol=0, atol=0)
    torch.testing.assert_close(grads(k2, out2), want2, rtol=0, atol=0)
    del out1, out2
    fused.saved_buffers.clear()
    small = fused.SavedBuffers(budget_bytes=60 * 8)  # float64: room for one buffer of 50
    assert small.take(200, k).numel() == 200 and small.bufs == []  # past the budget: fresh, not kept
    a = small.take(50, k)
    assert len(small.bufs) == 1 and a.data_ptr() == small.bufs[0].data_ptr()
    b = small.take(50, k)  # the kept buffer is held by a: a fresh one (and no room to keep it)
    assert b.data_ptr() != a.data_ptr() and len(small.bufs) == 1
    del a, b
    assert small.take(40, k).data_ptr() == small.bufs[0].data_ptr()


# ----------------------------------------------------------------------------- masks


def test_causal_no_leak() -> None:
    """Changing tokens > p of k and v leaves outputs <= p unchanged - mu included (prefix rule)."""
    k, v = kv(b=2, h=2, n=9, d=4, seed=31)
    p = 4
    k2, v2 = k.clone(), v.clone()
    k2[:, :, p + 1 :] = rand(2, 2, 9 - p - 1, 4, seed=32, scale=5.0)
    v2[:, :, p + 1 :] = rand(2, 2, 9 - p - 1, 4, seed=33)
    for kwargs in [{}, {"threshold": "lambda_over_mu"}, {"q": rand(*k.shape, seed=34)}]:
        a = pap(k, v, 4, 0.5, is_causal=True, **kwargs)
        b = pap(k2, v2, 4, 0.5, is_causal=True, **kwargs)
        torch.testing.assert_close(a[:, :, : p + 1], b[:, :, : p + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(a[:, :, p + 1 :], b[:, :, p + 1 :])
    # An explicit lower-triangular mask gets the same treatment as is_causal=True ...
    tril = torch.ones(9, 9, dtype=torch.bool).tril()
    torch.testing.assert_close(pap(k, v, 4, 0.5, attn_mask=tril), pap(k, v, 4, 0.5, is_causal=True))
    # ... and the test can fail: the official whole-sequence mu leaks the future.
    a = pap(k, v, 4, 0.5, is_causal=True, mu=pap_mu(k))
    b = pap(k2, v2, 4, 0.5, is_causal=True, mu=pap_mu(k2))
    assert not torch.allclose(a[:, :, : p + 1], b[:, :, : p + 1])


def test_causal_first_token_is_its_own_value() -> None:
    k, v = kv(seed=35)
    torch.testing.assert_close(pap(k, v, 3, 0.5, is_causal=True)[:, :, 0], v[:, :, 0])


def _padding_masks(lengths: list[int], n: int) -> dict[str, torch.Tensor]:
    real = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (B, N)
    additive = torch.zeros(len(lengths), 1, 1, n, dtype=F64)
    return {
        "key_padding": real,
        "bool_4d": real[:, None, None, :],
        "additive_inf": additive.masked_fill(~real[:, None, None, :], float("-inf")),
        "additive_min": additive.masked_fill(~real[:, None, None, :], torch.finfo(F64).min),
    }


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["key_padding", "bool_4d", "additive_inf", "additive_min"])
def test_padding_invariance(mask_kind: str, is_causal: bool) -> None:
    lengths, n = [9, 6, 3], 9
    mask = _padding_masks(lengths, n)[mask_kind]
    k, v = kv(b=3, h=2, n=n, d=4, seed=41)
    q = rand(*k.shape, seed=42)
    for kwargs in [{}, {"q": q}]:
        out = pap(k, v, 4, 0.5, attn_mask=mask, is_causal=is_causal, **kwargs)
        # padded tokens' k and v (and q) do not matter ...
        k2, v2, q2 = k.clone(), v.clone(), q.clone()
        for b, m in enumerate(lengths):
            k2[b, :, m:] = 7.0
            v2[b, :, m:] = -3.0
            q2[b, :, m:] = 2.0
        kw2 = {"q": q2} if "q" in kwargs else {}
        out2 = pap(k2, v2, 4, 0.5, attn_mask=mask, is_causal=is_causal, **kw2)
        # ... and each sequence's real tokens get what PAP gives on the unpadded sequence alone
        for b, m in enumerate(lengths):
            kw = {"q": q[b : b + 1, :, :m]} if "q" in kwargs else {}
            alone = pap(k[b : b + 1, :, :m], v[b : b + 1, :, :m], 4, 0.5, is_causal=is_causal, **kw)
            torch.testing.assert_close(out[b : b + 1, :, :m], alone, rtol=0, atol=1e-12)
            torch.testing.assert_close(out2[b : b + 1, :, :m], alone, rtol=0, atol=1e-12)


def test_padding_mu_ignores_padded_keys() -> None:
    k, _ = kv(b=2, h=2, n=6, d=4, seed=43)
    real = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    mu = pap_mu(k, attn_mask=real[:, None, None, :])
    torch.testing.assert_close(mu[1:], pap_mu(k[1:, :, :4]))
    torch.testing.assert_close(mu[:1], pap_mu(k[:1]))


# ----------------------------------------------------------------------------- edge cases and errors


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_all_zero_keys(threshold: str) -> None:
    _, v = kv(seed=51)
    k = torch.zeros_like(v, requires_grad=True)
    out = pap(k, v, 4, 4.0, threshold=threshold)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, v.mean(-2, keepdim=True).expand_as(v), rtol=0, atol=1e-12)
    out.sum().backward()
    assert torch.isfinite(k.grad).all()
    assert torch.isfinite(pap_mu(k.detach())).all()
    # padded: the mean over the real tokens only
    real = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    out = pap(k.detach(), v, 4, 4.0, attn_mask=real, threshold=threshold)
    torch.testing.assert_close(out[1], v[1, :, :5].mean(-2, keepdim=True).expand(3, 7, 4))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype: torch.dtype) -> None:
    """mu = N * C / (4 ||K||_1) has N * C = 100 * 768 > 65504 = float16's max: computed in float32."""
    k, v = kv(b=1, h=12, n=100, d=64, seed=52, dtype=torch.float32)
    for threshold in THRESHOLDS:
        expected = pap(k, v, 3, 0.5, threshold=threshold)
        out = pap(k.to(dtype), v.to(dtype), 3, 0.5, threshold=threshold)
        assert out.dtype == dtype and torch.isfinite(out).all()
        torch.testing.assert_close(out.float(), expected, rtol=0, atol=0.05)
        zero = pap(torch.zeros_like(k, dtype=dtype), v.to(dtype), 3, 0.5, threshold=threshold)
        torch.testing.assert_close(zero.float(), v.mean(-2, keepdim=True).expand_as(v), rtol=0, atol=0.02)
    # the diagnostics are accumulated in float32 (squares of 20 * randn overflow float16)
    _, info = pap(k * 20, v, 3, 0.5, return_info=True)
    _, info_half = pap((k * 20).to(dtype), v.to(dtype), 3, 0.5, return_info=True)
    for key in ("s_density", "primal_residual", "dual_norm"):
        assert info_half[key] == pytest.approx(info[key], rel=0.05, abs=1e-3), key


def _bad_calls():
    k, v = kv()
    nan_k, inf_v, nan_q = k.clone(), v.clone(), k.clone()
    nan_k[0, 1, 2, 3] = float("nan")
    inf_v[1, 0, 0, 0] = float("inf")
    nan_q[0, 0, 0, 0] = float("nan")
    nan_mask = torch.zeros(7, 7, dtype=F64)
    nan_mask[0, 0] = float("nan")
    return [
        ((k[0], v[0]), {}, r"k must have shape \(B, H, N, D\)"),
        ((k, v[:, :, :5]), {}, r"v must have shape"),
        ((k, v[..., :3]), {}, r"v must have the head width"),
        ((k, v), {"q": k[:, :, :5]}, r"q must have the shape of k"),
        ((k, v.float()), {}, r"share one floating dtype"),
        ((k, v), {"n_iter": 0}, r"n_iter must be an integer >= 1"),
        ((k, v), {"n_iter": 2.0}, r"n_iter must be an integer >= 1"),
        ((k, v), {"lam": 0.0}, r"lam must be a finite number > 0"),
        ((k, v), {"lam": -1.0}, r"lam must be a finite number > 0"),
        ((k, v), {"lam": float("nan")}, r"lam must be a finite number > 0"),
        ((k, v), {"threshold": "lambda"}, r"unknown threshold 'lambda'; valid: lambda_mu, lambda_over_mu"),
        ((nan_k, v), {}, r"k contains non-finite values \(1 NaN, 0 Inf\)"),
        ((k, inf_v), {}, r"v contains non-finite values \(0 NaN, 1 Inf\)"),
        ((k, v), {"q": nan_q}, r"q contains non-finite values \(1 NaN, 0 Inf\)"),
        ((k, v), {"attn_mask": torch.ones(2, 8, dtype=torch.bool)}, r"attn_mask of shape \(2, 8\) does not"),
        ((k, v), {"attn_mask": torch.ones(2, 3, 7, 6, dtype=torch.bool)}, r"does not broadcast"),
        ((k, v), {"attn_mask": torch.ones(7, 7, dtype=torch.int64)}, r"attn_mask must be bool or"),
        ((k, v), {"attn_mask": nan_mask}, r"additive attn_mask contains NaN"),
        ((k[:, :, :2], v[:, :, :2]), {"attn_mask": torch.ones(2, 2, dtype=torch.bool)}, r"ambiguous"),
        ((k, v), {"mu": 0.0}, r"mu must be finite and > 0"),
        ((k, v), {"mu": float("inf")}, r"mu must be finite and > 0"),
        ((k, v), {"dropout_p": 1.0}, r"dropout_p must be in \[0, 1\)"),
        # a bool is no count, and mu_dim <= 0 gave tau = 0 (the mean of V) or a negative tau
        ((k, v), {"n_iter": True}, r"n_iter must be an integer >= 1 \(softmax steps\), got True"),
        ((k, v), {"lam": True}, r"lam must be a finite number > 0, got True"),
        ((k, v), {"mu_dim": 0}, r"mu_dim must be None \(the full width H \* D\) or an integer >= 1, got 0"),
        ((k, v), {"mu_dim": -16}, r"mu_dim must be None .* got -16"),
        ((k, v), {"mu_dim": 4.0}, r"mu_dim must be None .* got 4.0"),
        ((k, v), {"mu_dim": True}, r"mu_dim must be None .* got True"),
        ((k, v), {"mu": True}, r"mu must be finite and > 0, got True"),
        ((k, v), {"validate": "yes"}, r"validate must be None, True or False"),
    ]


@pytest.mark.parametrize("args,kwargs,match", _bad_calls())
def test_bad_input_raises(args, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        pap(*args, **kwargs)


# ----------------------------------------------------------------------------- diagnostics


def test_return_info_against_transcription() -> None:
    k, v = kv(b=2, h=3, n=9, d=4, seed=61)
    for lam in [0.05, 0.5, 4.0]:
        history: list = []
        pap_reference(k, v, 5, lam, history=history)
        out, info = pap(k, v, 5, lam, return_info=True)
        assert isinstance(out, torch.Tensor)
        for key in ("s_density", "tau", "k_abs_max", "primal_residual", "dual_norm", "l_change"):
            assert len(info[key]) == 5 and len(info[key + "_per_head"]) == 5
            assert info[key + "_per_head"][0].shape == (3,)
        k_norm = torch.linalg.vector_norm(k, dim=(-2, -1))
        for t, h in enumerate(history):
            # one float per iteration: the mean over (batch, head) of a per-(batch, head) statistic
            density = (h["S"] != 0).double().mean(dim=(-2, -1)).mean()
            assert info["s_density"][t] == pytest.approx(float(density), abs=1e-12)
            res = torch.linalg.vector_norm(k - h["L"] - h["S"], dim=(-2, -1)) / k_norm
            assert info["primal_residual"][t] == pytest.approx(float(res.mean()), rel=1e-9)
            dual = torch.linalg.vector_norm(h["Y"], dim=(-2, -1)) / k_norm
            assert info["dual_norm"][t] == pytest.approx(float(dual.mean()), rel=1e-9)
            assert info["tau"][t] == pytest.approx(float((lam * h["mu"]).mean()), rel=1e-12)
            if t:
                prev = history[t - 1]["L"]
                change = torch.linalg.vector_norm(h["L"] - prev, dim=(-2, -1))
                change = change / torch.linalg.vector_norm(h["L"], dim=(-2, -1))
                assert info["l_change"][t] == pytest.approx(float(change.mean()), rel=1e-9)
        assert math.isnan(info["l_change"][0])
        assert all(0.0 <= x <= 1.0 for x in info["s_density"])
        assert info["k_abs_max"][0] == pytest.approx(float(k.abs().amax(dim=(-2, -1)).mean()))


def test_return_info_extremes() -> None:
    g = torch.Generator().manual_seed(62)
    k = torch.rand(2, 3, 9, 4, generator=g, dtype=F64) * 2 - 1  # unit-scale keys
    v = rand(2, 3, 9, 4, seed=63)
    _, info = pap(k, v, 3, 4.0, return_info=True)
    assert info["s_density"][0] == 0.0  # official lam = 4: tau = 4 mu > max |K|, nothing shrunk
    _, info = pap(k, v, 3, 1e-6, return_info=True)
    assert info["s_density"][0] == 1.0  # tiny lam: S is dense
    for key in ("primal_residual", "dual_norm", "tau"):
        assert all(math.isfinite(x) for x in info[key])


def test_without_return_info_nothing_is_kept() -> None:
    k, v = kv()
    out = pap(k.requires_grad_(), v)
    assert isinstance(out, torch.Tensor)
    with torch.no_grad():
        assert isinstance(pap(k, v), torch.Tensor)


# ----------------------------------------------------------------------------- hooks (named states)


def _recording_hooks(n_iter: int, seen: dict) -> dict:
    names = ["mu", "tau"] + [f"{s}.{t}" for s in ("L", "W", "S_density") for t in range(n_iter)]
    return {name: (lambda x, name=name: seen.setdefault(name, x)) for name in names}


@pytest.mark.parametrize(("sparse", "dual"), [(True, True), (False, True), (True, False)])
def test_hooks_see_the_states_and_change_nothing(sparse: bool, dual: bool) -> None:
    from kpca_attention.pap import PAPTrace

    k, v = kv(dtype=torch.float32, seed=41)
    k = k * 6  # S active
    with torch.no_grad():
        fast = pap(k, v, 4, 0.1, sparse=sparse, dual=dual)  # the fused path, where it applies
        seen: dict = {}
        out = pap(k, v, 4, 0.1, sparse=sparse, dual=dual, hooks=_recording_hooks(4, seen))
        _, info = pap(k, v, 4, 0.1, sparse=sparse, dual=dual, return_info=True)
    torch.testing.assert_close(out, fast)  # the reference loop equals the fast path to rounding
    assert torch.equal(seen["L.3"], out)
    assert sorted(seen) == sorted(_recording_hooks(4, {}))
    assert seen["S_density.0"].shape == (2, 3)
    for t in range(4):
        assert torch.equal(seen[f"S_density.{t}"].double().mean(0), info["s_density_per_head"][t])
    if not dual:
        assert all(not seen[f"W.{t}"].any() for t in range(4))
    # the trace, rebuilt from the states alone, is return_info's to the last bit
    trace = PAPTrace(k, seen["mu"], seen["tau"], None, dual=dual)
    for t in range(4):
        trace.record(seen[f"L.{t}"], seen.get(f"L.{t - 1}"), seen.get(f"W.{t - 1}"))
    for key, values in info.items():
        for a, b in zip(trace.info[key], values, strict=True):
            torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=0, atol=0, equal_nan=True)


def test_hooks_can_intervene() -> None:
    k, v = kv(dtype=torch.float64, seed=42)
    plain = pap(k, v, 3, 0.1)
    zeroed = pap(k, v, 3, 0.1, hooks={"L.2": torch.zeros_like})
    assert not zeroed.any() and plain.any()
    halved = pap(k, v, 3, 0.1, hooks={"mu": lambda mu: mu / 2})
    torch.testing.assert_close(halved, pap(k, v, 3, 0.1, mu=pap_mu(k) / 2))

# ----------------------------------------------------------------------------- dropout


def test_dropout_on_last_softmax_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # a softmax step goes through SDPA or, on the CPU for wide logit ranges, through the cutoff
    # softmax (pap_module.cutoff_step, dropout_p its 6th argument)
    import importlib

    pap_module = importlib.import_module("kpca_attention.pap.algorithm")  # where the softmax steps run
    fused_module = importlib.import_module("kpca_attention.pap.fused")
    calls: list[float] = []

    def spy(fn, position=None):
        def run(*args, **kwargs):
            calls.append(args[position] if position is not None else kwargs.get("dropout_p", 0.0))
            return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy(F.scaled_dot_product_attention))
    monkeypatch.setattr(pap_module, "cutoff_step", spy(pap_module.cutoff_step, 5))
    k, v = kv(dtype=torch.float32)
    pap(k.requires_grad_(), v, 4, 4.0, dropout_p=0.5)
    assert calls == [0.0, 0.0, 0.0, 0.5]
    # without a graph (the fused path): the softmax blocks, the 9th argument is the dropout
    calls.clear()
    monkeypatch.setattr(fused_module, "softmax_block", spy(fused_module.softmax_block, 8))
    with torch.no_grad():
        pap(k, v, 4, 4.0, dropout_p=0.5)
    assert sorted(set(calls)) == [0.0, 0.5] and calls[-1] == 0.5 and calls.count(0.5) == calls.count(0.0) // 3


def test_dropout_changes_output_and_zero_is_deterministic() -> None:
    k, v = kv(dtype=torch.float32)
    a, b = pap(k, v, 3, dropout_p=0.5), pap(k, v, 3, dropout_p=0.5)
    assert not torch.allclose(a, b)
    assert torch.equal(pap(k, v, 3, dropout_p=0.0), pap(k, v, 3, dropout_p=0.0))
    torch.manual_seed(5)
    a = pap(k, v, 3, dropout_p=0.5)
    torch.manual_seed(5)
    assert torch.equal(a, pap(k, v, 3, dropout_p=0.5))


# ----------------------------------------------------------------------------- shrinkage operator

_floats = st.floats(-1e3, 1e3, allow_nan=False, width=64)
_taus = st.floats(0.0, 1e3, allow_nan=False, width=64)


@settings(max_examples=200, deadline=None)
@given(xs=st.lists(_floats, min_size=1, max_size=20), tau=_taus, as_tensor=st.booleans())
def test_shrink_properties(xs: list[float], tau: float, as_tensor: bool) -> None:
    x = torch.tensor(xs, dtype=F64)
    t = torch.tensor(tau, dtype=F64) if as_tensor else tau
    s = shrink(x, t)
    # the defining formula, and the Moreau decomposition x = prox(x) + projection onto [-tau, tau]
    torch.testing.assert_close(s, shrink_ref(x, tau), rtol=0, atol=1e-12)
    torch.testing.assert_close(x - s, torch.clamp(x, -tau, tau), rtol=0, atol=1e-12)
    assert (s.abs() <= x.abs()).all()
    assert (s * x >= 0).all()  # sign preserved (or zero)
    assert ((s == 0) == (x.abs() <= tau)).all()
    # prox optimality: s minimises 0.5 (y - x)^2 + tau |y| (check against perturbed candidates)
    def objective(y):
        return 0.5 * (y - x) ** 2 + tau * y.abs()
    for delta in (1e-3, -1e-3, 0.5, -0.5):
        assert (objective(s) <= objective(s + delta) + 1e-9).all()


@given(xs=st.lists(_floats, min_size=1, max_size=20))
def test_shrink_zero_threshold_is_identity(xs: list[float]) -> None:
    x = torch.tensor(xs, dtype=F64)
    assert torch.equal(shrink(x, 0.0), x)
    assert torch.equal(shrink(x, torch.tensor(0.0, dtype=F64)), x)


# ----------------------------------------------------------------------------- ablations

ABLATIONS = [(False, True), (True, False), (False, False)]  # (sparse, dual)


@pytest.mark.parametrize(("sparse", "dual"), ABLATIONS)
@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("n_iter", [1, 2, 4])
def test_ablations_match_transcription(n_iter: int, threshold: str, sparse: bool, dual: bool) -> None:
    k, v = kv(seed=70 + n_iter)
    for lam in (0.05, 4.0):
        ref = pap_reference(k, v, n_iter, lam, threshold=threshold, sparse=sparse, dual=dual)
        out = pap(k, v, n_iter, lam, threshold=threshold, sparse=sparse, dual=dual)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        with torch.no_grad():  # the in-place / no-graph branch computes the same
            out = pap(k, v, n_iter, lam, threshold=threshold, sparse=sparse, dual=dual)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_ablations_change_the_operator() -> None:
    """The switches do something (a test that cannot fail would prove nothing): with a small lam,
    where S is dense, each ablation differs from full PAP; S = 0 does not depend on lam or mu;
    both off is symmetric attention."""
    k, v = kv(seed=75)
    full = pap(k, v, 4, 0.05)
    for sparse, dual in ABLATIONS:
        assert (pap(k, v, 4, 0.05, sparse=sparse, dual=dual) - full).abs().max() > 1e-3
    no_s = pap(k, v, 4, 0.05, sparse=False)
    torch.testing.assert_close(pap(k, v, 4, 3.0, sparse=False, threshold="lambda_over_mu", mu=0.3), no_s)
    sym = F.scaled_dot_product_attention(k, k, v)
    torch.testing.assert_close(pap(k, v, 3, 0.05, sparse=False, dual=False), sym)


@pytest.mark.parametrize(("sparse", "dual"), ABLATIONS)
def test_ablations_gradcheck(sparse: bool, dual: bool) -> None:
    k, v = kv(b=1, h=2, n=5, d=3, seed=76)
    _gradcheck(lambda k, v: pap(k, v, 3, 0.3, sparse=sparse, dual=dual), k, v)
    _gradcheck(lambda k, v: pap(k, v, 3, 0.3, sparse=sparse, dual=dual, is_causal=True), k, v)
    _gradcheck(lambda k, v: pap(k, v, 3, 0.3, sparse=sparse, dual=dual, return_info=True)[0], k, v)


@pytest.mark.parametrize(("sparse", "dual"), ABLATIONS)
def test_ablations_gradients_match_transcription(sparse: bool, dual: bool) -> None:
    k, v = kv(b=2, h=2, n=6, d=4, seed=77)
    g = rand(*k.shape, seed=78)
    grads = []
    for fn in (pap, pap_reference):
        kk, vv = k.clone().requires_grad_(), v.clone().requires_grad_()
        (fn(kk, vv, 4, 0.1, sparse=sparse, dual=dual) * g).sum().backward()
        grads.append((kk.grad, vv.grad))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize(("sparse", "dual"), ABLATIONS)
def test_ablations_return_info_against_transcription(sparse: bool, dual: bool) -> None:
    k, v = kv(b=2, h=3, n=9, d=4, seed=79)
    history: list = []
    pap_reference(k, v, 4, 0.1, history=history, sparse=sparse, dual=dual)
    _, info = pap(k, v, 4, 0.1, return_info=True, sparse=sparse, dual=dual)
    k_norm = torch.linalg.vector_norm(k, dim=(-2, -1))
    for t, h in enumerate(history):
        density = (h["S"] != 0).double().mean()
        assert info["s_density"][t] == pytest.approx(float(density), abs=1e-12)
        res = torch.linalg.vector_norm(k - h["L"] - h["S"], dim=(-2, -1)) / k_norm
        assert info["primal_residual"][t] == pytest.approx(float(res.mean()), rel=1e-9)
        y = torch.linalg.vector_norm(h["Y"], dim=(-2, -1)) / k_norm
        assert info["dual_norm"][t] == pytest.approx(float(y.mean()), rel=1e-9, abs=1e-15)
    if not sparse:
        assert all(x == 0.0 for x in info["s_density"]) and info["tau"][0] == math.inf
    else:
        assert info["s_density"][0] > 0.1  # small lam: S is active, so the density check means something
    if not dual:
        assert all(x == 0.0 for x in info["dual_norm"])


def test_ablation_switches_must_be_bool() -> None:
    k, v = kv()
    with pytest.raises(ValueError, match="sparse and dual must be bool"):
        pap(k, v, sparse="no")  # type: ignore[arg-type]


# --- found by mutation testing (/work/notes/review/mutation.md): each fails on its mutant ---------------


def test_the_mu_of_all_zero_keys_is_floored_per_entry() -> None:
    from kpca_attention.pap.algorithm import pap_mu

    mu = pap_mu(torch.zeros(1, 1, 8, 4, dtype=torch.float64))
    assert mu.item() == pytest.approx(8 * 4 / (4 * 8 * torch.finfo(torch.float64).eps))


def test_update_backward_without_the_x_gradient_is_the_formula_at_dx_0() -> None:
    """``g_x`` None (no gradient reached X'): dL = dC - 2 dZ, dR = dZ (the docstring's formulas at dX' = 0);
    autograd materialises a zero dX' in UpdateStep, so only a direct call reaches this branch."""
    from kpca_attention.pap.updates import update_backward

    g = torch.Generator().manual_seed(0)
    g_c, g_z = (torch.randn(2, 3, generator=g, dtype=torch.float64) for _ in range(2))
    g_l, g_r = update_backward(g_c.clone(), None, g_z.clone())
    torch.testing.assert_close(g_l, g_c - 2 * g_z)
    torch.testing.assert_close(g_r, g_z)
    zero_l, zero_r = update_backward(g_c.clone(), torch.zeros_like(g_c), g_z.clone())
    torch.testing.assert_close((g_l, g_r), (zero_l, zero_r))
