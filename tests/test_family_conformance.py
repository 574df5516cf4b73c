"""What every mechanism of the family's model table (``models/family.FAMILY_MECHANISMS``) must do as a model,
checked for each row without a line per mechanism: a new mechanism's module of names gets these checks for
free, and its own test file holds only its float64 transcription (docs/architecture.md, "Add an attention
mechanism"). Each ViT name has a complete pretrained config whose input the model takes; its blocks carry the
mechanism's layer where the registry applies it (symmetric exactly in the symmetric form) and plain attention
elsewhere; the mini model runs forward and backward with finite outputs and gradients for every parameter it
uses; the Segmenters' encoders carry the same layer; and every family LM leaks nothing from the future."""

from __future__ import annotations

import pytest
import timm
import torch
from family_checks import assert_no_leak_from_the_future, causal_lm

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import get_mechanism, run_with_cache
from kpca_attention.attention.registry import mechanisms
from kpca_attention.models import FAMILY_LM_MODELS, family

pytestmark = pytest.mark.usefixtures("single_thread")

FORMS = [(m, sym) for m, sym_too in family.FAMILY_MECHANISMS.items()
         for sym in ((False, True) if sym_too else (False,))]


def _form(sym: bool) -> str:
    return "symvit" if sym else "vit"


def spec_blocks(mech: str, depth: int) -> list[int]:
    return get_mechanism(mech).applied_blocks("vision", depth, None)


def _layer_name(layer: type) -> str:
    return layer.__name__.split("[", 1)[0]  # configure() names its subclass "Layer[options]"


@pytest.mark.parametrize("mech,sym", FORMS, ids=[f"{m}_{_form(s)}" for m, s in FORMS])
def test_every_size_has_its_config_and_the_mechanism_in_the_applied_blocks(mech: str, sym: bool) -> None:
    spec = get_mechanism(mech)
    layer = _layer_name(spec.layer_class("vision", sym))
    for size in family.FAMILY_SIZES:
        name = f"{mech}_{_form(sym)}_{size}"
        cfg = timm.models.get_pretrained_cfg(name).to_dict()
        assert {"input_size", "num_classes", "mean", "std", "architecture"} <= set(cfg), name
        model = timm.create_model(name, device="meta")
        assert model.default_cfg == model.pretrained_cfg and cfg["architecture"] == name
        assert model.in_chans == cfg["input_size"][0] and model.num_classes == cfg["num_classes"]
        assert model.patch_embed.img_size == tuple(cfg["input_size"][1:]), name
        applied = spec.applied_blocks("vision", len(model.blocks), None)
        assert model.attn_mechanism == mech and model.attn_blocks == applied, name
        for i, blk in enumerate(model.blocks):
            mine = _layer_name(type(blk.attn)) == layer and getattr(blk.attn, "applied", True)
            assert mine is (i in applied), (name, i)  # plain attention outside the applied blocks
            assert getattr(blk.attn, "symmetric", sym) is sym, (name, i)  # no W_Q in the symmetric form


@pytest.mark.parametrize("mech,sym", FORMS, ids=[f"{m}_{_form(s)}" for m, s in FORMS])
def test_the_mini_model_trains(mech: str, sym: bool) -> None:
    torch.manual_seed(0)
    model = timm.create_model(f"{mech}_{_form(sym)}_mini_patch4_28", depth=2)
    x = torch.randn(2, 1, 28, 28)
    out = model(x)
    assert out.shape == (2, model.num_classes) and torch.isfinite(out).all()
    out.logsumexp(-1).sum().backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not [n for n in unused if ".attn." in n], unused  # the mechanism's parameters take part
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(x))  # evaluation is deterministic
        _, cache = run_with_cache(model, x, names_filter=lambda n: n.endswith(("hook_k", "hook_z")))
    heads = model.blocks[0].attn.num_heads
    for i, blk in enumerate(model.blocks):  # every block's heads before the projection, named as in timm
        if hasattr(blk.attn, "hook_z"):
            z = cache[f"blocks.{i}.attn.hook_z"]
            assert z.shape == cache[f"blocks.{i}.attn.hook_k"].shape and z.shape[1] == heads
    assert sum(k.endswith("hook_z") for k in cache) >= len(spec_blocks(mech, len(model.blocks)))


