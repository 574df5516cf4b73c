"""Causal language models: configuration, causality of PAP under the mask, loss and perplexity protocol."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from timm.layers import Attention

from kpca_attention.attention import RPCAttention, SymmetricAttention
from kpca_attention.models import LMConfig, create_lm, create_model, perplexity

TINY = dict(n_layer=2, n_head=2, d_model=16, d_ff=32, context=8, dropout=0.0)


def tiny(name: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_lm(name, vocab_size=13, **{**TINY, **kw}).eval()


def test_paper_configuration():
    m = create_lm("rpc_symlm", vocab_size=100)
    c = m.cfg
    assert (c.n_layer, c.n_head, c.d_model, c.d_ff, c.dropout, c.context) == (16, 8, 128, 2048, 0.1, 256)
    assert m.rpc_blocks == [0, 1, 2, 3]
    for i, blk in enumerate(m.blocks):
        if i < 4:
            a = blk.attn
            assert isinstance(a, RPCAttention) and (a.n_iter, a.lam, a.symmetric) == (4, 4.0, True)
        else:
            assert type(blk.attn) is SymmetricAttention
    assert m.blocks[0].mlp.fc1.out_features == 2048
    assert all(type(b.attn) is SymmetricAttention for b in create_lm("symlm", vocab_size=9, n_layer=3).blocks)
    assert all(type(b.attn) is Attention for b in create_lm("lm", vocab_size=9, n_layer=3).blocks)
    assert create_lm("rpc_symlm", vocab_size=9, n_layer=2).rpc_blocks == [0, 1]
    small = create_model("rpc_symlm", vocab_size=100, preset="small")
    assert small.cfg.n_layer == 4 and small.cfg.context == 64 and small.rpc_blocks == [0]


def test_config_errors():
    with pytest.raises(ValueError, match="divisible"):
        LMConfig(vocab_size=10, d_model=30, n_head=4)
    with pytest.raises(ValueError, match="cutoffs"):
        LMConfig(vocab_size=10, adaptive_softmax_cutoffs=(5, 3))
    with pytest.raises(ValueError, match="unknown language model"):
        create_lm("rpclm", vocab_size=10)
    with pytest.raises(ValueError, match="preset"):
        create_lm("lm", vocab_size=10, preset="huge")
    with pytest.raises(TypeError, match="n_layers"):
        create_lm("lm", vocab_size=10, n_layers=3)
    m = tiny("lm")
    with pytest.raises(ValueError, match="context"):
        m(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("name", ["rpc_symlm", "symlm", "lm"])
def test_causal(name):
    """Changing tokens at positions >= t leaves the outputs at positions < t unchanged."""
    m = tiny(name, **({"rpc_layers": "all"} if name == "rpc_symlm" else {}))
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 13, (3, 8), generator=g)
    for t in (1, 4, 7):
        y = x.clone()
        y[:, t:] = torch.randint(0, 13, (3, 8 - t), generator=g)
        assert not torch.equal(x, y)
        lx, _ = m(x)
        ly, _ = m(y)
        torch.testing.assert_close(lx[:, :t], ly[:, :t], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(lx[:, t:], ly[:, t:])


def test_loss_matches_logits_and_backward():
    m = tiny("rpc_symlm").train()
    x = torch.randint(0, 13, (2, 8))
    y = torch.randint(0, 13, (2, 8))
    logits, loss = m(x, y)
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), y.flatten()))
    loss.backward()
    g = m.blocks[0].attn.kv.weight.grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    assert m.head.weight is m.tok_emb.weight  # tied


def test_adaptive_softmax():
    m = tiny("symlm", adaptive_softmax_cutoffs=(4, 8))
    x, y = torch.randint(0, 13, (2, 8)), torch.randint(0, 13, (2, 8))
    none, loss = m(x, y)
    assert none is None
    logp, no_loss = m(x)
    assert no_loss is None and logp.shape == (2, 8, 13)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(2, 8))
    torch.testing.assert_close(loss, -logp.gather(-1, y.unsqueeze(-1)).mean())


def direct_ppl(m, ids: torch.Tensor, L: int, stride: int) -> float:
    """Score each token from its own prefix forward: token j sees ids[start:j] with the protocol's start."""
    n = ids.numel()
    nll = []
    first = min(L, n - 1)
    ends = [first]
    while ends[-1] < n - 1:
        ends.append(min(ends[-1] + stride, n - 1))
    for j in range(1, n):
        end = next(e for e in ends if e >= j)  # the window predicting token j ends at target index `end`
        start = max(0, end - L)
        with torch.no_grad():
            logits, _ = m(ids[start:j].unsqueeze(0))
        nll.append(float(F.cross_entropy(logits[0, -1:], ids[j : j + 1])))
    return math.exp(sum(nll) / len(nll))


