"""Named hook points (TransformerLens style) and :func:`run_with_cache`.

A :class:`HookPoint` is an identity module that names a tensor of a forward pass: the attention layers
route their per-head q, k, v through ``hook_q`` / ``hook_k`` / ``hook_v`` and the heads' outputs, before
they are merged and projected, through ``hook_z`` (all ``(B, H, N, D)``: heads before tokens, as the
layers compute them - TransformerLens's ``hook_z`` is ``(B, N, H, D)``), and the RPC layer PAP's inner
states through ``hook_mu``, ``hook_tau``, ``hook_L.t``, ``hook_W.t`` and ``hook_S_density.t``. The family's
layers name their own terms: Twicing ``hook_av`` (the first smoothing A V), NeuTRENO and PIDformer
``hook_error`` (V^0 - V^l), PIDformer ``hook_integral``, Elliptical ``hook_metric`` (the weights m), robust
KDE ``hook_r_keys`` / ``hook_r_joint``; a term a layer does not form (the first layer's error) is absent
from the cache. Register
a forward hook on one to read it (or return a new tensor to change it); :func:`run_with_cache` reads
them all. A hook point without a hook costs nothing: the RPC layer only forms PAP's states when one of
its PAP hook points is :attr:`~HookPoint.active`.

There is no ``hook_pattern``: the layers call fused attention (SDPA), which never forms the N x N
matrix, and for several mechanisms no single matrix maps V to the output (RPC's PAP iterations, Twicing's
2A - A^2, RKDE's re-weighting). For a softmax layer the pattern is
``softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5)`` from the cached ``hook_q`` and ``hook_k``
(plus the mask, if any).

Keys are module names: a run loaded with :func:`kpca_attention.train.load_model` is a
:class:`~kpca_attention.models.NormalizedModel` wrapping the timm model as ``.model``, so its keys start
with ``model.`` (``model.blocks.0.attn.hook_mu``); pass ``model.model`` for the bare names.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

from torch import Tensor, nn

__all__ = ["HookPoint", "run_with_cache"]


class HookPoint(nn.Module):
    """An identity module that names the tensor passing through it (no parameters, no state)."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    @property
    def active(self) -> bool:
        """Whether a forward (pre-)hook is registered on this hook point."""
        return bool(self._forward_hooks or self._forward_pre_hooks)


def _wanted(names_filter: str | Iterable[str] | Callable[[str], bool] | None) -> Callable[[str], bool]:
    if names_filter is None:
        return lambda _name: True
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    if callable(names_filter):
        return names_filter
    chosen = set(names_filter)
    return lambda name: name in chosen


def run_with_cache(
    model: nn.Module,
    *inputs: Any,
    names_filter: str | Iterable[str] | Callable[[str], bool] | None = None,
    **kwargs: Any,
) -> tuple[Any, dict[str, Tensor]]:
    """Run ``model(*inputs, **kwargs)`` and return ``(output, cache)``: the value of every hook point
    (detached), keyed by its module name, e.g. ``blocks.0.attn.hook_mu`` or ``blocks.0.attn.hook_L.3``.

    ``names_filter``: None (every hook point), one name, a collection of names, or a predicate on the
    name. Works on any model containing this package's layers. A hook point that ran more than once
    in the forward pass keeps its last value. The hooks are removed on return, also after an error.

    >>> out, cache = run_with_cache(model, images, names_filter=lambda n: n.endswith("hook_mu"))
    >>> cache["blocks.0.attn.hook_mu"].shape  # (B, H, 1, 1); "model.blocks.0..." for a load_model run
    """
    wanted = _wanted(names_filter)
    cache: dict[str, Tensor] = {}
    handles = []

    def store(name: str) -> Callable[[nn.Module, Any, Tensor], None]:
        def hook(_module: nn.Module, _inputs: Any, output: Tensor) -> None:
            cache[name] = output.detach()

        return hook

    try:
        points = [(name, m) for name, m in model.named_modules() if isinstance(m, HookPoint)]
        for name, module in points:
            if wanted(name):
                handles.append(module.register_forward_hook(store(name)))
        if isinstance(names_filter, (list, tuple, set, frozenset)) and handles:
            missing = sorted(set(names_filter) - {name for name, _ in points})
            if missing:  # a misspelt name would be missing from the cache with no word
                warnings.warn(f"run_with_cache: {missing} name no hook point of the model (e.g. "
                              f"{points[0][0]}); the cache holds the others", stacklevel=2)
        if not handles:  # an empty cache would pass for "nothing happened" instead of "nothing to read"
            warnings.warn(
                f"run_with_cache: names_filter matched none of the model's {len(points)} hook points (e.g. "
                f"{points[0][0]})" if points else
                f"run_with_cache: {type(model).__name__} has no hook points: they are in this package's "
                "attention layers (timm's own Attention has none; kpca_attention.replace_attention puts them "
                "in), so the cache is empty", stacklevel=2)
        output = model(*inputs, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return output, cache
