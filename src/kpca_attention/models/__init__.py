"""The paper's models: vision transformers registered in timm, and causal language models.

Importing this package (done by ``import kpca_attention``) registers the vision models in timm, so
``timm.create_model("rpc_symvit_tiny_patch16_224", rpc_iters=6)`` works. :func:`create_model` is a thin
wrapper that also builds the language models and names the valid choices for an unknown name.
"""

from __future__ import annotations

from typing import Any

import timm
from torch import nn

from . import family, fan, lm, mechanisms, segmenter, vit
from .family import FAMILY_SEGMENTATION_MODELS, FAMILY_VISION_MODELS
from .fan import FAN_MODELS
from .lm import FAMILY_LM_MODELS, LM_MODELS, LM_PRESETS, CausalLM, LMConfig, create_lm, perplexity
from .normalize import IMAGENET_MEAN, IMAGENET_STD, NormalizedModel
from .segmenter import SEGMENTATION_MODELS, Segmenter
from .vit import RPC_DEFAULTS, VISION_MODELS

__all__ = [
    "list_models",
    "create_model",
    "NormalizedModel",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "RPC_DEFAULTS",
    "VISION_MODELS",
    "LM_MODELS",
    "LM_PRESETS",
    "LMConfig",
    "CausalLM",
    "create_lm",
    "perplexity",
    "lm",
    "vit",
    "segmenter",
    "Segmenter",
    "SEGMENTATION_MODELS",
    "family",
    "mechanisms",
    "fan",
    "FAMILY_VISION_MODELS",
    "FAMILY_SEGMENTATION_MODELS",
    "FAMILY_LM_MODELS",
    "FAN_MODELS",
]


def list_models(kind: str | None = None) -> list[str]:
    """This package's model names: ``kind="vision"`` (the ViTs registered in timm), ``"lm"``, ``"family"``
    (the robust-attention family's ViTs and LMs, :mod:`.family`), ``"fan"`` (FAN and RPC-FAN,
    :mod:`.fan`), ``"segmentation"`` (the Segmenters, also the family's), or None for all of them."""
    table = {"vision": list(VISION_MODELS), "lm": list(LM_MODELS),
             "family": [*FAMILY_VISION_MODELS, *FAMILY_LM_MODELS], "fan": list(FAN_MODELS),
             "segmentation": [*SEGMENTATION_MODELS, *FAMILY_SEGMENTATION_MODELS]}
    if kind is None:
        return [n for names in table.values() for n in names]
    if kind not in table:
        raise ValueError(f"unknown kind {kind!r}; valid: {', '.join(table)} or None")
    return table[kind]


def _layer_names(keyword: str) -> str:
    """``"; valid: ..."`` for timm's layer-name keywords (read from timm's own tables), else ``""``."""
    from timm.layers import create_act, create_norm

    table = {"act_layer": getattr(create_act, "_ACT_LAYER_DEFAULT", None),
             "norm_layer": getattr(create_norm, "_NORM_MAP", None)}.get(keyword)
    return f"; valid: {', '.join(sorted(table))}" if isinstance(table, dict) else ""


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """Build a model of this package by name (see :func:`list_models`); any other timm name also works.

    Vision models go through ``timm.create_model(name, **kwargs)``; language models through
    :func:`~kpca_attention.models.lm.create_lm` (``vocab_size=`` required, ``preset="paper" | "small"``
    and LMConfig fields as keywords).
    """
    if name in LM_MODELS or name in FAMILY_LM_MODELS:
        if "vocab_size" not in kwargs:
            raise TypeError(f"{name}: vocab_size= is required for a language model")
        try:
            return create_lm(name, **kwargs)
        except TypeError as e:  # a keyword this LM does not take (model_kwargs.X): one line, not a trace
            if not str(e).startswith((f"{name} does not use", "unknown LMConfig field")):
                raise
            raise ValueError(str(e)) from e
    if name in VISION_MODELS or name in FAMILY_VISION_MODELS or timm.is_model(name):
        try:
            return timm.create_model(name, **kwargs)
        except TypeError as e:  # a keyword the model does not take (model_kwargs.X): one line, not a trace
            if "unexpected keyword argument" not in str(e):
                raise
            raise ValueError(f"{name}: {e}; see the model's keyword arguments "
                             f"(timm.create_model({name!r}, ...))") from e
        except KeyError as e:  # a layer name timm does not know (model_kwargs.act_layer="gelu2")
            bad = [k for k, v in kwargs.items() if isinstance(v, str) and e.args and v == e.args[0]]
            if not bad:
                raise
            raise ValueError(f"{name}: {bad[0]}={kwargs[bad[0]]!r} is not a name timm knows"
                             f"{_layer_names(bad[0])}") from e
    raise ValueError(
        f"unknown model {name!r}; valid names of this package: {', '.join(list_models())} "
        "(any timm model name is accepted too)"
    )
