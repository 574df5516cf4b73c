"""The mechanism registry: one entry per attention mechanism, so that one name gives every model.

Each mechanism module registers itself on import (``register_mechanism(...)`` at its end); importing
:mod:`kpca_attention.attention` imports them all, so the registry is complete once the package is
imported. The models read it: :mod:`kpca_attention.models.family` builds, for one registered name,
timm ViTs (``<name>_vit_*`` and, where symmetric attention is allowed, ``<name>_symvit_*``), causal
LMs (``<name>_lm`` / ``<name>_symlm``) and Segmenters.

>>> mech = get_mechanism("neutreno")
>>> layer_cls = mech.layer_class("vision", symmetric=False)      # the paper's vision defaults
>>> mech.options("lm")                                            # the LM defaults
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from torch import nn

from .replace import configure, resolve_blocks

__all__ = ["Mechanism", "register_mechanism", "get_mechanism", "mechanisms", "TASKS"]

#: the model kinds a mechanism may apply to
TASKS: tuple[str, ...] = ("vision", "lm", "segmentation")

#: a kind without its own defaults or layers takes those of this one (a Segmenter's encoder is a ViT)
_FALLBACK: dict[str, str] = {"segmentation": "vision"}

#: a layer spec: what :func:`~.replace.resolve_blocks` takes, or a function of the depth
LayerSpec = str | int | list[int] | tuple[int, ...] | Callable[[int], list[int]]


@dataclass(frozen=True)
class Mechanism:
    """One registered attention mechanism.

    Attributes:
        name: the registry key and the prefix of its model names (``neutreno`` -> ``neutreno_vit_...``).
        cls: the attention layer (a :class:`~.base.HeadsAttention` subclass taking timm's constructor).
        defaults: constructor options common to every task (the paper's defaults).
        task_defaults: per task (``"vision"``, ``"lm"``, ``"segmentation"``) options that override
            ``defaults`` (NeuTRENO's lambda is 0.6 for vision, 0.4 for the LM). Segmentation falls back
            to the vision entry when it has none.
        layers: per task, the blocks that apply the mechanism (a :func:`~.replace.resolve_blocks` spec
            or a function of the depth); a task without an entry applies it in every block.
        symmetric_ok / asymmetric_ok: whether the paper's mechanism exists with W_Q = W_K (SymViT) and
            with queries. When both hold the layer takes ``symmetric=``.
        applies_to: the model kinds it is registered for (subset of :data:`TASKS`).
        description: one line for docstrings and tables.
    """

    name: str
    cls: type[nn.Module]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    task_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    layers: Mapping[str, LayerSpec] = field(default_factory=dict)
    symmetric_ok: bool = True
    asymmetric_ok: bool = True
    applies_to: tuple[str, ...] = TASKS
    description: str = ""

    @property
    def stateful(self) -> bool:
        """Whether the layer carries state across layers (see :mod:`.stateful`)."""
        return bool(getattr(self.cls, "stateful", False))

    def options(self, task: str = "vision", **overrides: Any) -> dict[str, Any]:
        """The constructor options for ``task``: defaults, the task's defaults, then ``overrides``.

        An option the layer does not take is a TypeError naming the valid ones."""
        self._check_task(task)
        per_task = self.task_defaults.get(task, self.task_defaults.get(_FALLBACK.get(task, task)))
        opts = {**self.defaults, **(per_task or {}), **overrides}
        valid = self.option_names()
        bad = sorted(set(opts) - valid)
        if bad:
            raise TypeError(f"{self.name}: unknown option(s) {bad}; valid: {', '.join(sorted(valid))}")
        return opts

    def option_names(self) -> set[str]:
        """The mechanism's own constructor keywords (timm's arguments excluded)."""
        names: set[str] = set()
        for klass in self.cls.__mro__:  # a subclass passes its base's keyword-only options on
            if "__init__" in vars(klass):
                params = inspect.signature(vars(klass)["__init__"]).parameters
                names |= {n for n, p in params.items() if p.kind == p.KEYWORD_ONLY}
        return names - {"symmetric"}

    def applied_blocks(self, task: str, depth: int, spec: LayerSpec | None = None) -> list[int]:
        """The block indices that apply the mechanism: ``spec`` if given, else the task's default."""
        self._check_task(task)
        if spec is None:
            spec = self.layers.get(task, self.layers.get(_FALLBACK.get(task, task), "all"))
        if callable(spec):
            spec = spec(depth)
        return resolve_blocks(spec if isinstance(spec, (str, int)) else list(spec), depth)

    def check_symmetric(self, symmetric: bool) -> None:
        if symmetric and not self.symmetric_ok:
            raise ValueError(f"{self.name}: the mechanism has no symmetric (W_Q = W_K) form")
        if not symmetric and not self.asymmetric_ok:
            raise ValueError(f"{self.name}: the mechanism exists only in symmetric form (no queries)")

    def layer_class(self, task: str = "vision", symmetric: bool = False, **overrides: Any) -> type[nn.Module]:
        """``configure(cls, ...)``: the layer class with the task's defaults and ``overrides``."""
        self.check_symmetric(symmetric)
        opts = self.options(task, **overrides)
        if self.symmetric_ok and self.asymmetric_ok:
            opts["symmetric"] = symmetric
        return configure(self.cls, **opts)

    def _check_task(self, task: str) -> None:
        if task not in self.applies_to:
            raise ValueError(f"{self.name}: not registered for {task!r}; it applies to "
                             f"{', '.join(self.applies_to)}")


_REGISTRY: dict[str, Mechanism] = {}


def register_mechanism(
    name: str,
    cls: type[nn.Module],
    defaults: Mapping[str, Any] | None = None,
    symmetric_ok: bool = True,
    asymmetric_ok: bool = True,
    applies_to: tuple[str, ...] = TASKS,
    *,
    task_defaults: Mapping[str, Mapping[str, Any]] | None = None,
    layers: Mapping[str, LayerSpec] | None = None,
    description: str = "",
) -> Mechanism:
    """Register ``cls`` under ``name`` (see :class:`Mechanism` for the fields). Registering the same
    name twice with another class is a ValueError (re-registering the same class replaces the entry,
    so a module reload is harmless)."""
    if not name.isidentifier() or name != name.lower():
        raise ValueError(f"mechanism name {name!r} must be a lower-case identifier (it prefixes model names)")
    if not (symmetric_ok or asymmetric_ok):
        raise ValueError(f"{name}: symmetric_ok and asymmetric_ok cannot both be False")
    bad = [t for t in applies_to if t not in TASKS]
    if bad:
        raise ValueError(f"{name}: unknown task(s) {bad}; valid: {', '.join(TASKS)}")
    old = _REGISTRY.get(name)
    if old is not None and old.cls.__qualname__ != cls.__qualname__:
        raise ValueError(f"mechanism {name!r} is already registered with {old.cls.__name__}")
    mech = Mechanism(
        name, cls, MappingProxyType(dict(defaults or {})),
        MappingProxyType({k: MappingProxyType(dict(v)) for k, v in (task_defaults or {}).items()}),
        MappingProxyType(dict(layers or {})), symmetric_ok, asymmetric_ok, tuple(applies_to), description,
    )
    mech.options(applies_to[0])  # every default names an option of the layer
    for task in mech.task_defaults:
        mech.options(task)
    _REGISTRY[name] = mech
    return mech


def get_mechanism(name: str) -> Mechanism:
    """The registered mechanism ``name``; a KeyError lists the registered names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown attention mechanism {name!r}; registered: {', '.join(sorted(_REGISTRY))}") \
            from None


def mechanisms(task: str | None = None) -> list[str]:
    """The registered names (in registration order), those that apply to ``task`` if given."""
    return [n for n, m in _REGISTRY.items() if task is None or task in m.applies_to]
