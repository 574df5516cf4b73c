"""Process-group set-up for ``torchrun``: DistributedDataParallel with NCCL on GPUs, gloo on CPU.

Launched by ``torchrun --nproc_per_node N -m kpca_attention.cli train ...`` the environment holds
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; without them everything runs in one process.
Only rank 0 writes files (checkpoints, logs, reports).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..tasks.base import all_reduce_sum

__all__ = [
    "DistInfo", "init_distributed", "cleanup_distributed", "barrier", "all_reduce_sum", "gather_objects",
    "broadcast_buffers", "match_grad_layout",
]


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(name: str | torch.device, local_rank: int = 0) -> torch.device:
    """The torch device of a ``--device`` value: ``auto`` (CUDA when there is one), ``cpu``, ``cuda`` (this
    process's ``local_rank``) or ``cuda:N``; anything else, or CUDA without a GPU, is a ``ValueError``."""
    from .config import check_device

    if isinstance(name, torch.device):
        return name
    if isinstance(name, str) and re.fullmatch(r"cuda:\d+", name):
        if not torch.cuda.is_available() or int(name[5:]) >= torch.cuda.device_count():
            raise ValueError(f"device={name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return torch.device(name)
    check_device(name, "device")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but CUDA is not available; use device='cpu' or 'auto'")
    if name in ("cuda", "auto") and torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group when started by ``torchrun`` (idempotent); pick the device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend=backend)
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=dev)


def cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Rank 0's buffers (BatchNorm statistics, ...) on every rank, as DDP's forward broadcasts them - so the
    unwrapped model evaluates alike on every rank without a DDP forward, whose collective a rank with no
    evaluation batch would never join (a hang). Nothing when not distributed."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for b in model.buffers():
            dist.broadcast(b, src=0)


def match_grad_layout(model: torch.nn.Module) -> int:
    """Give each gradient of a parameter with a size-1 dimension its parameter's strides; returns how many
    parameters got the hook.

    Where a dimension has size 1 its stride says nothing about the memory order, and a convolution's
    backward writes another one than the parameter's (the 1-channel patch embedding: grad strides
    (16, 1, 4, 1), weight (16, 16, 4, 1)). Autograd accepts such a gradient as laid out like its parameter,
    DDP's reducer compares strides exactly and warns on every rank ("Grad strides do not match bucket view
    strides"); the hook re-strides the gradient (a copy of a small weight's gradient only where they
    differ), so the warning is left for real layout mismatches."""
    hooked = 0
    for p in model.parameters():
        if p.requires_grad and 1 in p.shape:
            def restride(g: torch.Tensor, p: torch.Tensor = p) -> torch.Tensor:
                return g if g.stride() == p.stride() else torch.empty_like(p).copy_(g)

            p.register_hook(restride)
            hooked += 1
    return hooked


def gather_objects(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` when not distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