@pytest.mark.parametrize("mech,sym", FORMS, ids=[f"{m}_{_form(s)}" for m, s in FORMS])
def test_the_segmenters_encoders_carry_the_mechanism(mech: str, sym: bool) -> None:
    layer = _layer_name(get_mechanism(mech).layer_class("vision", sym))
    seg_names = [n for n in family.family_names(mech)[1] if f"_{_form(sym)}_" in n]
    assert seg_names
    for name in seg_names:
        seg = timm.create_model(name, device="meta")
        layers = {_layer_name(type(b.attn)) for b in seg.encoder.blocks}
        assert layer in layers, (name, layers)


@pytest.mark.parametrize("name", sorted(FAMILY_LM_MODELS))
def test_every_family_lm_leaks_nothing_from_the_future(name: str) -> None:
    torch.manual_seed(0)
    lm = causal_lm(name, n_layer=2)
    assert_no_leak_from_the_future(lm, n=12, t=5)
    assert_no_leak_from_the_future(lm, n=12, t=5, shift=True)


@pytest.mark.filterwarnings("ignore:.*ran without the cross-layer state")
@pytest.mark.parametrize("mech", [m for m in mechanisms() if m != "rvt"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_mask_with_is_causal_applies_both_in_every_layer(mech: str, kind: str) -> None:
    """SDPA refuses the pair; seven of nine layers passed it on (a raw SDPA error), RPC and RKDE combined
    them. Every registered layer now attends as with the combined mask (RVT's needs a square patch grid:
    its masks are checked in its own tests)."""
    torch.manual_seed(0)
    layer = get_mechanism(mech).cls(16, num_heads=2).eval()
    x = torch.randn(2, 6, 16)
    keep = torch.ones(6, 6, dtype=torch.bool)
    keep[:, 4] = False  # no query sees key 4
    both = keep & torch.ones(6, 6, dtype=torch.bool).tril()
    if kind == "float":
        keep, both = (torch.zeros(6, 6).masked_fill(~m, float("-inf")) for m in (keep, both))
    with torch.no_grad():
        torch.testing.assert_close(layer(x, attn_mask=keep, is_causal=True), layer(x, attn_mask=both))


# ---- third mutation review (2026-11-30): each test fails on a mutant no earlier test caught
def test_layer_classes_default_to_the_documented_vision_options():
    """A layer built from its class alone (the public constructor) has the registry's vision options,
    which are the documented ones: NeuTRENO lam 0.6, Elliptical without gradient through m, RKDE with the
    paper's norm, RVT W_p starting at 0 (sigmoid 0.5), PID kp 0.6 / ki 0.1 / kd 0.1."""
    from kpca_attention.attention import get_mechanism

    documented = {
        "neutreno": {"lam": 0.6},
        "pid": {"kp": 0.6, "ki": 0.1, "kd": 0.1},
        "elliptical": {"delta": 5.0, "attenuation": 1e-3, "median": False, "differentiable": False},
        "rkde": {"loss": "huber", "a": 0.2, "n_iter": 1, "official_norm": False},
        "rvt": {"num_prefix_tokens": 1, "resize": "interpolate", "init": 0.0},
    }
    for name, want in documented.items():
        mech = get_mechanism(name)
        assert mech.options("vision") == want, name
        layer = mech.cls(8, 2, **({"num_tokens": 5} if name == "rvt" else {}))
        assert {k: getattr(layer, k) for k in want} == want, name
    assert get_mechanism("neutreno").options("lm") == {"lam": 0.4}
    assert get_mechanism("pid").options("lm")["kp"] == 0.4
