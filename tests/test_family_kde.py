"""KDE and robust KDE attention (issue 25) against float64 transcriptions written per query with explicit
loops (the paper's KIRWLS and the official code's norm), the Huber threshold inert with the official norm
and active with the paper's, gradcheck, masks, no leak from the future, timm models."""

from __future__ import annotations

import contextlib
import copy
import math

import family_checks
import pytest
import torch
import torch.nn.functional as F
from family_checks import (
    OpNames,
    assert_no_leak_from_the_future,
    case_mask,
    causal_lm,
    layer_gradcheck,
    timm_forward,
)

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import KdeAttention, RobustAttention, get_mechanism, run_with_cache
from kpca_attention.models import create_model

pytestmark = pytest.mark.usefixtures("single_thread")


def project(layer, x):
    b, n, c = x.shape
    h, d = layer.num_heads, c // layer.num_heads
    w, bias = layer.in_proj.weight.double(), layer.in_proj.bias.double()
    parts = (x.double() @ w.T + bias).reshape(b, n, -1, h, d).permute(2, 0, 3, 1, 4)
    k, v = parts[-2], parts[-1]
    return (k if layer.symmetric else parts[0]), k, v


def finish(layer, out):
    b, h, n, d = out.shape
    return out.transpose(1, 2).reshape(b, n, h * d) @ layer.proj.weight.double().T + layer.proj.bias.double()


def psi(r: float, a: float, loss: str) -> float:
    if loss == "huber":
        return 1.0 if r <= a else a / r
    b, c = 2 * a, 3 * a  # the official Hampel
    if r < a:
        return 1.0
    if r < b:
        return a / r
    return a * (c - r) / ((c - b) * r) if r < c else 0.01


def kirwls(x: torch.Tensor, a: float, loss: str, n_iter: int, official: bool, scale: float,
           distances: bool = False) -> torch.Tensor:
    """Weights of the points x (M, E) by KIRWLS from uniform, written with explicit sums (``distances``:
    the distances r of the last step instead)."""
    x, m = x.detach(), x.shape[0]
    kern = [[math.exp(-scale * float(((x[j] - x[l]) ** 2).sum())) for l in range(m)] for j in range(m)]
    w = [1.0 / m] * m
    for _ in range(n_iter):
        wkw = sum(w[l] * w[p] * kern[l][p] for l in range(m) for p in range(m))
        psis, rs = [], []
        for j in range(m):
            t = sum(w[l] * kern[j][l] for l in range(m))
            r2 = (1 + t + wkw) if official else (kern[j][j] - 2 * t + wkw)
            rs.append(math.sqrt(max(r2, 0.0)))
            psis.append(psi(rs[-1], a, loss))
        w = [p / sum(psis) for p in psis]
    return torch.tensor(rs if distances else w, dtype=torch.float64)


def reference(layer, x, mask=None, causal=False, robust=True):
    """Per (sample, head, query): the KDE / RKDE estimate over the keys the query sees."""
    q, k, v = project(layer, x)
    khat = k / k.norm(dim=-1, keepdim=True)
    b, h, n, d = q.shape
    out = torch.zeros_like(q)
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                keys = [j for j in range(n) if (mask is None or mask[bi, 0, 0, j]) and (not causal or j <= i)]
                kk, vv = khat[bi, hi, keys], v[bi, hi, keys]
                s = -((q[bi, hi, i] - kk) ** 2).sum(-1) / math.sqrt(d)
                if robust:
                    opts = (layer.a, layer.loss, layer.n_iter, layer.official_norm, 1 / math.sqrt(d))
                    w_m = kirwls(kk, *opts)
                    w_j = kirwls(torch.cat([kk, vv], -1), *opts)
                else:
                    w_m = w_j = torch.ones(len(keys), dtype=torch.float64)
                e = torch.exp(s - s.max())
                out[bi, hi, i] = (w_j * e) @ vv / (w_m * e).sum()
    return finish(layer, out)


def layers(cls, symmetric=False, **kw):
    torch.manual_seed(0)
    return cls(8, 2, qkv_bias=True, symmetric=symmetric, **kw).double()


CASES = ["plain", "causal", "padding"]


def case_inputs(case):
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return x, case_mask(case, 5, keep=3)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_kde_matches_the_kernel_estimate(symmetric: bool, case: str) -> None:
    layer = layers(KdeAttention, symmetric)
    x, mask = case_inputs(case)
    got = layer(x, attn_mask=mask, is_causal=case == "causal")
    torch.testing.assert_close(got, reference(layer, x, mask, case == "causal", robust=False))


