"""A model's size before its weights exist: build it on PyTorch's ``meta`` device (shapes, no storage), so a
config that asks for gigabytes - a typo in ``img_size``, a downloaded run whose ``config.json`` does not match
its weights - is refused in one line before anything is allocated.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["meta_model", "parameter_count", "memory_bytes", "check_fits"]


def meta_model(build: Callable[[], nn.Module]) -> nn.Module | None:
    """``build()`` on the meta device: the model's parameters and buffers with their shapes and no storage.

    The global random state is left as it was. None when the model cannot be built there (an op in its
    constructor needs real values): the caller then builds it for real, which raises whatever a bad
    setting raises."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        try:
            return build()
        except Exception:  # any failure is re-raised, with its own message, by the real build
            return None


def parameter_count(model: nn.Module) -> int:
    """Number of distinct parameters (tied ones counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(model: nn.Module, name: str, *, bytes_per_parameter: int, what: str,
               available: int | None = None) -> None:
    """ValueError when ``model``'s parameters times ``bytes_per_parameter`` exceed ``available`` bytes
    (default: this machine's memory). ``what`` says what the bytes hold, for the message."""
    available = memory_bytes() if available is None else available
    n = parameter_count(model)
    need = n * bytes_per_parameter
    if available is not None and need > available:
        raise ValueError(
            f"{name} has {n:,} parameters: {what} need {need / 2**30:.1f} GiB and this machine has "
            f"{available / 2**30:.1f} GiB; check the model's size settings (model_kwargs, img_size)")
