"""Named hook points (TransformerLens style) and :func:`run_with_cache`.

A :class:`HookPoint` is an identity module that names a tensor of a forward pass: the attention layers
route their per-head q, k, v through ``hook_q`` / ``hook_k`` / ``hook_v``, and the RPC layer PAP's inner
states through ``hook_mu``, ``hook_tau``, ``hook_L.t``, ``hook_W.t`` and ``hook_S_density.t``. Register
a forward hook on one to read it (or return a new tensor to change it); :func:`run_with_cache` reads
them all. A hook point without a hook costs nothing: the RPC layer only forms PAP's states when one of
its PAP hook points is :attr:`~HookPoint.active`.
"""

from __future__ import annotations

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
    """
    wanted = _wanted(names_filter)
    cache: dict[str, Tensor] = {}
    handles = []

    def store(name: str) -> Callable[[nn.Module, Any, Tensor], None]:
        def hook(_module: nn.Module, _inputs: Any, output: Tensor) -> None:
            cache[name] = output.detach()

        return hook

    try:
        for name, module in model.named_modules():
            if isinstance(module, HookPoint) and wanted(name):
                handles.append(module.register_forward_hook(store(name)))
        output = model(*inputs, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return output, cache
