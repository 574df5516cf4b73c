"""PAP's softmax steps without subnormal floats: :func:`cutoff_attention` and its dispatch in :func:`pap`.

PAP's iterates grow, and on random Gaussian keys (the benchmark's input) a third of the step-4
attention probabilities fall below float32's smallest normal number. On Intel cores every operation
on such a number takes a microcode assist, which made SDPA's CPU backward 10-25x slower. These tests
show, on any CPU vendor, that (a) no operation of pap's forward or backward produces a subnormal on
such inputs, (b) the cutoff path is what runs there, and (c) it computes the same numbers: against
SDPA and the float64 transcription of Algorithm 1, values and gradients.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pap_reference import pap_reference
from torch.utils._python_dispatch import TorchDispatchMode  # torch's own op-interception hook

from kpca_attention.pap import cutoff_attention, pap, softmax_cutoff

pap_module = importlib.import_module("kpca_attention.pap")  # the package re-exports the function pap
algorithm = importlib.import_module("kpca_attention.pap.algorithm")  # pap()'s dispatcher looks names up here
softmax = importlib.import_module("kpca_attention.pap.softmax")
variants = importlib.import_module("kpca_attention.pap.variants")
pytestmark = pytest.mark.usefixtures("single_thread")

F32, F64 = torch.float32, torch.float64
TINY = torch.finfo(F32).tiny
#: the ops that run the cutoff softmax's exp: eager, the compiled block kernel (pap/kernels.py, a dispatcher
#: op too), or the compiled whole loop of PAPSaved's forward (which returns every tensor it saves to the spy)
CUTOFF_EXP = {"exp_", "cutoff_exp_", "pap_forward_saved"}


def growing(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Gaussian k, v, dL/dL of shape (1, 3, n, 64): at n_iter=4 the iterates grow until ~37 % of
    the step-4 probabilities are subnormal in float32 (checked in the test that uses them)."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 3, n, 64, generator=g) for _ in range(3))  # type: ignore[return-value]


def n_subnormal(t: torch.Tensor) -> int:
    return int(((t != 0) & (t.abs() < torch.finfo(t.dtype).tiny)).sum()) if t.is_floating_point() else 0


class SubnormalSpy(TorchDispatchMode):
    """Records every aten op run (forward and backward) and the subnormals in its floating outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.subnormal: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.ops.append(name)
        if func.is_view or name in ("empty", "empty_like", "empty_strided", "new_empty"):
            return out  # computes nothing: a view, or uninitialised memory
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and (c := n_subnormal(t)):
                self.subnormal[name] = self.subnormal.get(name, 0) + c
        return out


def test_inputs_do_produce_subnormal_probabilities() -> None:
    # the control: without a cutoff, the softmax of the step-4 iterate holds subnormals
    k, v, _ = growing()
    history: list[dict] = []
    pap_reference(k.double(), v.double(), 4, 4.0, history=history)
    X = history[-1]["X"].float()
    P = torch.softmax(X @ X.transpose(-2, -1) / 8.0, dim=-1)
    assert n_subnormal(P) > 0.2 * P.numel()


@pytest.mark.parametrize("graph", ["saved", "per_step"])
def test_pap_forward_and_backward_make_no_subnormal(monkeypatch: pytest.MonkeyPatch, graph: str) -> None:
    # both graph-mode paths: PAPSaved (symmetric, small) and a Function per step (forced here)
    if graph == "per_step":
        monkeypatch.setattr(algorithm, "saves_probabilities", lambda *a: False)
    k, v, g = growing()
    k.requires_grad_()
    v.requires_grad_()
    spy = SubnormalSpy()
    with spy:
        out = pap(k, v, 4, 4.0)
        out.backward(g)
    assert spy.subnormal == {}
    assert CUTOFF_EXP & set(spy.ops)  # the cutoff path ran (SDPA's exp is inside one fused op)
    assert n_subnormal(k.grad) == n_subnormal(v.grad) == 0


