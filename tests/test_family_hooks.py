"""The mechanisms' own named hook points (TransformerLens style, attention/hooks.py): Twicing's ``hook_av``,
NeuTRENO's and PIDformer's ``hook_error`` (and PIDformer's ``hook_integral``), Elliptical's ``hook_metric``.
Each cached value is recomputed from the cached q, k, v of the same forward pass (so a hook point that
named the wrong tensor, or one a later in-place update changed, fails), and a hook that returns a new
tensor changes the layer's output as the equation says."""

from __future__ import annotations

import warnings

import pytest
import timm
import torch
import torch.nn.functional as F

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import run_with_cache
from kpca_attention.attention.elliptical import elliptical_metric

pytestmark = pytest.mark.usefixtures("single_thread")


def _model(name: str, **kw) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = timm.create_model(name, depth=3, **kw).eval()
    return model, torch.rand(2, 1, 28, 28)


def _qkv(cache: dict, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(cache[f"blocks.{i}.attn.hook_{p}"] for p in "qkv")


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_twicing_hook_av_is_the_first_smoothing(grad: bool) -> None:
    model, x = _model("twicing_vit_mini_patch4_28")
    with torch.set_grad_enabled(grad):
        _, cache = run_with_cache(model, x)
    for i in range(3):
        q, k, v = _qkv(cache, i)
        av = F.scaled_dot_product_attention(q, k, v)
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_av"], av)
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_z"],
                                   av + F.scaled_dot_product_attention(q, k, v - av))


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_neutreno_hook_error_is_v0_minus_v(grad: bool) -> None:
    model, x = _model("neutreno_vit_mini_patch4_28")
    with torch.set_grad_enabled(grad):
        _, cache = run_with_cache(model, x)
    assert "blocks.0.attn.hook_error" not in cache  # the first layer is its own reference
    v0 = cache["blocks.0.attn.hook_v"]
    lam = model.blocks[1].attn.lam
    for i in (1, 2):
        q, k, v = _qkv(cache, i)
        err = cache[f"blocks.{i}.attn.hook_error"]
        torch.testing.assert_close(err, v0 - v)
        # read after the layer added lam * err to its output in place (no gradient): still the error
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_z"],
                                   F.scaled_dot_product_attention(q, k, v) + lam * err)


def test_pid_hook_error_and_integral() -> None:
    model, x = _model("pid_vit_mini_patch4_28")
    with torch.no_grad():
        _, cache = run_with_cache(model, x)
    v0 = cache["blocks.0.attn.hook_v"]
    total = torch.zeros_like(v0)
    for i in (1, 2):
        err = v0 - cache[f"blocks.{i}.attn.hook_v"]
        total = total + err
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_error"], err)
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_integral"], total)


def test_elliptical_hook_metric_is_the_metric_from_the_previous_values() -> None:
    model, x = _model("elliptical_vit_mini_patch4_28")
    with torch.no_grad():
        _, cache = run_with_cache(model, x)
    assert "blocks.0.attn.hook_metric" not in cache  # no previous values in the first layer
    attn = model.blocks[1].attn
    for i in (1, 2):
        q, k, v = _qkv(cache, i)
        m = elliptical_metric(q, None, v, cache[f"blocks.{i - 1}.attn.hook_v"], delta=attn.delta)
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_metric"], m)
        assert m.shape == (2, attn.num_heads, 1, attn.head_dim) and float(m.amax()) == pytest.approx(1.0)
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_z"],
                                   F.scaled_dot_product_attention(q * m, k, v))


def test_a_hook_that_zeroes_the_error_turns_neutreno_into_plain_attention() -> None:
    """Ablation through the hook point: NeuTRENO with its fidelity error replaced by zeros computes what
    the same weights compute as plain attention (``applied=False`` in every layer)."""
    model, x = _model("neutreno_vit_mini_patch4_28")
    handles = [blk.attn.hook_error.register_forward_hook(lambda _m, _i, out: torch.zeros_like(out))
               for blk in model.blocks]
    with torch.no_grad():
        ablated = model(x)
    for h in handles:
        h.remove()
    with torch.no_grad():
        full = model(x)
        for blk in model.blocks:
            blk.attn.applied = False
        plain = model(x)
    torch.testing.assert_close(ablated, plain)
    assert not torch.allclose(full, plain)


def test_run_with_cache_says_when_it_has_nothing_to_read() -> None:
    """An empty cache from a model without this package's layers (timm's own ViT), or from a filter that
    matches no hook point, would pass for "nothing happened": each warns, naming why."""
    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=16, depth=1).eval()
    with pytest.warns(UserWarning, match="VisionTransformer has no hook points.*replace_attention"), \
            torch.no_grad():
        _, cache = run_with_cache(vit, torch.rand(1, 3, 32, 32))
    assert cache == {}
    model, x = _model("twicing_vit_mini_patch4_28")
    with pytest.warns(UserWarning, match=r"matched none of the model's \d+ hook points \(e\.g\. blocks\.0"), \
            torch.no_grad():
        run_with_cache(model, x, names_filter="blocks.0.attn.hook_mu")  # Twicing has no PAP
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")
        _, cache = run_with_cache(model, x, names_filter="blocks.0.attn.hook_av")
    assert list(cache) == ["blocks.0.attn.hook_av"]
