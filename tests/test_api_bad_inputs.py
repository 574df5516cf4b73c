"""Bad inputs to the library's functions: empty tensors give empty outputs (the attention layers and
PAP, as a softmax attention of nothing is nothing) or one clear ``ValueError`` where a mean over no
tokens is asked for (the projection loss); counts are bounded by the input; a wrong kind of argument
is one ``TypeError`` that says what is expected."""

from __future__ import annotations

import contextlib

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


# --- the third fuzz review (/work/notes/review/fuzz3.md): silent acceptances and late failures -------------

@pytest.mark.parametrize(("name", "says"), [("eva02_tiny_patch14_224", "its forward takes rope"),
                                            ("beit_base_patch16_224", "q_bias")])
def test_replace_attention_refuses_layers_whose_parts_it_would_drop_before_changing_anything(name, says):
    """It swapped RPC into EVA / BEiT, dropped their q/v biases and position tables, and the first forward
    failed with a TypeError on a model already changed; now a ValueError before anything is replaced."""
    model = timm.create_model(name, num_classes=3, pretrained=False, img_size=28, patch_size=14)
    before = type(model.blocks[0].attn)
    with pytest.raises(ValueError, match=rf"block 0: cannot replace .*{says}"):
        replace_attention(model, RPCAttention, "first")
    assert type(model.blocks[0].attn) is before


@pytest.mark.parametrize("spec", [1.5, 1.0, None, ["0"], [0.0], True])
def test_block_specs_of_the_wrong_kind_are_one_value_error(spec) -> None:
    from kpca_attention.attention import resolve_blocks

    with pytest.raises(ValueError, match=r"valid: 'all', 'first', 'last', 'none', an index"):
        resolve_blocks(spec, 4)


def test_pap_hooks_must_name_a_state_and_masks_no_plus_infinity() -> None:
    k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    for name in ("L.4", "l.3", "L3", "Mu"):  # never called: the intervention would silently not happen
        with pytest.raises(ValueError, match=r"pap: hooks \[.*\] name no state of 4 iterations; valid: mu"):
            pap(k, v, hooks={name: lambda t: t * 0})
    assert torch.equal(pap(k, v, hooks={"L.3": lambda t: t * 0}), torch.zeros_like(v))
    mask = torch.zeros(1, 1, 5, 5)
    mask[..., 0] = float("inf")  # gave an all-zero output
    with pytest.raises(ValueError, match=r"additive attn_mask contains \+inf"):
        pap(k, v, attn_mask=mask)
    # a mask with a larger batch than the keys broadcasts *with* them (to a larger output), not *to* them
    with pytest.raises(ValueError, match=r"attn_mask of shape \(2, 1, 5, 5\) does not broadcast to"):
        pap(k, v, attn_mask=torch.ones(2, 1, 5, 5, dtype=torch.bool))


def test_a_model_that_would_see_no_patch_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="img_size 2 is smaller than the patch size 4: the model would see"):
        timm.create_model("symvit_mini_patch4_28", img_size=2)
    # a size the patches do not tile: timm's patch embedding silently dropped the last rows and columns
    says = ("img_size 30 is not a multiple of the patch size 4: the last 2 pixel rows or columns would never "
            "be seen")
    with pytest.raises(ValueError, match=says + "; use 28 or 32"):
        timm.create_model("twicing_symvit_mini_patch4_28", img_size=30)
    padded = timm.create_model("symvit_mini_patch4_28", img_size=30, dynamic_img_pad=True,
                               dynamic_img_size=True)
    assert padded(torch.rand(2, 1, 30, 30)).shape == (2, 10)  # timm pads to 32: every pixel is seen


def test_train_configs_refuse_a_schedule_above_its_peak_and_name_timms_choices() -> None:
    from kpca_attention.train.config import get_preset

    with pytest.raises(ValueError, match="min_lr 0.5 is above lr 0.002"):
        get_preset("digits-cpu", min_lr=0.5)
    with pytest.raises(ValueError, match="warmup_lr 0.01 is above lr 0.002"):
        get_preset("digits-cpu", warmup_lr=0.01)
    with pytest.raises(ValueError, match=r"opt 'bogus' is not an optimizer of timm's registry; valid: "):
        get_preset("digits-cpu", opt="bogus")
    with pytest.raises(ValueError, match=r"sched.*cosine"):
        get_preset("digits-cpu", sched="bogus")
    assert get_preset("digits-cpu", opt="lookahead_adamw").opt == "lookahead_adamw"


@pytest.mark.parametrize(("kw", "says"), [({"attn_kwargs": [1]}, "attn_kwargs must be a dict"),
                                          ({"attn_kwargs": {"applied": False}}, "may not set 'applied'")])
def test_family_models_check_their_attn_kwargs(kw, says) -> None:
    with pytest.raises(ValueError, match=says):
        timm.create_model("neutreno_vit_mini_patch4_28", **kw)
    with pytest.raises(ValueError, match=says):
        create_lm("neutreno_lm", 100, preset="small", **kw)


@pytest.mark.parametrize(("kw", "says"), [({"vocab_size": "10"}, "vocab_size must be an integer"),
                                          ({"vocab_size": 10.5}, "vocab_size must be an integer"),
                                          ({"vocab_size": 10, "n_layer": 2.5}, "n_layer must be an integer")])
def test_lm_sizes_must_be_integers(kw, says) -> None:
    with pytest.raises(ValueError, match=says):
        create_lm("lm", preset="small", **kw)


