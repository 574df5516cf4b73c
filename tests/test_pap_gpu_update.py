"""PAP's fused GPU update (pap/gpu_update.py) equals the eager update, values and gradients.

The fused update is used on CUDA only; here it runs on the CPU (``DEVICE_TYPES`` widened), compiled by the
same ``torch.compile`` (inductor's C++ backend instead of Triton), so the arithmetic is checked on every
machine; benchmarks/gpu_check.py checks it on a GPU against the float64 transcription of Algorithm 1.
"""

from __future__ import annotations

import pytest
import torch

from kpca_attention.pap import gpu_update, pap
from kpca_attention.pap.updates import UpdateStep


@pytest.fixture
def fused_on_cpu(monkeypatch):
    monkeypatch.setattr(gpu_update, "DEVICE_TYPES", ("cpu", "cuda"))
    monkeypatch.setattr(gpu_update, "_ENABLED", True)
    yield
    torch._dynamo.reset()


def _inputs(dtype, tau_shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (2, 3, 7, 5)
    k, L, R = (torch.randn(shape, generator=g, dtype=dtype) for _ in range(3))
    tau = (0.3 + torch.rand(tau_shape, generator=g, dtype=dtype))  # some entries clamped, some not
    return k, L, R, tau


@pytest.mark.parametrize("tau_shape", [(2, 3, 7, 1), (1, 1, 1, 1)])
def test_fused_update_equals_eager(fused_on_cpu, tau_shape) -> None:
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        k, L, R, tau = _inputs(dtype, tau_shape)
        outs, grads = {}, {}
        for mode in ("eager", "fused"):
            gpu_update.DEVICE_TYPES = ("cpu",) if mode == "fused" else ()
            xs = [t.clone().requires_grad_() for t in (k, L, R, tau)]
            R1, X1 = UpdateStep.apply(*xs)
            g = torch.Generator().manual_seed(1)
            (R1 * torch.randn(R1.shape, generator=g, dtype=dtype)
             + X1 * torch.randn(X1.shape, generator=g, dtype=dtype)).sum().backward()
            outs[mode] = (R1.detach(), X1.detach())
            grads[mode] = [x.grad for x in xs]
        assert gpu_update._proven >= {"forward", "backward"}, "the fused path did not run"
        for a, b in zip(outs["eager"], outs["fused"], strict=True):
            assert a.dtype == b.dtype
            torch.testing.assert_close(b, a, atol=tol, rtol=tol)
        for name, a, b in zip("k L R tau".split(), grads["eager"], grads["fused"], strict=True):
            assert a is not None and b is not None, name
            torch.testing.assert_close(b, a, atol=tol, rtol=tol, msg=f"gradient of {name}")


def test_fused_update_gradcheck_and_pap(fused_on_cpu) -> None:
    k, L, R, tau = _inputs(torch.float64, (2, 3, 7, 1), seed=3)
    xs = [t.requires_grad_() for t in (k, L, R, tau)]
    assert torch.autograd.gradcheck(lambda *a: UpdateStep.apply(*a), xs, eps=1e-6, atol=1e-7)
    # the whole of pap through the reference loop (return_info keeps the CPU's fused paths out), masked
    g = torch.Generator().manual_seed(4)
    kk, vv = (torch.randn(2, 3, 9, 4, generator=g, dtype=torch.float64) for _ in range(2))
    pad = torch.ones(2, 9, dtype=torch.bool)
    pad[1, 7:] = False
    res, calls = {}, []
    forward = gpu_update.forward
    gpu_update.forward = lambda *a: calls.append(True) or forward(*a)
    for mode in ("eager", "fused"):
        gpu_update.DEVICE_TYPES = ("cpu",) if mode == "fused" else ()
        a, b = kk.clone().requires_grad_(), vv.clone().requires_grad_()
        out = pap(a, b, 4, 0.3, attn_mask=pad, return_info=True)[0]
        out.square().sum().backward()
        res[mode] = (out.detach(), a.grad, b.grad)
    gpu_update.forward = forward
    for x, y in zip(res["eager"], res["fused"], strict=True):
        torch.testing.assert_close(y, x, atol=1e-12, rtol=1e-12)
    assert calls == [True] * 3, "pap's three updates did not all run fused"


def test_fused_update_off_by_default_on_cpu() -> None:
    assert not gpu_update.applies(torch.zeros(1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_update_on_cuda_equals_eager() -> None:
    """On a GPU (gpu_check runs it): Triton's kernel against the eager ops, float64 and float32."""
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        k, L, R, tau = (t.cuda() for t in _inputs(dtype, (2, 3, 7, 1)))
        res = {}
        for fused in (False, True):
            gpu_update._ENABLED = fused
            xs = [t.clone().requires_grad_() for t in (k, L, R, tau)]
            R1, X1 = UpdateStep.apply(*xs)
            (R1 * 0.7 + X1 * 1.3).sum().backward()
            res[fused] = [R1.detach(), X1.detach(), *(x.grad for x in xs)]
        gpu_update._ENABLED = True
        assert gpu_update._proven >= {"forward", "backward"}
        for a, b in zip(res[False], res[True], strict=True):
            torch.testing.assert_close(b, a, atol=tol, rtol=tol)