def test_sdpa_kept_where_logits_are_narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    # with a graph and a Function per step (separate queries, dropout, or attention matrices too large
    # to keep; forced here), small keys (as in the trained models): every step stays on SDPA
    monkeypatch.setattr(algorithm, "saves_probabilities", lambda *a: False)
    k, v, _ = growing()
    k.requires_grad_()
    calls: list[str] = []
    sdpa = F.scaled_dot_product_attention

    def spy(*a, **kw):
        calls.append("sdpa")
        return sdpa(*a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    pap(0.05 * k, v, 4, 4.0)
    assert calls == ["sdpa"] * 4
    calls.clear()
    pap(k, v, 4, 4.0)
    assert 0 < len(calls) < 4  # the first steps are narrow, the later ones are not


@pytest.mark.parametrize("n", [64, 130])
def test_pap_float64_with_cutoff_equals_algorithm_1(n: int) -> None:
    # float64 has its own cutoff (72): on growing iterates pap takes the cutoff path in float64 too,
    # and matches the transcription (no cutoff) to float64 rounding, gradients w.r.t. k and v included
    k, v, g = (t.double() for t in growing(n, seed=1))
    kr, vr = k.clone().requires_grad_(), v.clone().requires_grad_()
    ref = pap_reference(kr, vr, 4, 4.0)
    ref.backward(g)
    kp, vp = k.clone().requires_grad_(), v.clone().requires_grad_()
    spy = SubnormalSpy()
    with spy:
        out = pap(kp, vp, 4, 4.0)
        out.backward(g)
    assert CUTOFF_EXP & set(spy.ops)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(vp.grad, vr.grad, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(kp.grad, kr.grad, rtol=1e-8, atol=1e-8 * float(kr.grad.abs().max()))


def test_pap_float32_cutoff_as_accurate_as_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    # float32 against float64: the cutoff path is as close as the plain SDPA path (same inputs)
    k, v, g = growing()
    k64, v64 = k.double().requires_grad_(), v.double().requires_grad_()
    ref = pap_reference(k64, v64, 4, 4.0)
    ref.backward(g.double())

    def run() -> tuple[torch.Tensor, ...]:
        kk, vv = k.clone().requires_grad_(), v.clone().requires_grad_()
        out = pap(kk, vv, 4, 4.0)
        out.backward(g)
        return out.detach(), vv.grad, kk.grad

    def err(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b).abs().max() / b.abs().max())

    cut = run()
    monkeypatch.setattr(algorithm, "uses_cutoff", lambda *a: False)
    plain = run()
    for c, p, r in zip(cut, plain, (ref.detach(), v64.grad, k64.grad), strict=True):
        assert err(c, r) <= 1.5 * err(p, r) + 1e-6
    assert err(cut[0], ref.detach()) < 1e-6 and err(cut[1], v64.grad) < 1e-4


def masks(nq: int, n: int) -> dict[str, dict]:
    g = torch.Generator().manual_seed(3)
    pad = torch.ones(2, 1, 1, n, dtype=torch.bool)
    pad[1, ..., -3:] = False
    bias = torch.randn(nq, n, generator=g, dtype=F64)
    hidden_row = torch.ones(nq, n, dtype=torch.bool)
    hidden_row[2] = False  # a query that sees no key: output 0, as SDPA
    return {
        "none": {},
        "padding": {"attn_mask": pad},
        "additive": {"attn_mask": bias.masked_fill(~pad[:, :, :1, :].expand(2, 1, nq, n), float("-inf"))},
        "causal": {"is_causal": True},
        "empty_row": {"attn_mask": hidden_row},
    }


@pytest.mark.parametrize("case", ["none", "padding", "additive", "causal", "empty_row"])
@pytest.mark.parametrize("asym", [False, True])
def test_cutoff_attention_equals_sdpa(case: str, asym: bool) -> None:
    g = torch.Generator().manual_seed(4)
    n = 11
    k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=F64) for _ in range(2))
    q = torch.randn(2, 3, n, 8, generator=g, dtype=F64) if asym else k
    kw = masks(n, n)[case]
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    torch.testing.assert_close(cutoff_attention(q, k, v, **kw), ref, rtol=1e-12, atol=1e-12)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    inputs = (kk, vv) if not asym else (qq, kk, vv)
    fn = (lambda a, b: cutoff_attention(a, a, b, **kw)) if not asym else (
        lambda a, b, c: cutoff_attention(a, b, c, **kw))
    assert torch.autograd.gradcheck(fn, inputs)


def test_cutoff_attention_long_rows_in_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    # rows longer than a block are processed in bands of query rows: the same numbers
    monkeypatch.setattr(softmax, "_BLOCK_FLOATS", 64)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 40, 8, generator=g, dtype=F64) for _ in range(3))
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    out = cutoff_attention(qq, kk, vv, is_causal=True)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, is_causal=True)
    torch.testing.assert_close(out, ref)
    go = torch.randn_like(out)
    out.backward(go)
    ref.backward(go)
    for a, b in zip((qq, kk, vv), ref_in, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_cutoff_attention_drops_only_what_is_below_resolution() -> None:
    # one logit 200 below the rest: its true probability is e^-200 (0 in float32); with the cutoff it
    # is e^-cutoff of the max, which moves the output by ~N * eps^2: nothing in float32
    k = torch.zeros(1, 1, 4, 2)
    q = torch.tensor([[[[1.0, 0.0]] * 4]])
    k[..., 3, 0] = -200.0 * math.sqrt(2)
    v = torch.randn(1, 1, 4, 2)
    out = cutoff_attention(q, k, v)
    expected = v[..., :3, :].mean(-2, keepdim=True).expand(1, 1, 4, 2)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-7)
    assert softmax_cutoff(F32) == pytest.approx(-2 * math.log(2.0**-23))