def test_a_run_folder_without_a_checkpoint_is_not_called_a_hugging_face_folder(tmp_path) -> None:
    from kpca_attention.train.hf import is_hf_folder

    run = tmp_path / "crashed"  # training stopped before its first checkpoint
    run.mkdir()
    (run / "config.json").write_text("{}")
    assert is_hf_folder(run)  # a config.json alone may be either
    (run / ".lock").write_text("")
    assert not is_hf_folder(run)


def test_settings_given_twice_or_too_large_and_misspelt_cache_names_are_said(tmp_path) -> None:
    import warnings

    from kpca_attention.attention import run_with_cache
    from kpca_attention.train.config import apply_overrides, get_preset

    cfg = get_preset("digits-cpu")
    with pytest.raises(ValueError, match="seed set twice: give each key once"):
        apply_overrides(cfg, ["seed=1", "seed=2"])
    with pytest.raises(ValueError, match=r"train_subset 100000 is more than the training images of digits "
                                         r"less the 200 of its validation split \(1237\)"):
        get_task("vision").datasets(get_preset("digits-cpu", train_subset=100000))
    with pytest.raises(ValueError, match=r"eval_subset 300 is more than the images of the validation split"):
        get_task("vision").datasets(get_preset("digits-cpu", eval_subset=300))
    model = timm.create_model("rpc_symvit_mini_patch4_28", num_classes=3, depth=1).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, cache = run_with_cache(model, torch.rand(1, 1, 28, 28),
                                  names_filter=["blocks.0.attn.hook_mu", "blocks.0.attn.hook_muu"])
    assert list(cache) == ["blocks.0.attn.hook_mu"]
    assert any("['blocks.0.attn.hook_muu'] name no hook point" in str(w.message) for w in caught)


def test_a_pickled_training_state_is_refused_without_torchs_advice_to_unpickle(tmp_path, monkeypatch) -> None:
    import argparse

    from run_fixtures import untrained_run

    from kpca_attention.train import CheckpointError
    from kpca_attention.train import checkpoint as ckpt_mod

    run = untrained_run(tmp_path / "r")
    torch.save({"progress": argparse.Namespace(epoch=0)}, ckpt_mod.resolve_checkpoint(run) / "state.pt")
    monkeypatch.setattr(ckpt_mod, "verify_checkpoint", lambda c: {})  # as if its hash had been rewritten
    with pytest.raises(CheckpointError, match="refused, never unpickled") as e:
        ckpt_mod.load_checkpoint(run)
    assert "weights_only" not in str(e.value)  # torch's advice to unpickle it, for a file it just refused


@pytest.mark.parametrize("name", sorted(mechanisms()))
def test_every_layer_names_attn_mask_when_it_cannot_use_it(name) -> None:
    """Wrong-shaped or integer masks were raw SDPA RuntimeErrors (or an expand / finfo error) that never
    named attn_mask; a (B, N) key-padding mask is for RPC alone."""
    mech = get_mechanism(name)
    cls = mech.layer_class("vision", not mech.asymmetric_ok)
    opts = {"num_tokens": 5} if "num_tokens" in getattr(mech.cls, "parameter_constraints", {}) else {}
    layer = cls(16, num_heads=2, **opts)
    x = torch.randn(2, 5, 16)
    with pytest.warns(UserWarning) if mech.stateful else contextlib.nullcontext():
        layer(x, attn_mask=torch.ones(5, 5, dtype=torch.bool))  # broadcasts: fine
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 4\) does not broadcast to \(B, H, N, N\)"):
        layer(x, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask must be bool"):
        layer(x, attn_mask=torch.zeros(5, 5, dtype=torch.long))
    padding = torch.ones(2, 5, dtype=torch.bool)
    if name == "rpc":
        layer(x, attn_mask=padding)
    else:
        with pytest.raises(ValueError, match=r"attn_mask of shape \(2, 5\) does not broadcast"):
            layer(x, attn_mask=padding)


def test_pap_names_its_argument_for_arrays_odd_masks_and_mu_shapes() -> None:
    from kpca_attention.pap import pap_mu

    k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    with pytest.raises(TypeError, match="pap: k, v \\(and q\\) must be torch Tensors, got ndarray"):
        pap(k.numpy(), v.numpy())
    with pytest.raises(ValueError, match=r"pap: mu of shape \(3,\) does not broadcast to \(B, H, N, 1\)"):
        pap(k, v, mu=torch.ones(3))
    with pytest.raises(ValueError, match=r"pap_mu: k must be a tensor of shape \(B, H, N, D\), got \(2, 5"):
        pap_mu(torch.randn(2, 5, 4))
    keep = torch.tensor([True, True, True, False, True])  # one mask row for every query (an IndexError)
    assert torch.equal(pap(k, v, attn_mask=keep), pap(k, v, attn_mask=keep.view(1, 1, 1, 5)))


def test_a_label_with_a_pipe_or_a_line_break_stays_one_table_cell() -> None:
    from kpca_attention.tables import markdown_table

    table = markdown_table([{"variant": "mine|v2", "note": "two\nlines", "kept": "max\\|K\\|"}],
                           {"variant": "variant | label", "note": "note", "kept": "kept"})
    header, _, row = table.splitlines()
    assert header == "| variant \\| label | note | kept |"
    assert row == "| mine\\|v2 | two lines | max\\|K\\| |"  # an escaped pipe is left as it is
    assert len(row.replace("\\|", "").split("|")) == 5
