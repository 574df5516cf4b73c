"""Tasks: what differs between image classification, semantic segmentation and causal language modelling,
as one object per task (:class:`~kpca_attention.tasks.base.Task`). The training loop, the study engine,
the study report and the command line ask the task of a run (``get(cfg.task)``) for its data, model,
loss, held-out metrics, suites and report sections; nothing outside this package compares task names.

Registered tasks (their names are the values of ``TrainConfig.task``, as committed configs store them):

=================  ====================================================  =====================================
``vision``         image classification                                  :mod:`.classification`
``segmentation``   semantic segmentation                                 :mod:`.segmentation`
``lm``             causal language modelling                             :mod:`.language`
=================  ====================================================  =====================================

A new task is one module (a :class:`Task` subclass with its suites and :class:`StudySections`) and one
line in :data:`TASKS` (docs/architecture.md: "Add a task").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .base import Objective, Splits, StudySections, Task, has_pap_layers, seeded_sample, validation_split
from .classification import ImageClassification
from .language import CausalLanguageModelling
from .segmentation import SemanticSegmentation

__all__ = ["Task", "Splits", "Objective", "StudySections", "TASKS", "get", "names", "register",
           "for_settings", "of_model", "of_model_name", "validation_split", "seeded_sample", "has_pap_layers",
           "unused_settings", "unread_options"]

#: name -> task, in the order they are listed
TASKS: dict[str, Task] = {}


#: the class attributes a task must set (the rest have defaults in :class:`Task`)
REQUIRED_ATTRIBUTES = ("name", "title", "unit", "throughput_key", "held_out_metrics", "suites_type")


def register(task: Task) -> Task:
    """Add ``task`` under its :attr:`~Task.name` (an error when the name is taken, or when the task lacks
    one of :data:`REQUIRED_ATTRIBUTES`: it would fail only where the attribute is first read)."""
    missing = [a for a in REQUIRED_ATTRIBUTES if not hasattr(task, a)]
    if missing:
        raise ValueError(f"{type(task).__name__} does not set {', '.join(missing)} (class attributes every "
                         "task sets: tasks/base.py)")
    if task.name in TASKS:
        raise ValueError(f"a task named {task.name!r} is registered already ({TASKS[task.name]!r})")
    TASKS[task.name] = task
    return task


register(ImageClassification())
register(SemanticSegmentation())
register(CausalLanguageModelling())


def names() -> tuple[str, ...]:
    """The registered task names (valid values of ``TrainConfig.task``)."""
    return tuple(TASKS)


def get(name: str) -> Task:
    """The task ``name``; a ``ValueError`` naming the registered ones otherwise."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(TASKS)}") from None


def unread_options(task: Task, options: Mapping[str, Any]) -> list[str]:
    """The names in ``options`` (for :meth:`Task.evaluate_split`) that ``task`` does not read
    (:attr:`Task.evaluate_options`) and that are set to other than the default of the task that reads them
    (``--stride 4`` for an image classifier); every name no task reads."""
    defaults = {k: v for t in TASKS.values() for k, v in t.evaluate_options.items()}
    return [k for k, v in options.items()
            if k not in task.evaluate_options and (k not in defaults or v != defaults[k])]


def unused_settings(cfg: Any) -> list[str]:
    """``"field=value"`` for each field of the config ``cfg`` (a dataclass) that another registered task
    reads (:attr:`Task.config_fields`), ``cfg``'s own task does not, and that differs from its default
    (``--set context=64`` on an image classifier): what a fresh run refuses."""
    own = get(cfg.task).config_fields
    elsewhere = set().union(*(t.config_fields for t in TASKS.values())) - own
    out = []
    for f in dataclasses.fields(cfg):
        if f.name in elsewhere:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if getattr(cfg, f.name) != default:
                out.append(f"{f.name}={getattr(cfg, f.name)!r}")
    return out


def for_settings(settings: Mapping[str, Any]) -> Task:
    """The task of a study folder from its ``settings.json``: its ``task``, or - in folders written before
    the field existed - the task whose suites' ``kind`` it records (image suites recorded none)."""
    if settings.get("task") is not None:
        return get(settings["task"])
    kind = (settings.get("suites") or {}).get("kind")
    for task in TASKS.values():
        if getattr(task.suites_type, "kind", None) == kind:
            return task
    raise ValueError(f"settings of study {settings.get('name')!r} name no task and suites of unknown kind "
                     f"{kind!r}")


def of_model_name(name: str) -> Task | None:
    """The task a model name builds for (:meth:`Task.owns_name`): the task that claims it, else image
    classification for any other image model timm can build; None for a name no task knows."""
    fallback = TASKS[ImageClassification.name]
    for task in TASKS.values():
        if task is not fallback and task.owns_name(name):
            return task
    return fallback if fallback.owns_name(name) else None


def of_model(model: Any) -> Task:
    """The task a model was built for (a model knows its task): the task that claims it
    (:meth:`Task.owns`: a causal LM, a Segmenter), else image classification (any other image model, e.g.
    a timm classifier)."""
    for task in TASKS.values():
        if task.owns(model):
            return task
    return TASKS[ImageClassification.name]
