"""Adaptive attacks: the switch that differentiates what a layer computes without gradient (Elliptical's
metric), its effect on outputs (none) and gradients (complete), its restoration, and the attack option that
uses it."""

from __future__ import annotations

import pytest
import timm
import torch

import kpca_attention.models  # noqa: F401  (registers the models in timm)
from kpca_attention.attention import EllipticalAttention, adaptive_gradients, adaptive_layers
from kpca_attention.models.normalize import NormalizedModel
from kpca_attention.robustness import attacks as A

pytestmark = pytest.mark.usefixtures("single_thread")


def _model(name: str) -> NormalizedModel:
    torch.manual_seed(0)
    return NormalizedModel(timm.create_model(name, num_classes=10), (0.5,), (0.25,)).eval()


def _input_grad(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return x.grad


def test_the_switch_completes_gradients_and_changes_no_value() -> None:
    model = _model("elliptical_vit_mini_patch4_28")
    layers = [m for m in model.modules() if isinstance(m, EllipticalAttention)]
    assert layers and adaptive_layers(model) == [n for n, m in model.named_modules() if m in layers]
    x, y = torch.rand(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    with torch.no_grad():
        plain = model(x)
    g_plain = _input_grad(model, x, y)
    with adaptive_gradients(model) as names:
        assert names == adaptive_layers(model) and all(m.differentiable for m in layers)
        with torch.no_grad():
            assert torch.equal(model(x), plain)  # the same values
        g_adaptive = _input_grad(model, x, y)
    assert not any(m.differentiable for m in layers)  # restored
    assert not torch.allclose(g_adaptive, g_plain)  # the metric's gradient now reaches the input
    # the switch's gradient is the differentiable layer's: the same as a model built with it
    built = _model("elliptical_vit_mini_patch4_28")
    built.load_state_dict(model.state_dict())
    for m in built.modules():
        if isinstance(m, EllipticalAttention):
            m.differentiable = True
    torch.testing.assert_close(_input_grad(built, x, y), g_adaptive)


def test_the_switch_is_restored_after_an_error_and_is_a_no_op_elsewhere() -> None:
    model = _model("elliptical_vit_mini_patch4_28")
    with pytest.raises(RuntimeError, match="boom"), adaptive_gradients(model):
        raise RuntimeError("boom")
    assert not any(m.differentiable for m in model.modules() if isinstance(m, EllipticalAttention))
    with adaptive_gradients(model, enabled=False) as names:
        assert names == []
    sym = _model("symvit_mini_patch4_28")
    assert adaptive_layers(sym) == []
    with adaptive_gradients(sym) as names:
        assert names == []


def test_the_attack_option() -> None:
    model = _model("elliptical_vit_mini_patch4_28")
    x, y = torch.rand(6, 1, 28, 28), torch.arange(6)
    seen = []
    orig = EllipticalAttention.forward

    def spy(self, *a, **k):
        seen.append(self.differentiable)
        return orig(self, *a, **k)

    EllipticalAttention.forward = spy
    try:
        A.attack(model, x, y, "fgsm", 4 / 255)
        assert seen and not any(seen)
        seen.clear()
        adv = A.attack(model, x, y, "fgsm", 4 / 255, adaptive=True)
        assert seen and all(seen)
    finally:
        EllipticalAttention.forward = orig
    assert not any(m.differentiable for m in model.modules() if isinstance(m, EllipticalAttention))
    assert (adv - x).abs().max() <= 4 / 255 + 1e-6
    assert A.attack_settings("pgd", {"adaptive": True}).endswith("; adaptive (through every layer's "
                                                                 "gradient-free parts)")
    assert A.attack_settings("pgd") == "20 steps of 0.15 eps, random start"
    with pytest.raises(ValueError, match="unknown options for square: adaptive"):
        A.check_attack_options("square", 4 / 255, {"adaptive": True})
