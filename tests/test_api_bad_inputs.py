"""Bad inputs to the library's functions: empty tensors give empty outputs (the attention layers and
PAP, as a softmax attention of nothing is nothing) or one clear ``ValueError`` where a mean over no
tokens is asked for (the projection loss); counts are bounded by the input; a wrong kind of argument
is one ``TypeError`` that says what is expected."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch

from kpca_attention.attention import RPCAttention, SymmetricAttention, replace_attention
from kpca_attention.attention.registry import get_mechanism, mechanisms
from kpca_attention.checks import Choice, Int, Real, check_count, check_parameters
from kpca_attention.kpca import projection_loss
from kpca_attention.kpca.analysis import AnalysisConfig
from kpca_attention.kpca.diagnostics import projection_loss_official
from kpca_attention.kpca.run import analyze_model
from kpca_attention.models.lm import create_lm
from kpca_attention.pap import pap
from kpca_attention.robustness.corruptions import corrupt
from kpca_attention.tasks import get as get_task
from kpca_attention.train.resolve import LoadedModel

pytestmark = pytest.mark.usefixtures("single_thread")

EMPTY = [(0, 2, 5, 4), (1, 0, 5, 4), (1, 2, 0, 4), (1, 2, 5, 0)]


@pytest.mark.parametrize("shape", EMPTY, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
def test_pap_of_an_empty_input_is_empty(shape, causal) -> None:
    k = torch.randn(shape, requires_grad=True)
    v = torch.randn(shape)
    out = pap(k, v, is_causal=causal)
    assert out.shape == shape
    out.sum().backward()  # a graph of nothing, but a graph
    assert k.grad is not None and k.grad.shape == shape


@pytest.mark.parametrize("shape", EMPTY[:3], ids=lambda s: "x".join(map(str, s)))
def test_pap_checks_options_on_an_empty_input_too(shape) -> None:
    with pytest.raises(ValueError, match="n_iter"):
        pap(torch.randn(shape), torch.randn(shape), n_iter=0)


@pytest.mark.parametrize(("b", "n"), [(0, 5), (2, 0)])
def test_rpc_attention_is_empty_in_empty_out_as_symmetric(b, n) -> None:
    torch.manual_seed(0)
    x = torch.randn(b, n, 8)
    sym, rpc = SymmetricAttention(8, 2)(x), RPCAttention(8, 2)(x)
    assert sym.shape == rpc.shape == (b, n, 8)


@pytest.mark.parametrize("name", mechanisms())
@pytest.mark.parametrize(("b", "n"), [(0, 5), (2, 0)])
def test_every_family_mechanism_maps_empty_to_empty(name, b, n) -> None:
    """Each registered mechanism's layer (two of them, so a stateful one also sees a later layer's
    state), with its vision defaults, on no images / no tokens: empty in, empty out, as softmax."""
    mech = get_mechanism(name)
    cls = mech.layer_class("vision", symmetric=mech.symmetric_ok and not mech.asymmetric_ok)
    kw = {"num_tokens": 5} if "num_tokens" in mech.option_names() else {}  # sized for 5, given n
    torch.manual_seed(0)
    layers = [cls(8, num_heads=2, **kw), cls(8, num_heads=2, **kw)]
    x = torch.randn(b, n, 8)
    if mech.stateful:
        out, state = layers[0](x, state={})
        out, _ = layers[1](x, state=state)
    else:
        out = layers[1](layers[0](x))
    assert out.shape == (b, n, 8)


@pytest.mark.parametrize("fn", [projection_loss, projection_loss_official])
@pytest.mark.parametrize("shape", [(0, 2, 5, 4), (1, 2, 0, 4), (1, 2, 5, 0)])
def test_projection_loss_of_no_tokens_is_one_clear_error(fn, shape) -> None:
    k = torch.randn(shape)
    with pytest.raises(ValueError, match="at least one"):
        fn(k, k, k)


def test_corrupt_refuses_an_empty_image() -> None:
    with pytest.raises(ValueError, match="0x0"):
        corrupt(np.zeros((0, 0, 3), np.uint8), "fog", 1)


def test_replace_attention_refuses_an_instance() -> None:
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1)
    with pytest.raises(TypeError, match="a class.*not an instance"):
        replace_attention(model, RPCAttention(192, 3))


def test_prefixes_are_bounded_by_the_positions_before_any_work(monkeypatch) -> None:
    torch.manual_seed(0)
    net = create_lm("symlm", 50, preset="small", context=16, n_layer=1, d_model=16, n_head=2, d_ff=32).eval()
    loaded = LoadedModel(name="symlm", model=net, task=get_task("lm"), info={"task": "lm", "causal": True})
    tokens = torch.randint(50, (2, 16))

    def boom(*a, **k):
        raise AssertionError("analysed before checking --prefixes")

    monkeypatch.setattr("kpca_attention.kpca.run.Analyzer.add", boom)
    with pytest.raises(ValueError, match=r"prefixes must be an integer in \[1, 16\]"):
        analyze_model(loaded, tokens=tokens, prefixes=10**9, config=AnalysisConfig(), progress=False)


@pytest.mark.parametrize(("key", "value"), [("batch_size", 0), ("max_length", 0), ("prefixes", 0)])
def test_analyze_model_checks_its_counts(key, value) -> None:
    net = create_lm("symlm", 50, preset="small", context=16, n_layer=1, d_model=16, n_head=2, d_ff=32).eval()
    loaded = LoadedModel(name="symlm", model=net, task=get_task("lm"), info={"task": "lm", "causal": True})
    with pytest.raises(ValueError, match=f"{key} must be an integer >= 1"):
        analyze_model(loaded, tokens=torch.randint(50, (2, 16)), progress=False, **{key: value})


def test_check_parameters_table() -> None:
    table = {"batch_size": Int(min=1), "rate": Real(min=0, max=1, max_open=True), "order": Choice(("a", "b"))}
    checked = check_parameters({"batch_size": 3, "rate": 0.5, "order": "a", "free": object}, table)
    assert checked["batch_size"] == 3 and checked["free"] is object
    with pytest.raises(ValueError, match="--batch-size must be an integer >= 1; got 0"):
        check_parameters({"batch_size": 0}, table, cli=True)
    with pytest.raises(ValueError, match=r"rate must be a finite number in \[0, 1\)"):
        check_parameters({"rate": 1.0}, table)
    with pytest.raises(ValueError, match="order must be one of a, b"):
        check_parameters({"order": "c"}, table)
    assert check_count(10, "--n", 10, "the images") == 10
    with pytest.raises(ValueError, match=r"--n must be an integer in \[1, 10\] \(the images\); got 11"):
        check_count(11, "--n", 10, "the images")