def test_dropout_keeps_its_mask_for_the_backward() -> None:
    g = torch.Generator().manual_seed(6)
    k, v = (torch.randn(1, 2, 9, 4, generator=g, dtype=F64).requires_grad_() for _ in range(2))

    def dropped(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(0)  # the same keep mask in every call gradcheck makes
        return cutoff_attention(a, a, b, dropout_p=0.5)

    out = dropped(k, v)
    assert not torch.allclose(out, cutoff_attention(k, k, v))
    assert torch.autograd.gradcheck(dropped, (k, v))


def test_rejects_what_it_cannot_do() -> None:
    x = torch.randn(1, 1, 3, 4)
    with pytest.raises(ValueError, match="float32 or float64"):
        cutoff_attention(x.half(), x.half(), x.half())
    with pytest.raises(ValueError, match="dropout_p"):
        cutoff_attention(x, x, x, dropout_p=1.0)
    with pytest.raises(ValueError, match="cutoff must be > 0"):
        cutoff_attention(x, x, x, cutoff=0.0)


def test_gpu_check_without_cuda_prints_one_line_and_exits_0() -> None:
    # benchmarks/gpu_check.py (make gpu-check) on a machine without a GPU: one line, status 0
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA device")


def test_compiled_pap_on_cpu_takes_the_cutoff_and_makes_no_subnormal() -> None:
    # What torch.compile traces on the CPU (pap's plain-ops path) uses the cutoff too: run eagerly under
    # the spy it produces no subnormal in forward or backward, and it never calls SDPA (whose fused
    # kernel would); compiled (aot_eager, no graph break) it equals eager pap, values and gradients.
    k, v, g = growing()
    tau = pap_module.pap_mu(k) * 4.0
    kt, vt = k.clone().requires_grad_(), v.clone().requires_grad_()
    spy = SubnormalSpy()
    with spy:
        out = variants.pap_compiled(kt, vt, None, pap_module.pap_mu(kt) * 4.0, None, False, 0.0, 4,
                                       True, True)
        out.backward(g)
    assert spy.subnormal == {}
    assert "exp" in spy.ops and "_scaled_dot_product_flash_attention_for_cpu" not in spy.ops
    assert not any("scaled_dot_product" in op for op in spy.ops)
    assert tau.shape[:2] == k.shape[:2]

    # equality in float64 (its own cutoff, 72, is also reached here): float32's k-gradient of grown
    # iterates differs between any two summation orders by more than a tolerance could separate
    k, v, g = (t.double() for t in (k, v, g))
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: pap(a, b, 4, 4.0), backend="aot_eager", fullgraph=True)
    kc, vc = k.clone().requires_grad_(), v.clone().requires_grad_()
    ke, ve = k.clone().requires_grad_(), v.clone().requires_grad_()
    got, expected = compiled(kc, vc), pap(ke, ve, 4, 4.0)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    got.backward(g)
    expected.backward(g)
    torch.testing.assert_close(vc.grad, ve.grad, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(kc.grad, ke.grad, rtol=1e-8, atol=1e-8 * float(ke.grad.abs().max()))


@pytest.mark.parametrize("mask", ["causal", "padding", "additive"])
def test_cutoff_attention_ops_equals_cutoff_attention(mask: str) -> None:
    # the compiled path's softmax step and the eager one agree under every kind of mask, with a query
    # that sees no key at all (output 0 in both)
    g = torch.Generator().manual_seed(3)
    q, k, v = (4.0 * torch.randn(2, 3, 10, 8, generator=g, dtype=F64) for _ in range(3))
    kw: dict = {}
    if mask == "causal":
        kw["is_causal"] = True
    else:
        vis = torch.rand(2, 1, 10, 10, generator=g) > 0.4
        vis[0, 0, 3] = False  # query 3 of batch 0 sees nothing
        kw["attn_mask"] = vis if mask == "padding" else torch.where(
            vis, torch.randn(2, 1, 10, 10, generator=g, dtype=F64), torch.tensor(float("-inf"), dtype=F64))
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    qb, kb, vb = (t.clone().requires_grad_() for t in (q, k, v))
    a = softmax.cutoff_attention_ops(qa, ka, va, **kw)
    b = cutoff_attention(qb, kb, vb, **kw)
    torch.testing.assert_close(a, b)
    w = torch.randn(a.shape, generator=g, dtype=F64)
    (a * w).sum().backward()
    (b * w).sum().backward()
    for x, y in ((qa, qb), (ka, kb), (va, vb)):
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-7, atol=1e-7)
    if mask != "causal":
        assert float(a.detach()[0, :, 3].abs().max()) == 0.0


