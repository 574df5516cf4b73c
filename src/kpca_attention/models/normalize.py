"""Normalisation inside the model, so that every caller (training, corruptions, attacks) works
on images in [0, 1] and an attack's eps is in pixel units (the official code attacked normalised
tensors, so its eps was not)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class NormalizedModel(nn.Module):
    """``model((x - mean) / std)`` for ``x`` of shape ``(B, C, H, W)`` in [0, 1].

    The wrapped network is ``.model``; mean and std are buffers (saved with the weights).
    """

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        if len(mean) != len(std):
            raise ValueError(f"mean and std need one value per channel, got {len(mean)} and {len(std)}")
        if any(s <= 0 for s in std):
            raise ValueError(f"std must be > 0, got {tuple(std)}")
        self.model = model
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def normalize(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.mean.shape[1]:
            raise ValueError(
                f"expected images (B, {self.mean.shape[1]}, H, W) in [0, 1], got {tuple(x.shape)}"
            )
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(self.normalize(x))
