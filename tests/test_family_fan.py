"""FAN's channel-attention MLP and the FAN / RPC-FAN ViTs (issue 25): the block against a float64
transcription of the official ChannelProcessing behaviour, gradcheck, the class token outside the conv,
RPC-FAN's first block (RPC, 4 iterations, lambda 4), timm models on a 28 px batch."""

from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import Attention

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import RPCAttention, SymmetricAttention
from kpca_attention.attention.fan import FANChannelMLP
from kpca_attention.models import create_model
from kpca_attention.models.fan import FAN_MODELS

pytestmark = pytest.mark.usefixtures("single_thread")


def make(c=8, heads=2, hidden=12, prefix=1) -> FANChannelMLP:
    torch.manual_seed(0)
    m = FANChannelMLP(c, hidden, num_heads=heads, num_prefix_tokens=prefix).double().eval()
    with torch.no_grad():  # non-trivial BN statistics, gamma and temperature
        m.dwconv.bn.running_mean.normal_()
        m.dwconv.bn.running_var.uniform_(0.5, 2.0)
        m.gamma.uniform_(0.5, 1.5)
        m.temperature.uniform_(0.5, 1.5)
    return m


def reference(m: FANChannelMLP, x: torch.Tensor, prefix: int) -> torch.Tensor:
    """Token by token and channel by channel, float64 (BN in eval mode: running statistics)."""
    x = x.double()
    b, n, c = x.shape
    g = math.isqrt(n - prefix)
    u = x @ m.fc1.weight.double().T + m.fc1.bias.double()
    grid = u[:, prefix:].transpose(1, 2).reshape(b, -1, g, g)
    dw = m.dwconv
    y = F.conv2d(grid, dw.conv1.weight.double(), dw.conv1.bias.double(), padding=1, groups=grid.shape[1])
    y = F.gelu(y)
    bn = dw.bn
    y = (y - bn.running_mean.double()[:, None, None]) / torch.sqrt(bn.running_var.double()[:, None, None]
                                                                  + bn.eps)
    y = y * bn.weight.double()[:, None, None] + bn.bias.double()[:, None, None]
    y = F.conv2d(y, dw.conv2.weight.double(), dw.conv2.bias.double(), padding=1, groups=grid.shape[1])
    conv = torch.zeros_like(u)
    conv[:, prefix:] = y.reshape(b, -1, g * g).transpose(1, 2)
    u = u + m.gamma.double() * conv
    v = u @ m.fc2.weight.double().T + m.fc2.bias.double()
    v = F.layer_norm(v, (c,), m.norm_v.weight.double(), m.norm_v.bias.double(), m.norm_v.eps)
    q = x @ m.q.weight.double().T + m.q.bias.double()
    h, ch = m.num_heads, c // m.num_heads
    out = torch.empty_like(v)
    for bi in range(b):
        for hd in range(h):
            cols = slice(hd * ch, (hd + 1) * ch)
            qs = torch.softmax(q[bi, :, cols], dim=0)  # over tokens
            ks = torch.softmax(x[bi, :, cols], dim=0).mean(dim=1)  # over tokens, then the group's mean
            a = m.temperature.double()[hd, 0, 0] * torch.sigmoid(qs.T @ ks)  # one weight per channel
            out[bi, :, cols] = v[bi, :, cols] * a
    return out


@pytest.mark.parametrize("prefix", [0, 1])
def test_channel_block_matches_the_transcription(prefix: int) -> None:
    m = make(prefix=prefix)
    x = torch.randn(2, prefix + 9, 8, dtype=torch.float64)
    torch.testing.assert_close(m(x), reference(m, x, prefix))


def test_gradcheck() -> None:
    m = make(c=4, heads=2, hidden=4)
    x = torch.randn(1, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,))


def test_checks() -> None:
    with pytest.raises(ValueError, match="divide"):
        FANChannelMLP(6, 8, num_heads=4)
    with pytest.raises(ValueError, match="grid"):
        make(prefix=1)(torch.randn(1, 9 + 3, 8, dtype=torch.float64))


