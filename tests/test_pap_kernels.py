"""PAP's compiled CPU kernels (kpca_attention/pap/kernels.py, csrc/pap_kernels.cpp) against the eager ops
they replace: the same numbers to rounding, every mask, float32 and float64, no subnormal; and pap's
outputs and gradients with and without them. (The float64 equality of the fused paths with Algorithm 1,
with the kernels on, is tests/test_pap_numerics.py.)"""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_pap_numerics import SubnormalSpy, growing, masks, n_subnormal

from kpca_attention.pap import kernels, pap, softmax_cutoff

softmax = importlib.import_module("kpca_attention.pap.softmax")
updates = importlib.import_module("kpca_attention.pap.updates")
pytestmark = pytest.mark.usefixtures("single_thread")

BUILDABLE = (platform.machine().lower() in ("x86_64", "amd64") and shutil.which("c++") is not None
             and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"))
# built, and not switched off (KPCA_ATTENTION_KERNELS=0 runs the suite on the eager ops alone)
needs_kernels = pytest.mark.skipif(kernels.active() is None,
                                   reason="PAP's kernels are not built here, or KPCA_ATTENTION_KERNELS=0")


def test_kernels_are_built_where_they_can_be() -> None:
    # the install builds them wherever a compiler and AVX2 exist: a broken build must fail here, not
    # silently fall back to the eager ops
    assert kernels.available() == BUILDABLE
    if BUILDABLE:  # the build whose vectors match torch's own kernels (the same source, 16 or 8 floats)
        capability = torch.backends.cpu.get_cpu_capability()
        assert kernels.BUILD == ("cpu_kernels_avx512" if capability == "AVX512" else "cpu_kernels")


@needs_kernels
@pytest.mark.skipif(kernels.BUILD != "cpu_kernels_avx512", reason="only the AVX2 build is loaded here")
def test_the_avx2_build_passes_these_tests_too() -> None:
    # on an AVX512 machine the AVX512 build runs everywhere else; torch told to use AVX2
    # (ATEN_CPU_CAPABILITY) loads the other build: this file's tests on it, in a new process
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                           "-k", "not avx2_build"], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1]


