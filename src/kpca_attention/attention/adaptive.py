"""Adaptive attacks: gradients through the parts of a layer that its forward computes without them.

A layer that computes part of its output without gradient - Elliptical attention's metric, as its official
code does - gives a white-box attack an incomplete gradient, and its robustness to that attack may be
overstated (Athalye et al. 2018, "Obfuscated Gradients Give a False Sense of Security"; Tramer et al. 2020,
"On Adaptive Attacks to Adversarial Example Defenses"). Such a layer names, in its class attribute
``adaptive_options``, the attribute values that put those parts into the graph without changing any output
value; :func:`adaptive_gradients` sets them on every layer of a model for the length of a ``with`` block (an
adaptive attack, ``adaptive=True`` of :func:`kpca_attention.robustness.attacks.attack`) and restores them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

__all__ = ["adaptive_gradients", "adaptive_layers"]


def _options(m: nn.Module) -> dict[str, Any]:
    return dict(getattr(type(m), "adaptive_options", None) or {})


def adaptive_layers(model: nn.Module) -> list[str]:
    """The names of ``model``'s layers that compute part of their output without gradient (the layers an
    adaptive attack changes); empty when an adaptive attack is the plain one."""
    return [name for name, m in model.named_modules() if _options(m)]


@contextmanager
def adaptive_gradients(model: nn.Module, enabled: bool = True) -> Iterator[list[str]]:
    """Within the block, every layer of ``model`` with ``adaptive_options`` has them set (outputs unchanged,
    gradients complete); each attribute is restored afterwards, also on an error. Yields the names of the
    layers changed (none when ``enabled`` is False)."""
    saved: list[tuple[nn.Module, str, Any]] = []
    names: list[str] = []
    try:
        if enabled:
            for name, m in model.named_modules():
                opts = _options(m)
                for attr, value in opts.items():
                    saved.append((m, attr, getattr(m, attr)))
                    setattr(m, attr, value)
                if opts:
                    names.append(name)
        yield names
    finally:
        for m, attr, old in reversed(saved):
            setattr(m, attr, old)