# ----------------------------------------------------------------------------- the fused path


@pytest.mark.parametrize("case", ["none", "padding", "additive", "causal", "empty_row"])
@pytest.mark.parametrize("layout", ["heads", "bands", "asym"])
def test_fused_no_grad_path_equals_algorithm_1(
    case: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a graph, on the CPU, pap runs pap_fused: every step the cutoff softmax, the update of a
    # head's rows inside the softmax blocks as soon as they are done. "bands": blocks so small that
    # one head's query rows come in bands (its keys are still needed until the last band); "asym":
    # separate queries. Against the float64 transcription of Algorithm 1 (no mask) and against the
    # graph path (every mask: a separate implementation of each step, tested against SDPA above).
    if layout == "bands":
        monkeypatch.setattr(softmax, "_BLOCK_FLOATS", 64)
    g = torch.Generator().manual_seed(11)
    n = 13
    k, v = (3.0 * torch.randn(2, 3, n, 8, generator=g, dtype=F64) for _ in range(2))
    q = torch.randn(2, 3, n, 8, generator=g, dtype=F64) if layout == "asym" else None
    kw = masks(n, n)[case]
    calls: list[str] = []
    fused = algorithm.pap_fused
    monkeypatch.setattr(algorithm, "pap_fused", lambda *a: calls.append("fused") or fused(*a))
    with torch.no_grad():
        out = pap(k, v, 4, 4.0, q=q, **kw)
    assert calls == ["fused"]
    if case == "none":
        torch.testing.assert_close(out, pap_reference(k, v, 4, 4.0, q=q), rtol=1e-10, atol=1e-10)
    graph = pap(k.clone().requires_grad_(), v, 4, 4.0, q=q, **kw).detach()
    torch.testing.assert_close(out, graph, rtol=1e-10, atol=1e-10)


def test_fused_path_makes_no_subnormal_and_leaves_inputs_alone() -> None:
    k, v, _ = growing()
    k0, v0 = k.clone(), v.clone()
    spy = SubnormalSpy()
    with torch.no_grad(), spy:
        out = pap(k, v, 4, 4.0)
    assert spy.subnormal == {}
    assert "scaled_dot_product_attention" not in " ".join(spy.ops)
    assert n_subnormal(out) == 0 and torch.isfinite(out).all()
    assert torch.equal(k, k0) and torch.equal(v, v0)


def test_block_size_follows_threads_and_openmp_wait_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    # the cutoff softmax's blocks (B*H = 192 heads of 197 x 197 logits): 6 heads at 1 thread; at 2
    # threads 4x larger while OpenMP threads spin, 16x when they sleep (OMP_WAIT_POLICY=passive)
    threads = torch.get_num_threads()
    counts = {}
    try:
        for n_threads, policy in ((1, None), (2, None), (2, "PASSIVE"), (2, "active")):
            torch.set_num_threads(n_threads)
            if policy is None:
                monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
            else:
                monkeypatch.setenv("OMP_WAIT_POLICY", policy)
            counts[n_threads, policy] = len(softmax.block_slices(192, 197, 197))
    finally:
        torch.set_num_threads(threads)
    assert counts == {(1, None): 32, (2, None): 8, (2, "PASSIVE"): 2, (2, "active"): 8}


# ---- third mutation review (2026-11-30): each test fails on a mutant no earlier test caught
def test_compiled_pap_drops_attention_only_in_its_last_iteration(monkeypatch):
    """pap_compiled: dropout_p reaches the softmax step of the last iteration only (as the eager path)."""
    from kpca_attention.pap import variants

    calls = []
    real = variants.cutoff_attention_ops

    def spy(*args, **kwargs):
        calls.append(kwargs["dropout_p"])
        return real(*args, **kwargs)

    monkeypatch.setattr(variants, "cutoff_attention_ops", spy)
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(2))
    tau = torch.full((1, 2, 1, 1), 0.5)
    variants.pap_compiled(k, v, None, tau, None, False, 0.3, 3, True, True)
    assert calls == [0.0, 0.0, 0.3]