def _eager_block(S: torch.Tensor, hid: torch.Tensor | None, s: float, cutoff: float):
    m, l_sum = S.new_empty(*S.shape[:-1], 1), S.new_empty(*S.shape[:-1], 1)
    P = softmax._probabilities_eager(S.clone(), hid, s, cutoff, m, l_sum)
    return P, m, l_sum


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [5, 16, 197])  # shorter than, a multiple of, and not a multiple of a vector
@pytest.mark.parametrize("hidden", ["none", "some", "row"])
def test_cutoff_exp_equals_the_eager_ops(dtype: torch.dtype, n: int, hidden: str) -> None:
    g = torch.Generator().manual_seed(n)
    S = 30.0 * torch.randn(3, 7, n, generator=g, dtype=dtype)  # logits spread far past the cutoff
    hid = None
    if hidden != "none":
        hid = torch.rand(3, 7, n, generator=g) < 0.3
        if hidden == "row":
            hid[1, 2] = True  # a query that sees no key
        S.masked_fill_(hid, float("-inf"))
    cutoff, scale = softmax_cutoff(dtype), 0.125
    P, m, l_sum = _eager_block(S, hid, scale, cutoff)
    Sk, mk, lk = S.clone(), torch.empty_like(m), torch.empty_like(l_sum)
    out = kernels.active().cutoff_exp_(Sk, mk, lk, scale, cutoff)
    assert out.data_ptr() == Sk.data_ptr()
    tol = {"rtol": 2e-6, "atol": 0.0} if dtype == torch.float32 else {"rtol": 1e-14, "atol": 0.0}
    torch.testing.assert_close(Sk, P, **tol)
    torch.testing.assert_close(mk, m, rtol=0, atol=0)
    torch.testing.assert_close(lk, l_sum, **tol)
    assert n_subnormal(Sk) == 0
    if hidden == "row":
        assert float(mk[1, 2]) == 0.0 and float(lk[1, 2]) == 1.0 and not Sk[1, 2].any()


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [5, 16, 197])
def test_cutoff_probs_equals_the_eager_recomputation(dtype: torch.dtype, n: int) -> None:
    # the backward's recomputation of P from the forward's row maxima and sums
    g = torch.Generator().manual_seed(n + 1)
    S = 30.0 * torch.randn(3, 7, n, generator=g, dtype=dtype)
    cutoff, scale = softmax_cutoff(dtype), 0.125
    _, m, l_sum = _eager_block(S, None, scale, cutoff)
    ref = softmax._probabilities(S.clone(), m, None, cutoff, scale).div_(l_sum)
    out = kernels.active().cutoff_probs_(S.clone(), m, l_sum, scale, cutoff)
    tol = 2e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(out, ref, rtol=tol, atol=0.0)
    torch.testing.assert_close(out.sum(-1), torch.ones_like(out.sum(-1)), rtol=tol * n, atol=0.0)
    assert n_subnormal(out) == 0


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 13, 16, 37])  # within one 16 x 16 tile, at its edge, across three
def test_softmax_backward_sym_equals_the_eager_ops(dtype: torch.dtype, n: int) -> None:
    # a symmetric step's softmax backward: scale (dS + dS^T) with dS = (dP - delta) P, in place
    g = torch.Generator().manual_seed(n)
    dP, P = (torch.randn(3, n, n, generator=g, dtype=dtype) for _ in range(2))
    delta = torch.randn(3, n, 1, generator=g, dtype=dtype)
    dS = (dP - delta) * P
    want = 0.125 * (dS + dS.transpose(1, 2))
    got = torch.ops.kpca_attention.softmax_backward_sym_(dP, P, delta, 0.125)
    assert got.data_ptr() == dP.data_ptr()
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-14, "atol": 1e-14}
    torch.testing.assert_close(dP, want, **tol)
    assert torch.equal(dP, dP.transpose(1, 2))


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tau_rows", ["head", "row"])
@pytest.mark.parametrize("alias", ["none", "in_place"])
def test_update_equals_the_eager_ops(dtype: torch.dtype, tau_rows: str, alias: str) -> None:
    g = torch.Generator().manual_seed(7)
    nb, n, d = 4, 13, 21
    K, L, R = (torch.randn(nb, n, d, generator=g, dtype=dtype) for _ in range(3))
    tau = torch.rand(nb, 1 if tau_rows == "head" else n, 1, generator=g, dtype=dtype) + 0.2
    ref = [torch.empty_like(K) for _ in range(3)]
    with kernels.eager_only():
        updates.update_into(K, L, R.clone(), tau, None, *ref)
    if alias == "none":
        out = [torch.empty_like(K) for _ in range(3)]
        updates.update_into(K, L, R.clone(), tau, None, *out)
    else:  # as update_step: X_{t+1} over R_t, R_{t+1} over C (the spare)
        R2, spare = R.clone(), torch.empty_like(K)
        updates.update_into(K, L, R2, tau, None, spare, R2, spare)
        out = [None, R2, spare]
        ref = [None, ref[1], ref[2]]
    for a, b in zip(out, ref, strict=True):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-6 if dtype == torch.float32 else 1e-14, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("case", ["none", "padding", "additive", "causal", "empty_row"])
