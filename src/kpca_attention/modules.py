"""Helpers on ``nn.Module`` shared by every layer of the package (core): evaluation mode with each
submodule's own flag restored, parameter gradients left as they were, the device a model lives on and the
fingerprint of its weights."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["eval_mode", "kept_grads", "model_device", "tensor_bytes", "weights_sha256"]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put every submodule in eval mode and restore each one's own flag afterwards.

    ``model.train(was_training)`` is not enough: it would also switch submodules that the caller had
    deliberately left in eval mode (frozen BatchNorm, say), so the flags are saved one by one.
    """
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, flag in flags:
            m.training = flag


@contextlib.contextmanager
def kept_grads(model: nn.Module) -> Iterator[nn.Module]:
    """Leave the parameters' ``.grad`` as they were: an attack that calls ``loss.backward()`` (torchattacks'
    CW, AutoAttack's FAB) fills them, which would leak into a training step run after it."""
    saved = [(p, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
    try:
        yield model
    finally:
        for p, g in saved:
            p.grad = g


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def tensor_bytes(x: torch.Tensor) -> bytes:
    """The raw bytes of ``x`` (on the CPU, contiguous, any dtype - bfloat16 included, which numpy lacks): what
    the fingerprints of weights and of analysed inputs hash."""
    return x.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def weights_sha256(model: nn.Module) -> str:
    """SHA-256 of ``model``'s state dict: each entry's name and raw bytes, in name order (any dtype,
    bfloat16 included): the fingerprint of the weights a result was computed with."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(tensor_bytes(v))
    return h.hexdigest()