@pytest.mark.parametrize("opts", [dict(), dict(official_norm=True), dict(loss="hampel", a=0.3),
                                  dict(n_iter=3, a=0.25), dict(symmetric=True)])
@pytest.mark.parametrize("case", CASES)
def test_rkde_matches_kirwls(opts: dict, case: str) -> None:
    layer = layers(RobustAttention, **opts)
    x, mask = case_inputs(case)
    got = layer(x, attn_mask=mask, is_causal=case == "causal")
    torch.testing.assert_close(got, reference(layer, x, mask, case == "causal"))


def rkde_out(a: float, official: bool, loss: str = "huber") -> torch.Tensor:
    layer = layers(RobustAttention, a=a, official_norm=official, loss=loss)
    return layer(case_inputs("plain")[0])


def test_huber_threshold_inert_with_the_official_norm_and_active_with_the_papers() -> None:
    # official: r >= 1 > a for every token, all weights a / r, a cancels - the same model for any a < 1
    off = [rkde_out(a, True) for a in (0.2, 0.4, 0.9)]
    torch.testing.assert_close(off[0], off[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(off[0], off[2], rtol=0, atol=1e-12)
    # the paper's norm: the threshold matters, and a large a (all weights 1) is plain KDE attention
    paper = [rkde_out(a, False) for a in (0.2, 0.4)]
    assert (paper[0] - paper[1]).abs().max() > 1e-4
    assert (paper[0] - off[0]).abs().max() > 1e-4
    kde = layers(KdeAttention)(case_inputs("plain")[0])
    torch.testing.assert_close(rkde_out(100.0, False), kde)
    # the official Hampel weights are all 0.01 (r >= 1 >= c = 3a): plain KDE attention again
    torch.testing.assert_close(rkde_out(0.2, True, "hampel"), kde)


@pytest.mark.parametrize("opts", [dict(), dict(official_norm=True), dict(n_iter=3, a=0.25)])
@pytest.mark.parametrize("case", ["plain", "causal"])
def test_hook_points_give_the_distances_of_the_last_kirwls_step(opts: dict, case: str) -> None:
    """hook_r_keys / hook_r_joint: r_j of every point to the robust estimate, as the explicit sums give it
    (the measure of whether a trained model ever reaches the Huber threshold, r <= a)."""
    layer = layers(RobustAttention, **opts)
    x, _ = case_inputs(case)
    _, cache = run_with_cache(layer, x, is_causal=case == "causal")
    _, k, v = project(layer, x)
    khat = k / k.norm(dim=-1, keepdim=True)
    d = khat.shape[-1]
    args = (layer.a, layer.loss, layer.n_iter, layer.official_norm, 1 / math.sqrt(d), True)
    for name, points in (("hook_r_keys", khat), ("hook_r_joint", torch.cat([khat, v], -1))):
        got = cache[name]
        assert got.shape == (2, 2, 5 if case == "causal" else 1, 5)
        for bi in range(2):
            for hi in range(2):
                for i in range(got.shape[2]):
                    keys = i + 1 if case == "causal" else 5  # a causal query's own prefix
                    want = kirwls(points[bi, hi, :keys], *args)
                    torch.testing.assert_close(got[bi, hi, i, :keys], want, atol=1e-6, rtol=0)
        if layer.official_norm:  # r >= 1 > a for every token: the threshold is never reached
            assert got[..., :1].min() >= 1 > layer.a


def test_norm_used_is_recorded() -> None:
    paper, official = layers(RobustAttention), layers(RobustAttention, official_norm=True)
    assert paper.norm_used.startswith("paper") and official.norm_used.startswith("official")
    assert "official_norm=True" in repr(official) and "sign error" in repr(official)
    vit = create_model("rkde_vit_mini_patch4_28", attn_kwargs={"official_norm": True})
    assert all(b.attn.norm_used.startswith("official") for b in vit.blocks)


@pytest.mark.parametrize("cls", [KdeAttention, RobustAttention])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(cls, causal: bool) -> None:
    torch.manual_seed(0)
    layer = cls(4, 2, qkv_bias=True).double()
    x = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    assert layer_gradcheck(layer, x, causal)


def test_defaults_and_options() -> None:
    rk = get_mechanism("rkde")
    assert rk.options("vision") == dict(loss="huber", a=0.2, n_iter=1, official_norm=False)
    assert not rk.stateful and get_mechanism("kde").applied_blocks("vision", 12) == list(range(12))
    for bad in (dict(loss="tukey"), dict(a=-1.0), dict(n_iter=0), dict(official_norm=1)):
        with pytest.raises(ValueError):
            RobustAttention(8, 2, **bad)


@pytest.mark.parametrize("name", ["kde_lm", "rkde_lm"])
def test_causal_lm_has_no_leak_from_the_future(name: str) -> None:
    assert_no_leak_from_the_future(causal_lm(name, n_layer=2), n=10, t=4, shift=True)


@pytest.mark.parametrize("name", ["kde_vit_mini_patch4_28", "rkde_vit_mini_patch4_28"])
def test_timm_model_forward(name: str) -> None:
    timm_forward(name)


@pytest.mark.parametrize("which", ["both", "keys", "joint"])
def test_robust_kernels_backward_equals_autograd_of_the_formula(which: str) -> None:
    # the hand-written backward of RKDE's two Gram kernels against autograd through the plain formula
    # exp(-scale ||x_j - x_l||^2), float64, upstream gradients that are not symmetric; and gradcheck
    from kpca_attention.attention.kde import robust_kernels

    g = torch.Generator().manual_seed(3)
    khat = torch.nn.functional.normalize(torch.randn(2, 3, 7, 5, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(2, 3, 7, 5, generator=g, dtype=torch.float64)
    gk, gkv = (torch.randn(2, 3, 7, 7, generator=g, dtype=torch.float64) for _ in range(2))
    scale = 0.4

    def plain(x: torch.Tensor) -> torch.Tensor:
        return torch.exp(-scale * (x.unsqueeze(-2) - x.unsqueeze(-3)).pow(2).sum(-1))

    a, b = khat.clone().requires_grad_(), v.clone().requires_grad_()
    kk, kkv = robust_kernels(a, b, scale)
    torch.testing.assert_close(kk, plain(khat), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kkv, plain(khat) * plain(v), rtol=1e-12, atol=1e-12)
    loss = {"both": (kk * gk).sum() + (kkv * gkv).sum(), "keys": (kk * gk).sum(), "joint": (kkv * gkv).sum()}
    loss[which].backward()
    a2, b2 = khat.clone().requires_grad_(), v.clone().requires_grad_()
    rk, rkv = plain(a2), plain(a2) * plain(b2)
    ref = {"both": (rk * gk).sum() + (rkv * gkv).sum(), "keys": (rk * gk).sum(), "joint": (rkv * gkv).sum()}
    ref[which].backward()
    torch.testing.assert_close(a.grad, a2.grad, rtol=1e-10, atol=1e-12)
    if which == "keys":
        assert b.grad is None or not b.grad.any()
    else:
        torch.testing.assert_close(b.grad, b2.grad, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x, y: robust_kernels(x, y, scale), (a.detach().requires_grad_(),
                                                                             b.detach().requires_grad_()))


def _colsums_formed(khat: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    from kpca_attention.attention.kde import robust_kernels

    kk, kkv = robust_kernels(khat, v, scale)
    return kk.sum(-2), kkv.sum(-2)


@pytest.mark.parametrize("n", [1, 5, 8, 17, 64, 197])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_column_sums_equal_the_formed_kernels(n: int, dtype: torch.dtype) -> None:
    """csrc/rkde_kernels.cpp's column sums of RKDE's two Gram kernels (upper triangle only, never formed)
    against the sums of the kernels robust_kernels forms; token counts around the vector widths (8, 16)."""
    from kpca_attention.pap import kernels

    if kernels.active() is None:
        pytest.skip("the compiled kernels are not built here, or KPCA_ATTENTION_KERNELS=0")
    g = torch.Generator().manual_seed(n)
    khat = torch.nn.functional.normalize(torch.randn(6, n, 16, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(6, n, 16, generator=g, dtype=dtype) * 0.3
    s_k, s_kv = torch.ops.kpca_attention.rkde_colsums(khat, v, 0.25)
    ref_k, ref_kv = _colsums_formed(khat, v, 0.25)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-5, atol=1e-5)
    torch.testing.assert_close(s_k, ref_k, **tol)
    torch.testing.assert_close(s_kv, ref_kv, **tol)
    assert (s_k >= 1 - 1e-6).all() and (s_kv <= s_k + 1e-6).all()  # K_jj = 1; the joint kernel is smaller


@pytest.mark.parametrize("opts", [dict(), dict(official_norm=True), dict(loss="hampel", a=0.3),
                                  dict(symmetric=True)])
def test_rkde_takes_the_weights_from_the_column_sums(opts: dict, monkeypatch) -> None:
    """Without a mask and with one KIRWLS step, RKDE's weights come from the compiled column sums: the kernels
    are never formed, forward or backward, and the output is the per-query float64 reference's; its
    gradients (input and every parameter) are those of the path that forms the kernels (float64), and in
    float32 the outputs agree with it to rounding."""
    import kpca_attention.attention.kde as kde
    from kpca_attention.pap import kernels

    if kernels.active() is None:
        pytest.skip("the compiled kernels are not built here, or KPCA_ATTENTION_KERNELS=0")
    layer = layers(RobustAttention, **opts)
    x = case_inputs("plain")[0]

    def formed(*args):
        raise AssertionError("the kernels were formed")

    def output_and_grads(xx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        layer.zero_grad()
        xx = xx.clone().requires_grad_()
        out = layer(xx)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        return out.detach(), [xx.grad] + [p.grad.clone() for p in layer.parameters()]

    with monkeypatch.context() as m:
        m.setattr(kde, "robust_kernels", formed)
        got, grads = output_and_grads(x)
        with torch.no_grad():
            got32 = copy.deepcopy(layer).float()(x.float())
    torch.testing.assert_close(got, reference(layer, x))
    with monkeypatch.context() as m:  # the path that forms the kernels
        m.setattr(kde, "_one_step_weights", lambda *args: None)
        ref, ref_grads = output_and_grads(x)
        with torch.no_grad():
            eager32 = copy.deepcopy(layer).float()(x.float())
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got32, eager32, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_rkde_column_sums_run_on_several_threads_under_autograd_and_inference_mode(threads: int,
                                                                                  torch_threads) -> None:
    """The column-sum kernels' heads run on OpenMP's worker threads, and their GEMMs there must see the
    caller's grad mode, dispatch keys and inference mode (csrc/parallel.h; without them, at two threads:
    "mm(): functions with out=... arguments don't support automatic differentiation" in training, "Inplace
    update to inference tensor outside InferenceMode" under torch.inference_mode): forward, backward and an
    inference-mode forward give, at one and two threads, the path that forms the kernels."""
    from kpca_attention.pap import kernels

    if kernels.active() is None:
        pytest.skip("the compiled kernels are not built here, or KPCA_ATTENTION_KERNELS=0")
    layer = layers(RobustAttention)
    x = case_inputs("plain")[0].repeat(3, 1, 1)  # 3 x the batch: heads for both threads

    def run(xx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layer.zero_grad()
        xx = xx.clone().requires_grad_()
        out = layer(xx)
        out.square().sum().backward()
        with torch.inference_mode():
            inf = layer(xx.detach())
        return out.detach(), xx.grad, inf

    with torch_threads(threads):
        assert kernels.parallel_threads() == threads
        got = run(x)
    with kernels.eager_only():
        ref = run(x)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("compiled", [True, False])
def test_column_sums_backward_passes_gradcheck(compiled: bool, monkeypatch) -> None:
    import kpca_attention.attention.kde as kde
    from kpca_attention.attention.kde import _KernelColumnSums
    from kpca_attention.pap import kernels

    if compiled and kernels.active() is None:
        pytest.skip("the compiled kernels are not built here, or KPCA_ATTENTION_KERNELS=0")
    monkeypatch.setattr(kde, "COLSUM_BLOCK", 2)  # the eager blocks: 3 heads by 2
    g = torch.Generator().manual_seed(5)
    khat = torch.nn.functional.normalize(torch.randn(3, 11, 4, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(3, 11, 6, generator=g, dtype=torch.float64)
    inputs = (khat.requires_grad_(), v.requires_grad_())
    with contextlib.nullcontext() if compiled else kernels.eager_only():
        assert torch.autograd.gradcheck(lambda a, b: _KernelColumnSums.apply(a, b, 0.3), inputs)
        # one of the two sums used (the other's gradient None)
        assert torch.autograd.gradcheck(lambda a, b: _KernelColumnSums.apply(a, b, 0.3)[1], inputs)


# ---- third mutation review (2026-11-30): each test fails on a mutant no earlier test caught
def test_rkde_adds_a_float_masks_finite_biases_to_the_logits():
    """out_i = sum_j wJ_j e^(s_ij + B_ij) v_j / sum_j wM_j e^(s_ij + B_ij), s_ij = 2 q_i . khat_j / sqrt D
    (module docstring), the KIRWLS weights over the keys each query sees."""
    from family_reference import heads, merge

    from kpca_attention.attention import RobustAttention
    from kpca_attention.attention.kde import kirwls_weights

    torch.manual_seed(0)
    layer = RobustAttention(8, 2, qkv_bias=True).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    bias = family_checks.finite_bias_mask(5)
    p = heads(layer, x)
    khat = F.normalize(p["k"], dim=-1)
    d2 = lambda z: ((z[..., :, None, :] - z[..., None, :, :]) ** 2).sum(-1)  # noqa: E731
    scale = 1 / math.sqrt(4)
    kern_k, kern_kv = torch.exp(-scale * d2(khat)), torch.exp(-scale * (d2(khat) + d2(p["v"])))
    vis = torch.isfinite(bias).expand(2, 2, 5, 5)
    w_m = kirwls_weights(kern_k, vis, 0.2, "huber", 1, False)[0]
    w_j = kirwls_weights(kern_kv, vis, 0.2, "huber", 1, False)[0]
    e = torch.exp(2 * scale * p["q"] @ khat.transpose(-1, -2) + bias)
    want = merge(layer, ((w_j * e) @ p["v"]) / (w_m * e).sum(-1, keepdim=True))
    torch.testing.assert_close(layer(x, attn_mask=bias), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rkde_key_bias_joins_the_keys_where_it_needs_a_gradient(dtype: torch.dtype) -> None:
    """RKDE's last step, softmax(scale q k^T + log wM) (v wJ / wM), takes the bias per key as SDPA's float
    mask, whose CPU kernel computes no gradient for it: with one to compute the bias joins the keys (one
    flash call at width D + 1) - the same values and gradients as the masked call, and no math path."""
    from kpca_attention.attention.kde import _attention_with_key_bias

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    bias = torch.log_softmax(torch.randn(2, 3, 1, 7, generator=g, dtype=dtype), -1).requires_grad_()
    grad = torch.randn(2, 3, 7, 4, generator=g, dtype=dtype)
    inputs = (q, k, v, bias)
    with OpNames() as ops:
        got = _attention_with_key_bias(q, k, v, bias, 0.0, 0.3)
    assert "_scaled_dot_product_flash_attention_for_cpu" in ops.names and "_softmax" not in ops.names
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
    tol = {} if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, want, **tol)
    want_grads = torch.autograd.grad(want, inputs, grad)
    for a, b in zip(torch.autograd.grad(got, inputs, grad), want_grads, strict=True):
        torch.testing.assert_close(a, b, **tol)
    # the layer trains through it (the weights from the compiled column sums or from the formed kernels)
    layer = layers(RobustAttention).to(dtype)
    with OpNames() as ops:
        layer(case_inputs("plain")[0].to(dtype)).sum().backward()
    assert "_scaled_dot_product_flash_attention_for_cpu" in ops.names and "_softmax" not in ops.names
    assert all(p.grad is not None and p.grad.isfinite().all() for p in layer.parameters())


@pytest.mark.parametrize("opts", [dict(), dict(official_norm=True), dict(symmetric=True)])
def test_without_compiled_kernels_rkde_takes_the_column_sums_by_blocks(opts: dict, monkeypatch) -> None:
    """Without the compiled kernels (another CPU, KPCA_ATTENTION_KERNELS=0) RKDE's one-step weights come from
    column sums taken a few heads at a time, forward and backward: the kernels of all heads are never formed
    at once, and the output and the gradients (input and every parameter) are the formed path's (float64,
    uneven blocks: 4 heads by 3)."""
    import kpca_attention.attention.kde as kde
    from kpca_attention.pap import kernels

    layer = layers(RobustAttention, **opts)
    x = case_inputs("plain")[0]

    def output_and_grads() -> tuple[torch.Tensor, list[torch.Tensor]]:
        layer.zero_grad()
        xx = x.clone().requires_grad_()
        out = layer(xx)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        return out.detach(), [xx.grad] + [p.grad.clone() for p in layer.parameters()]

    with kernels.eager_only():
        with monkeypatch.context() as m:
            m.setattr(kde, "_one_step_weights", lambda *args: None)
            want, want_grads = output_and_grads()  # the kernels formed
        with monkeypatch.context() as m:
            m.setattr(kde, "robust_kernels", lambda *a: pytest.fail("the kernels of all heads were formed"))
            m.setattr(kde, "COLSUM_BLOCK", 3)
            got, grads = output_and_grads()
            with torch.no_grad():
                got_no_grad = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_no_grad, want, rtol=1e-12, atol=1e-12)
    for g, r in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got, reference(layer, x))