@pytest.mark.parametrize("graph", [False, True])
def test_pap_with_kernels_as_accurate_as_without(case: str, graph: bool) -> None:
    # Values and gradients, every mask, the fused no-grad path and the graph paths (PAPSaved or a
    # Function per step): in float64 the kernels give the eager ops' numbers to rounding; in float32 both
    # are compared with float64, and the kernels' error is no larger than the eager ops'. These inputs are
    # ill-conditioned on purpose (keys at 3x scale, 4 steps: float32 itself is off by ~1e-4, and an entry
    # near the shrinkage threshold lands on either side of it by rounding), so one input's error ratio is
    # heavy-tailed - 1/30 to 30 on both the AVX2 and the AVX512 build, median 1: the errors are compared as
    # medians over 12 inputs, where both builds stay within 0.5-1.9x of the eager ops.
    def run(k: torch.Tensor, v: torch.Tensor, gout: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        kw = {key: (t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t)
              for key, t in masks(n, n)[case].items()}
        kk, vv = (t.detach().to(dtype).clone().requires_grad_(graph) for t in (k, v))
        with torch.set_grad_enabled(graph):
            out = pap(kk, vv, 4, 4.0, **kw)
            if graph:
                out.backward(gout.to(dtype))
        return [t.detach().double() for t in (out, kk.grad, vv.grad) if t is not None]

    n = 13
    err_fast: list[list[float]] = [[], [], []]
    err_eager: list[list[float]] = [[], [], []]
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        k, v = (3.0 * torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64) for _ in range(2))
        gout = torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64)
        spy = SubnormalSpy()
        with spy:
            ref = run(k, v, gout, torch.float64)
        # PAPSaved's backward through the kernels: its whole loop in one call (unmasked), or block by block
        backward_ops = ({"pap_backward_saved"} if case == "none"
                        else {"update_backward_", "softmax_backward_sym_"})
        assert all((op in spy.ops) == graph for op in backward_ops), (case, graph)
        fast32 = run(k, v, gout, torch.float32)
        with kernels.eager_only():
            ref_eager = run(k, v, gout, torch.float64)
            eager32 = run(k, v, gout, torch.float32)
        for a, b in zip(ref, ref_eager, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9 * float(b.abs().max()))
        for i, (fast, eager, exact) in enumerate(zip(fast32, eager32, ref, strict=True)):
            scale = float(exact.abs().max())
            err_fast[i].append(float((fast - exact).abs().max()) / scale)
            err_eager[i].append(float((eager - exact).abs().max()) / scale)
    for i in range(3 if graph else 1):  # values; the keys' and values' gradients
        fast_med, eager_med = torch.tensor(err_fast[i]).median(), torch.tensor(err_eager[i]).median()
        assert eager_med < 1e-2, (i, eager_med)  # float32 does compute these, if roughly
        assert fast_med <= 3.0 * eager_med, (i, float(fast_med), float(eager_med))

    # at unit scale (well-conditioned) float32 with the kernels equals float32 without them outright
    g = torch.Generator().manual_seed(5)
    k, v, gout = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64) for _ in range(3))
    fast32 = run(k, v, gout, torch.float32)
    with kernels.eager_only():
        eager32 = run(k, v, gout, torch.float32)
    for i, (fast, eager) in enumerate(zip(fast32, eager32, strict=True)):
        tol = 1e-5 if i == 0 else 2e-4  # values; gradients (through 4 clamps and softmax backwards)
        torch.testing.assert_close(fast, eager, rtol=tol, atol=tol * float(eager.abs().max()))


@needs_kernels
def test_kernels_run_and_make_no_subnormal_on_growing_iterates() -> None:
    k, v, g = growing()
    k.requires_grad_()
    spy = SubnormalSpy()
    with spy:
        out = pap(k, v, 4, 4.0)
        out.backward(g)
        with torch.no_grad():
            pap(k, v, 4, 4.0)
    # the graph path's one forward call (pap_forward_saved, which returns every tensor it saves) and one
    # backward call (pap_backward_saved), and the no-grad path's one call (pap_forward)
    assert {"pap_forward_saved", "pap_backward_saved", "pap_forward"} <= set(spy.ops)
    assert spy.subnormal == {}
    assert n_subnormal(k.grad) == 0


