"""Attack protocols: where the budget is measured and whether images stay valid.

* ``pixel`` (the default, RobustBench's convention): the attack sees images in [0, 1], the model
  normalises inside (:class:`~kpca_attention.models.normalize.NormalizedModel`), ``eps`` is in pixel
  units and adversarial images are clamped to [0, 1].
* ``lab`` (the protocol of the papers of this line of work - RPC-Attention's official code, Elliptical,
  KDE/RKDE - which attack with cleverhans): FGSM and PGD on the *normalised* tensor
  ``z = (x - mean) / std``, ``eps`` in normalised units, no clamp to the valid range. As their attack
  script (Elliptical's ``engine.py``, the lab's shared one) calls it:
  ``fast_gradient_method(model, z, eps, inf)`` and ``projected_gradient_descent(model, z, eps, 0.15 * eps,
  20, inf)``, with no labels - cleverhans then attacks the model's *predicted* class on the clean input
  (to avoid label leaking) - and its defaults: PGD starts at a uniform random point of the eps-ball,
  each step adds ``eps_iter * sign(grad)`` of the cross-entropy and projects back onto the ball,
  ``clip_min`` / ``clip_max`` are None. In pixel units a lab budget is ``eps * std`` per channel
  (``1/255`` on ImageNet's std ~0.226 is ~0.23/255), and adversarial images may leave [0, 1].

This module implements ``lab`` (written here, not copied): the attack runs on the inner network of a
``NormalizedModel``; the result is mapped back to pixel space (``x_adv = z_adv * std + mean``) so that
callers evaluate ``model(x_adv)`` as for any other attack. Accuracy is always against the true labels.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .common import PGD_ALPHA

__all__ = ["PROTOCOLS", "LAB_METHODS", "check_protocol", "split_normalized", "lab_attack"]

#: the attack protocols (see the module docstring)
PROTOCOLS: tuple[str, ...] = ("pixel", "lab")
#: the methods the lab protocol has (the papers' FGSM and PGD)
LAB_METHODS: tuple[str, ...] = ("fgsm", "pgd")


def check_protocol(protocol: Any, method: str | None = None) -> str:
    """``protocol`` if it is one of :data:`PROTOCOLS` (and, for ``lab``, ``method`` one of
    :data:`LAB_METHODS`); else a one-line ValueError."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown attack protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    if protocol == "lab" and method is not None and method not in LAB_METHODS:
        raise ValueError(f"the lab protocol has {', '.join(LAB_METHODS)} (the papers' cleverhans attacks), "
                         f"not {method!r}; use protocol='pixel' for it")
    return protocol


def split_normalized(model: nn.Module) -> tuple[nn.Module, Tensor, Tensor]:
    """``(inner network, mean, std)`` of a model that normalises inside (``NormalizedModel`` or any
    module with ``.model`` and ``mean`` / ``std`` buffers of shape ``(1, C, 1, 1)``)."""
    inner = getattr(model, "model", None)
    mean, std = getattr(model, "mean", None), getattr(model, "std", None)
    if not isinstance(inner, nn.Module) or not isinstance(mean, Tensor) or not isinstance(std, Tensor):
        raise ValueError(f"the lab protocol attacks the normalised tensor, so it needs a model that "
                         f"normalises inside (NormalizedModel(net, mean, std)); got {type(model).__name__}")
    return inner, mean, std


def _predicted(net: nn.Module, z: Tensor) -> Tensor:
    with torch.no_grad():
        return net(z).argmax(1)


def _signed_step(net: nn.Module, z: Tensor, y: Tensor, size: float) -> Tensor:
    z = z.detach().requires_grad_(True)
    loss = F.cross_entropy(net(z), y)
    (grad,) = torch.autograd.grad(loss, z)
    return (z + size * grad.sign()).detach()


def lab_attack(model: nn.Module, images: Tensor, method: str, eps: float, *, steps: int = 20,
               alpha: float | None = None, random_start: bool = True) -> Tensor:
    """The lab protocol's FGSM / PGD (see the module docstring) on ``images`` in [0, 1].

    ``eps`` and ``alpha`` (default ``0.15 * eps``) are in normalised units. The caller seeds the RNG
    (PGD's random start) and sets eval mode. Returns pixel-space images ``z_adv * std + mean``: not
    clamped, so they may lie outside [0, 1]."""
    check_protocol("lab", method)
    net, mean, std = split_normalized(model)
    mean, std = mean.to(images), std.to(images)
    z = (images.detach() - mean) / std
    y = _predicted(net, z)  # cleverhans with y=None: the clean prediction, not the true label
    if method == "fgsm":
        adv = _signed_step(net, z, y, eps)
    else:
        step = PGD_ALPHA * eps if alpha is None else alpha
        eta = torch.empty_like(z).uniform_(-eps, eps) if random_start else torch.zeros_like(z)
        adv = z + eta
        for _ in range(steps):
            adv = _signed_step(net, adv, y, step)
            adv = z + (adv - z).clamp(-eps, eps)
    return (adv * std + mean).detach()