@pytest.mark.parametrize("name", ["rpc_symlm", "lm"])
def test_perplexity_protocol(name):
    m = tiny(name)
    ids = torch.randint(0, 13, (23,), generator=torch.Generator().manual_seed(2))
    for stride, batch_sizes in ((1, (1, 5)), (3, (2,)), (8, (4,))):
        want = direct_ppl(m, ids, 8, stride)
        for bs in batch_sizes:
            got = perplexity(m, ids, context=8, batch_size=bs, stride=stride, progress=False)
            assert got == pytest.approx(want, rel=1e-5), (stride, bs)
    # the approximation differs from the protocol (less context for some tokens)
    assert perplexity(m, ids, 8, stride=8, progress=False) != pytest.approx(
        perplexity(m, ids, 8, stride=1, progress=False), rel=1e-6)


def test_perplexity_short_text_adaptive_and_errors():
    m = tiny("symlm", adaptive_softmax_cutoffs=(4,))
    ids = torch.randint(0, 13, (6,))
    got = perplexity(m, ids.tolist(), context=8, progress=False)  # text shorter than one window
    with torch.no_grad():
        logp, _ = m(ids[:-1].unsqueeze(0))
    want = math.exp(-float(logp[0].gather(-1, ids[1:].unsqueeze(-1)).mean()))
    assert got == pytest.approx(want, rel=1e-5)
    m.train()
    perplexity(m, ids, context=4, progress=False)
    assert m.training  # mode restored
    with pytest.raises(ValueError, match="exceeds"):
        perplexity(m, ids, context=9)
    with pytest.raises(ValueError, match="at least 2"):
        perplexity(m, ids[:1], context=4)
    with pytest.raises(ValueError, match="stride"):
        perplexity(m, ids, context=4, stride=5)


@pytest.mark.parametrize(("name", "kw"), [("symlm", {"rpc_iters": 8}), ("lm", {"rpc_layers": "all"}),
                                          ("rpc_symlm", {"attn_kwargs": {"lam": 9.0}}),
                                          ("rpc_symlm", {"attn_layers": "all"}),
                                          ("neutreno_lm", {"rpc_iters": 8})])
def test_an_lm_refuses_the_options_it_does_not_use(name, kw) -> None:
    """A review trained symlm with rpc_iters=8 and rpc_symlm with attn_kwargs={"lam": 9}: both ran without
    those settings (no RPC layer; lam 4) while the config recorded them."""
    with pytest.raises(TypeError, match=rf"{name} does not use {next(iter(kw))}: rpc_\* options apply to "
                                        "rpc_symlm"):
        create_lm(name, 100, preset="small", **kw)
    with pytest.raises(ValueError, match=rf"{name} does not use"):  # the command line's path: one line
        create_model(name, vocab_size=100, preset="small", **kw)


def test_an_lm_keeps_the_options_it_uses() -> None:
    assert create_lm("rpc_symlm", 100, preset="small", rpc_iters=2).cfg.rpc_iters == 2
    assert create_lm("lm", 100, preset="small", attn_dropout=0.1).cfg.attn_dropout == 0.1
    neutreno = create_lm("neutreno_lm", 100, preset="small", attn_kwargs={"lam": 0.3})
    assert neutreno.cfg.attn_kwargs == {"lam": 0.3}
