"""Checks shared by the robust-attention family's tests (tests/test_family_*.py, issue 25), each taking the
mechanism's layers, model or name as a parameter: running a stack of stateful layers, the padding mask of
a test case, comparing a stack with its float64 transcription, gradcheck, the causal LM's no-leak
property, a timm model's forward and the names of the operators a block of code runs. The transcriptions
themselves stay in each test file and in :mod:`family_reference` (independent of the code under test)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import timm
import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode  # torch's own op-interception hook

from kpca_attention.models import create_model


def run_stack(layers: Sequence[nn.Module], xs: Sequence[Tensor], **kw) -> list[Tensor]:
    """Each layer on its own input, the cross-layer state threaded from one to the next."""
    state, outs = {}, []
    for layer, x in zip(layers, xs, strict=True):
        o, state = layer(x, state=state, **kw)
        outs.append(o)
    return outs


def case_mask(case: str, n: int, keep: int) -> Tensor | None:
    """The (2, 1, 1, n) key mask of a test case: for ``"padding"`` the second sample's keys from ``keep``
    on are hidden; for any other case no mask."""
    if case != "padding":
        return None
    mask = torch.ones(2, 1, 1, n, dtype=torch.bool)
    mask[1, ..., keep:] = False
    return mask


def finite_bias_mask(n: int, seed: int = 3) -> Tensor:
    """A float mask (1, 1, n, n) of finite additive biases (ALiBi-like, float64) that also hides the last key
    (-inf): a mechanism must add the biases to its logits, not only honour the hidden key."""
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn(1, 1, n, n, dtype=torch.float64, generator=g) * 2.0
    bias[..., -1] = float("-inf")
    return bias


def assert_stack_matches(layers: Sequence[nn.Module], xs: Sequence[Tensor], reference: Callable[..., list],
                         mask: Tensor | None = None, causal: bool = False) -> None:
    """Every layer's output of :func:`run_stack` equals ``reference(layers, xs, mask, causal)``'s, with
    gradients recorded and without (where mechanisms may update their attention output in place)."""
    want = reference(layers, xs, mask, causal)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            got = run_stack(layers, xs, attn_mask=mask, is_causal=causal)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)


def stack_gradcheck(layers: Sequence[nn.Module], xs: Sequence[Tensor], raise_exception: bool = True) -> bool:
    """gradcheck of all the stack's (causal) outputs with respect to all its inputs."""

    def f(*inputs):
        return torch.cat([o.flatten() for o in run_stack(layers, list(inputs), is_causal=True)])

    return torch.autograd.gradcheck(f, tuple(xs), raise_exception=raise_exception)


def layer_gradcheck(layer: nn.Module, x: Tensor, causal: bool) -> bool:
    """gradcheck of one layer's output with respect to its input."""
    return torch.autograd.gradcheck(lambda t: layer(t, is_causal=causal), (x,))


def causal_lm(name: str, n_layer: int, vocab_size: int = 30, **kw) -> nn.Module:
    """A small causal LM of ``name`` in evaluation mode, built after seeding 0."""
    torch.manual_seed(0)
    return create_model(name, vocab_size=vocab_size, preset="small", n_layer=n_layer, **kw).eval()


def assert_no_leak_from_the_future(lm: nn.Module, n: int, t: int, vocab_size: int = 30,
                                   shift: bool = False) -> None:
    """Two batches of ``n`` tokens equal up to position ``t`` and different after it (new random tokens,
    or with ``shift`` every later token + 1): the logits up to ``t`` are equal, the later ones differ."""
    idx = torch.randint(0, vocab_size, (2, n))
    changed = idx.clone()
    if shift:
        changed[:, t + 1:] = (idx[:, t + 1:] + 1) % vocab_size
    else:
        changed[:, t + 1:] = torch.randint(0, vocab_size, (2, n - t - 1))
    with torch.no_grad():
        a, b = lm(idx)[0], lm(changed)[0]
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def timm_forward(name: str) -> tuple[nn.Module, Tensor]:
    """The timm model ``name`` (seeded 0, evaluation mode) on a batch of two 28 px images: 10 finite logits
    each. Returns the model and its output."""
    torch.manual_seed(0)
    model = timm.create_model(name).eval()
    out = model(torch.randn(2, 1, 28, 28))
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    return model, out


class OpNames(TorchDispatchMode):
    """The names of the operators a block of code runs (``with OpNames() as ops: ...; ops.names``)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