def test_fan_models() -> None:
    assert set(FAN_MODELS) == {f"{f}_{s}" for f in ("fan_vit", "rpc_fan_vit", "fan_symvit", "rpc_fan_symvit")
                               for s in ("mini_patch4_28", "tiny_patch16_224")}
    tiny = timm.create_model("fan_vit_tiny_patch16_224", device="meta")
    assert (tiny.embed_dim, len(tiny.blocks), tiny.blocks[0].attn.num_heads) == (192, 12, 4)
    assert all(isinstance(b.mlp, FANChannelMLP) and b.mlp.num_heads == 4 for b in tiny.blocks)
    rpc = timm.create_model("rpc_fan_vit_tiny_patch16_224", device="meta")
    first = rpc.blocks[0].attn
    assert isinstance(first, RPCAttention) and (first.n_iter, first.lam) == (4, 4.0)
    assert not any(isinstance(b.attn, RPCAttention) for b in rpc.blocks[1:]) and rpc.rpc_blocks == [0]
    assert create_model("fan_vit_mini_patch4_28").blocks[0].ls2.gamma.eq(1.0).all()  # FAN's eta
    with pytest.raises(TypeError, match="RPC-FAN"):
        create_model("fan_vit_mini_patch4_28", attn_kwargs={"lam": 2.0})


def test_symmetric_fan_models_are_the_rpc_papers_pair() -> None:
    """Appendix E.7: FAN-tiny "with a symmetric attention", RPC-FAN = its first layer's attention replaced
    by RPC. The pair differs in block 1 only; the asymmetric rpc_fan_vit keeps queries in blocks 2-N."""
    fan_sym = timm.create_model("fan_symvit_tiny_patch16_224", device="meta")
    assert all(type(b.attn) is SymmetricAttention for b in fan_sym.blocks)
    assert all(isinstance(b.mlp, FANChannelMLP) for b in fan_sym.blocks)
    rpc = timm.create_model("rpc_fan_symvit_tiny_patch16_224", device="meta")
    first = rpc.blocks[0].attn
    assert isinstance(first, RPCAttention) and first.symmetric and (first.n_iter, first.lam) == (4, 4.0)
    assert all(type(b.attn) is SymmetricAttention for b in rpc.blocks[1:]) and rpc.rpc_blocks == [0]
    asym = timm.create_model("rpc_fan_vit_tiny_patch16_224", device="meta")
    assert all(type(b.attn) is Attention for b in asym.blocks[1:])
    # same parameters outside block 1's attention (symmetric attention has no query projection)
    names = {n for n, _ in fan_sym.named_parameters()}
    assert names == {n for n, _ in rpc.named_parameters()}
    with pytest.raises(TypeError, match="symmetric FAN"):
        create_model("rpc_fan_symvit_mini_patch4_28", rpc_symmetric=False)


def test_rpc_fan_study_margins_belong_to_its_one_comparison() -> None:
    from kpca_attention.studies import get_study

    study = get_study("rpc-fan")
    assert study.baseline == "fan_sym" and [v.model for v in study.variants] == [
        "fan_symvit_mini_patch4_28", "rpc_fan_symvit_mini_patch4_28"]
    zoo = get_study("zoo")
    assert (study.seeds, study.suites.to_dict(), study.recipe, study.trace) == (
        zoo.seeds, zoo.suites.to_dict(), zoo.recipe, zoo.trace)
    assert {k: (m.value, m.against) for k, m in study.margins.items()} == {
        ("rpc_fan_sym", "clean"): (0.09, "fan_sym"), ("rpc_fan_sym", "fgsm@8"): (3.11, "fan_sym"),
        ("rpc_fan_sym", "pgd@8"): (3.33, "fan_sym")}


@pytest.mark.parametrize("name", ["fan_vit_mini_patch4_28", "rpc_fan_vit_mini_patch4_28",
                                  "fan_symvit_mini_patch4_28", "rpc_fan_symvit_mini_patch4_28"])
def test_timm_model_forward_and_backward(name: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name)
    out = model(torch.randn(2, 1, 28, 28))
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    out.sum().backward()
    assert model.blocks[0].mlp.temperature.grad is not None