@needs_kernels
def test_the_kernels_parallel_loops_run_on_torchs_threads(torch_threads) -> None:
    # at::parallel_for is an inline template: compiled without OpenMP (setup.py before -fopenmp) it ran every
    # kernel's loop inline, on one thread at any torch thread count
    for threads in (1, 2):
        with torch_threads(threads):
            assert kernels.parallel_threads() == threads


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
def test_kernels_on_several_threads_under_inference_mode_and_autograd(
        threads: int, monkeypatch: pytest.MonkeyPatch, torch_threads) -> None:
    # pap_forward's blocks run on OpenMP's worker threads, and their GEMMs there must see the caller's
    # inference mode (csrc/parallel.h; without it, at two threads, torch.inference_mode raised "Inplace update
    # to inference tensor outside InferenceMode"); the graph path's kernels too: values and gradients at one
    # and two threads are the eager ops'
    monkeypatch.setattr(softmax, "_BLOCK_FLOATS", 3 * 29 * 29)  # 3 heads a block: 12 heads -> 4 blocks
    g = torch.Generator().manual_seed(threads)
    k, v = (torch.randn(3, 4, 29, 12, generator=g, dtype=torch.float64) for _ in range(2))

    def run() -> tuple[torch.Tensor, ...]:
        with torch.inference_mode():
            inf = pap(k, v, 3, 4.0)
        kg, vg = k.clone().requires_grad_(), v.clone().requires_grad_()
        out = pap(kg, vg, 3, 4.0)
        out.square().sum().backward()
        return inf, out.detach(), kg.grad, vg.grad

    with torch_threads(threads):
        assert kernels.parallel_threads() == threads
        got = run()
    with kernels.eager_only():
        ref = run()
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_iter", [1, 2, 3, 4])
@pytest.mark.parametrize("tau_shape", ["scalar", "per_head", "per_row"])
@pytest.mark.parametrize("threads", [1, 2])  # the blocks run in parallel: each task its own score buffer
def test_compiled_forward_equals_the_python_loop(dtype: torch.dtype, n_iter: int, tau_shape: str,
                                                 threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # pap_forward (the whole no-grad loop in C++) against pap_fused's Python loop over the same blocks
    # (with the block kernels), several blocks of heads and a last, smaller one; every buffer role of
    # n_iter 1-4; tau one value, per head, per row
    monkeypatch.setattr(softmax, "_BLOCK_FLOATS", 3 * 29 * 29)  # 3 heads a block: 8 heads -> 3, 3, 2
    fused = importlib.import_module("kpca_attention.pap.fused")
    g = torch.Generator().manual_seed(n_iter)
    k, v = (2.0 * torch.randn(2, 4, 29, 12, generator=g, dtype=dtype) for _ in range(2))
    tau = {"scalar": torch.full((1, 1, 1, 1), 0.7, dtype=dtype),
           "per_head": torch.rand(2, 4, 1, 1, generator=g, dtype=dtype) + 0.3,
           "per_row": torch.rand(2, 4, 29, 1, generator=g, dtype=dtype) + 0.3}[tau_shape]
    spy = SubnormalSpy()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with spy:
            out = fused.pap_fused(k, v, None, tau, None, False, 0.0, n_iter)
    finally:
        torch.set_num_threads(before)
    assert "pap_forward" in spy.ops
    spy = SubnormalSpy()
    with spy:
        loop = fused.pap_fused(k, v, None, tau, None, False, 0.0, n_iter, compiled=False)
    assert "pap_forward" not in spy.ops and "cutoff_exp_" in spy.ops  # the Python loop, its block kernels
    if dtype == torch.float64:  # the same numbers to float64 rounding (amplified over the steps)
        torch.testing.assert_close(out, loop, rtol=1e-10, atol=1e-10 * float(loop.abs().max()))
    else:  # float32: as accurate as the Python loop and the eager ops, all against the float64 loop
        # (float32 rounding grows ~10x a step here, and equally valid summation orders - the AVX2 and
        # AVX512 builds, blocked or whole GEMMs - land within ~2x of each other: seen 0.5-2.05x)
        exact = fused.pap_fused(k.double(), v.double(), None, tau.double(), None, False, 0.0, n_iter,
                                compiled=False)
        with kernels.eager_only():
            eager = fused.pap_fused(k, v, None, tau, None, False, 0.0, n_iter, compiled=False)
        err_c, err_l, err_e = (float((x.double() - exact).abs().max()) for x in (out, loop, eager))
        assert err_c <= 2.5 * max(err_l, err_e) + 1e-6 * float(exact.abs().max()), (err_c, err_l, err_e)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_iter", [1, 2, 3, 4])
@pytest.mark.parametrize("tau_shape", ["per_head", "per_row"])
@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_training_forward_equals_the_python_loop(dtype: torch.dtype, n_iter: int, tau_shape: str,
                                                          threads: int, monkeypatch: pytest.MonkeyPatch,
                                                          torch_threads) -> None:
    # PAPSaved's forward as one compiled call (pap_forward_saved) against its Python loop: the output, and the
    # gradients of K, V and tau through the saved probabilities and iterates (the backward reads every one of
    # them); several blocks of heads and a last, smaller one, every n_iter's buffer roles, at 1 and 2 threads
    monkeypatch.setattr(softmax, "_BLOCK_FLOATS", 3 * 29 * 29)  # 3 heads a block: 8 heads -> 3, 3, 2
    fused = importlib.import_module("kpca_attention.pap.fused")
    g = torch.Generator().manual_seed(10 + n_iter)
    k, v, gout = (2.0 * torch.randn(2, 4, 29, 12, generator=g, dtype=dtype) for _ in range(3))
    tau = {"per_head": torch.rand(2, 4, 1, 1, generator=g, dtype=dtype) + 0.3,
           "per_row": torch.rand(2, 4, 29, 1, generator=g, dtype=dtype) + 0.3}[tau_shape]

    def run(compiled: bool, dt: torch.dtype, eager_backward: bool = False) -> list[torch.Tensor]:
        kk, vv, tt = (x.detach().to(dt).clone().requires_grad_() for x in (k, v, tau))
        out = fused.PAPSaved.apply(kk, vv, tt, None, None, n_iter, compiled)
        with kernels.eager_only() if eager_backward else contextlib.nullcontext():
            out.backward(gout.to(dt))
        return [x.detach().double() for x in (out, kk.grad, vv.grad, tt.grad)]

    spy = SubnormalSpy()
    with torch_threads(threads), spy:
        got = run(True, dtype)
    assert {"pap_forward_saved", "pap_backward_saved"} <= set(spy.ops) and spy.subnormal == {}
    spy = SubnormalSpy()
    with spy:
        loop = run(False, dtype)
    assert "pap_forward_saved" not in spy.ops and "cutoff_exp_" in spy.ops
    spy = SubnormalSpy()
    with spy:  # the compiled forward's stacked tensors read by the Python backward (kernels off in between)
        mixed = run(True, dtype, eager_backward=True)
    assert "pap_forward_saved" in spy.ops and "pap_backward_saved" not in spy.ops
    if dtype == torch.float64:
        for a, b, c in zip(got, loop, mixed, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10 * float(b.abs().max()))
            torch.testing.assert_close(c, b, rtol=1e-10, atol=1e-10 * float(b.abs().max()))
    else:  # float32: as accurate as the Python loop, both against the float64 loop
        exact = run(False, torch.float64)
        for a, b, c, x in zip(got, loop, mixed, exact, strict=True):
            err_c, err_l, err_m = (float((y - x).abs().max()) for y in (a, b, c))
            assert max(err_c, err_m) <= 2.5 * err_l + 1e-6 * float(x.abs().max()), (err_c, err_m, err_l)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tau_rows", ["head", "row"])
@pytest.mark.parametrize("step", ["only", "last", "middle", "first"])
@pytest.mark.parametrize("need_tau", [True, False])
def test_update_backward_equals_the_eager_ops(dtype: torch.dtype, tau_rows: str, step: str,
                                              need_tau: bool) -> None:
    # PAPSaved's backward through one clamp + update, one pass (update_backward_) against clamp_backward +
    # update_backward; the step decides what flows: dR_t in (every step but the last), dL / dR_{t-1} out
    # (every step but the first); odd D for the vector loop's tail; tau per head (summed over its rows)
    # and per row
    g = torch.Generator().manual_seed(3)
    nb, n, d = 5, 13, 19
    dX, dR0, Z, gk0 = (torch.randn(nb, n, d, generator=g, dtype=dtype) for _ in range(4))
    tau = torch.rand(nb, 1 if tau_rows == "head" else n, 1, generator=g, dtype=dtype) + 0.3
    C = torch.maximum(torch.minimum(Z, tau), -tau)  # a clamp's output: inside, and at +-tau outside
    dr_in, prev = step in ("middle", "first"), step in ("last", "middle")
    dC = dX + dR0 if dr_in else dX.clone()
    dZ, part = updates.clamp_backward(dC, C, tau, need_tau)
    want_k = gk0 + dZ if dr_in else dZ
    gtau0 = torch.randn(tau.shape, generator=g, dtype=dtype)
    dR, gk, dL, gtau = dR0.clone(), gk0.clone(), torch.full_like(dX, float("nan")), gtau0.clone()
    assert updates.update_backward_fused(dX, dR if dr_in or prev else None, C, tau, gk, dL if prev else None,
                                         gtau if need_tau else None, dr_in=dr_in, accumulate_k=dr_in)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(gk, want_k, **tol)
    if prev:
        want_L, want_R = updates.update_backward(dC, dX, dZ)
        torch.testing.assert_close(dL, want_L, **tol)
        torch.testing.assert_close(dR, want_R, **tol)
    else:
        assert torch.isnan(dL).all()  # not written
        assert torch.equal(dR, dR0)
    if need_tau:
        torch.testing.assert_close(gtau, gtau0 + part, **tol)
    else:
        assert torch.equal(gtau, gtau0)


def test_eager_only_switches_the_kernels_off() -> None:
    before = kernels.active()
    with kernels.eager_only():
        assert kernels.active() is None
    assert kernels.active() is before
